"""minibp/cli.py: the printing commands end quietly, with SIGPIPE's status, when their reader stops reading
(`python3 -m minibp.evaluate RUN | head`); every command ends on Ctrl-C and SIGTERM in one line, 130 and 143, from
its first moment (its imports) to its last write, which it leaves as it was."""
import os
import signal
import subprocess
import sys
import time

import pytest

from minibp import cli, train
from runs import ROOT, base_args, make_folder


def commands(tmp_path, data_dir):
    """{command: argv} of each printing command, on a 2-iteration run and its data file."""
    run, data_file = str(tmp_path / "run"), str(data_dir / "cifar10.h5")
    return {"plan": ["minibp.plan", "--model", "resnet20", "--units"],
            "evaluate": ["minibp.evaluate", run, "--per-class"],
            "predict": ["minibp.predict", run, data_file],
            "export": ["minibp.export", run, "--format", "safetensors"]}


@pytest.mark.slow
def test_a_command_stops_quietly_when_its_reader_does(tmp_path, data_dir):
    """The pipe closes before the first line is printed: status 141 and nothing on stderr (it was a
    BrokenPipeError traceback from evaluate, predict and export), as a program killed by SIGPIPE ends."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    for name, argv in commands(tmp_path, data_dir).items():
        done = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        done.stdout.close()  # the reader has gone before the first line
        err = done.stderr.read().decode()
        assert (name, done.wait(), err) == (name, 128 + signal.SIGPIPE, "")


def test_ctrl_c_is_one_line_and_130(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert cli.run(interrupted) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "stopped: no file is left half written\n"


def test_sigterm_is_one_line_and_143(capsys):
    def terminated():
        raise cli.Terminated

    assert cli.run(terminated) == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "stopped by SIGTERM: no file is left half written\n"


def start(argv, *, env=None):
    """python3 -m argv, with Ctrl-C's default action (a test run in the background has it ignored, and a child
    would inherit that)."""
    return subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def stopped(process, number, ready, name):
    """Wait until the process touches `ready`, send it the signal; (exit status, stderr)."""
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), f"{name} never got there: {process.communicate()}"
        process.send_signal(number)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, err


def all_commands(tmp_path, data_dir):
    """{command: argv} of every command, each writing a file where it writes one (into tmp_path/out)."""
    run, data_file, out = tmp_path / "run", data_dir / "cifar10.h5", tmp_path / "out"
    return {"train": ["minibp.train", "--out", str(tmp_path / "run2"), "--data-file", str(data_file), "--iters", "2"],
            "evaluate": ["minibp.evaluate", str(run), "--confusion", str(out / "confusion.csv")],
            "predict": ["minibp.predict", str(run), str(data_file), "--out", str(out / "predictions.csv")],
            "export": ["minibp.export", str(run), "--format", "safetensors", "--out", str(out)],
            "plot": ["minibp.plot", str(run), "--out", str(out / "curves.png")],
            "plan": ["minibp.plan", "--model", "resnet20"],
            "prepare": ["minibp.prepare", "folder", str(tmp_path / "images"), "--out", str(out / "images.h5")]}


@pytest.fixture
def inputs(tmp_path, data_dir):
    """A 2-iteration run, a folder of images to prepare and the folder the commands write into; the commands."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    make_folder(tmp_path / "images", splits=(("train", 4), ("test", 2)))
    (tmp_path / "out").mkdir()
    return all_commands(tmp_path, data_dir)


@pytest.mark.slow
@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_a_command_imports_its_libraries_is_one_line(tmp_path, inputs, number):
    # Ctrl-C in the first half second of train, evaluate, predict, export or plot (while NumPy, h5py and CuPy
    # import) was a KeyboardInterrupt traceback and exit -2; SIGTERM killed them without a word
    ready, slow = tmp_path / "ready", tmp_path / "slow" / "numpy"
    slow.mkdir(parents=True)  # a NumPy that takes its time to import, until the test's signal
    (slow / "__init__.py").write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path / 'slow'}:{ROOT}")
    for name, argv in inputs.items():
        ready.unlink(missing_ok=True)
        status, err = stopped(start(argv, env=env), number, ready, name)
        said = "interrupted" if number == signal.SIGINT else "SIGTERM"
        assert (name, status, err) == (name, 128 + number, f"{said} while python3 -m {argv[0]} started: nothing "
                                                           "was written\n")
    assert os.listdir(tmp_path / "out") == []


@pytest.mark.slow
def test_ctrl_c_a_moment_after_a_command_starts_is_one_line_and_130(tmp_path, data_dir):
    # The form of the finding: SIGINT 0.2 to 0.4 s after the start (mid-import, whatever is importing then)
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    for name, argv in all_commands(tmp_path, data_dir).items():
        if name in ("evaluate", "train", "plot"):
            for delay in (0.2, 0.3, 0.4):
                process = start(argv)
                time.sleep(delay)
                process.send_signal(signal.SIGINT)
                _, err = process.communicate(timeout=60)
                assert process.returncode in (0, 130) and "Traceback" not in err, (name, delay, err)
                assert process.returncode == 0 or len(err.strip().splitlines()) == 1, (name, delay, err)


# Installed by sitecustomize in the commands' processes: the file's first fsync (its temporary file written,
# not yet published) says so in `ready` and waits for the test's signal
HOLD_AT_FSYNC = """
import os, pathlib, time
_fsync, _ready = os.fsync, pathlib.Path(os.environ["MINIBP_TEST_READY"])
def fsync(fd):
    if os.environ.get("MINIBP_TEST_HOLD") and not _ready.exists():
        _ready.touch()
        time.sleep(60)
    return _fsync(fd)
os.fsync = fsync
"""


@pytest.mark.slow
def test_sigterm_mid_write_is_one_line_and_143_and_leaves_nothing_half_written(tmp_path, inputs):
    ready, hooks = tmp_path / "ready", tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOLD_AT_FSYNC)
    env = dict(os.environ, PYTHONPATH=f"{hooks}:{ROOT}", MINIBP_TEST_READY=str(ready), MINIBP_TEST_HOLD="1")
    for name in ("evaluate", "predict", "export", "plot", "prepare"):
        ready.unlink(missing_ok=True)
        status, err = stopped(start(inputs[name], env=env), signal.SIGTERM, ready, name)
        lines = [line for line in err.splitlines() if not line.startswith("minibp: compiling")]
        assert (name, status, len(lines)) == (name, 143, 1) and "Traceback" not in err, err
        assert os.listdir(tmp_path / "out") == [], (name, os.listdir(tmp_path / "out"))
