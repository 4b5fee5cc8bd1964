"""The worker processes (workers.py) that decode the ImageNet reader's JPEGs: they stop with the reader however it
ends (closed, exit, an error, Ctrl-C, SIGKILL), and one that dies is an error, not a hang. (The trainer
interrupted: tests/io/test_imagenet.py::test_ctrl_c_saves_and_leaves_no_worker_running.)"""
import os
import signal
import subprocess
import sys
import time

import pytest

from minibp.io import imagenet
from runs import ROOT, running, wait_gone

READER_SCRIPT = """
import signal, sys, time
# Ctrl-C raises KeyboardInterrupt, as in a terminal, even where this test runs with SIGINT ignored (a
# background job of a shell without job control inherits it ignored, and Python keeps it so)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {root!r})
from minibp.io import imagenet
train_split, _ = imagenet.load_folders(sys.argv[1])
batches = imagenet.Batches(train_split, batch=4, size=32, workers=2)
batches.next()
print(*[p.pid for p in batches.pool.processes], flush=True)
sys.stdin.readline()  # the test has seen them running
if sys.argv[2] == "close":
    batches.close()
    print("closed", flush=True)
elif sys.argv[2] == "exit":
    sys.exit(0)
elif sys.argv[2] == "error":
    raise RuntimeError("a failure in the trainer")
time.sleep(60)  # for the signal the test sends
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["close", "exit", "error", "ctrl-c", "sigkill"])
def test_workers_stop_with_the_reader_however_it_ends(tree, how):
    process = subprocess.Popen([sys.executable, "-c", READER_SCRIPT.format(root=str(ROOT)), str(tree), how],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)
    try:
        workers = [int(p) for p in process.stdout.readline().split()]
        assert len(workers) == 2 and all(running(p) for p in workers)
        process.stdin.write("go\n")
        process.stdin.flush()
        if how == "close":
            assert process.stdout.readline() == "closed\n" and wait_gone(workers)
            assert process.poll() is None  # the reader stopped its workers; the program goes on
        elif how == "ctrl-c":  # as a terminal does: to the whole foreground group (again each second, as a
            deadline = time.time() + 60  # user would: in a loaded full CI run one was seen to go unanswered)
            while process.poll() is None and time.time() < deadline:
                os.killpg(process.pid, signal.SIGINT)
                time.sleep(1)
        elif how == "sigkill":
            process.kill()  # no handler runs: the workers see their input end
        process.wait(timeout=60) if how != "close" else None
        assert wait_gone(workers), f"workers left running after {how}"
    finally:
        process.kill()
        process.wait()


def test_a_dead_worker_is_an_error(tree):
    train_split, _ = imagenet.load_folders(tree)
    with imagenet.Batches(train_split, batch=4, size=32, workers=2) as batches:
        batches.next()
        batches.pool.processes[1].kill()
        with pytest.raises(ChildProcessError, match=r"image-decoding worker \(pid \d+\) stopped, exit code -9"):
            for _ in range(6):  # (what it wrote before it died is still read)
                batches.next()
