"""Training on several processes under mpirun (minibp/dist.py): 2 ranks give one process's --sub-batches 2 run
bit for bit, checkpoints move between the two, and a rank that dies, stops answering or was started
with other options ends the job with a clear error instead of a hang."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("mpi4py", reason="the tests of several ranks need mpi4py and mpich: pip install -e '.[dist]'")

from hosts import ENV, errors, mpirun, rank_pid, same_state, train, without_timing  # noqa: E402
from minibp import integrity  # noqa: E402
from minibp.run import checkpoint
from runs import ROOT, base_args, make_dataset, read_metrics  # noqa: E402

pytestmark = pytest.mark.slow  # every test starts trainers, most under mpirun


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A data set and the reference: one process, batch 16 in 2 sub-batches of 8, 6 iterations (which
    also builds the kernels, so no rank waits for a compiler)."""
    tmp = tmp_path_factory.mktemp("dist")
    make_dataset(tmp / "data")
    result = train(options(tmp, "one", sub_batches=2))
    assert result.returncode == 0, result.stderr
    return tmp


def options(tmp, out, **overrides):
    overrides = dict(dict(batch=16, iters=6, log_every=1, val_every=3, checkpoint_every=3), **overrides)
    return base_args(tmp, out=out, **overrides)


def test_one_process_needs_no_mpi(work):
    """Outside a launcher (the environment names no ranks) training never imports mpi4py."""
    env = {k: v for k, v in ENV.items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE")}
    code = ("import sys; from minibp import train; assert train.main(sys.argv[1:]) == 0; "
            "assert 'mpi4py' not in sys.modules, 'mpi4py was imported'")
    result = subprocess.run([sys.executable, "-c", code] + options(work, "alone", iters=2), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_two_ranks_train_bit_for_bit_as_one_process_with_two_sub_batches(work):
    result = train(options(work, "two"), ranks=2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("done: 6 iterations") == 1  # rank 0 alone prints
    assert same_state(work / "one", work / "two")  # weights, momentum and every running statistic
    assert without_timing(read_metrics(work / "two")) == without_timing(read_metrics(work / "one"))
    assert sorted(p.name for p in (work / "two").iterdir()) == ["best.h5", "checkpoint.h5", "lock", "metrics.jsonl"]


def test_two_ranks_round_at_random_as_one_process_with_two_sub_batches(work):
    """Stochastic rounding: rank r's sub-batch draws as sub-batch r of one process (step.py numbers them)."""
    assert train(options(work, "one-stochastic", sub_batches=2, rounding="stochastic")).returncode == 0
    result = train(options(work, "two-stochastic", rounding="stochastic"), ranks=2)
    assert result.returncode == 0, result.stderr
    assert same_state(work / "one-stochastic", work / "two-stochastic")
    assert not same_state(work / "one", work / "one-stochastic")  # the draws reach the weights


def test_two_ranks_step_adamw_with_clipping_as_one_process_with_two_sub_batches(work):
    """The global norm is of the gradient summed over the ranks: every rank clips by the same factor."""
    opts = dict(optimizer="adamw", clip_norm=0.5, lr_schedule="0:0.002")
    assert train(options(work, "one-adamw", sub_batches=2, **opts)).returncode == 0
    result = train(options(work, "two-adamw", **opts), ranks=2)
    assert result.returncode == 0, result.stderr
    assert same_state(work / "one-adamw", work / "two-adamw")
    assert without_timing(read_metrics(work / "two-adamw")) == without_timing(read_metrics(work / "one-adamw"))


def test_a_checkpoint_resumes_on_the_other_number_of_ranks(work):
    assert train(options(work, "from-two", iters=3), ranks=2).returncode == 0
    assert train(["--out", str(work / "from-two"), "--resume", "--iters", "6", "--sub-batches", "2"]).returncode == 0
    assert train(options(work, "from-one", iters=3, sub_batches=2)).returncode == 0
    # as if killed between the iteration-3 checkpoint and its validation: the 2 ranks validate it first
    metrics = work / "from-one" / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines() if '"val"' not in line))
    assert train(["--out", str(work / "from-one"), "--resume", "--iters", "6"], ranks=2).returncode == 0
    for run in ("from-two", "from-one"):
        assert same_state(work / "one", work / run), run
        for kind, key in (("train", "loss"), ("val", "accuracy")):
            assert [(r["iter"], r[key]) for r in read_metrics(work / run) if r["kind"] == kind] == \
                [(r["iter"], r[key]) for r in read_metrics(work / "one") if r["kind"] == kind], (run, kind)
    # 2 ranks x 2 sub-batches is another run than 2 sub-batches in all
    refused = train(["--out", str(work / "from-one"), "--resume", "--iters", "7", "--sub-batches", "2"], ranks=2)
    assert refused.returncode == 2
    assert errors(refused) == [f"error: {work / 'from-one' / 'checkpoint.h5'} was trained with other options; a "
                               "resumed run keeps them: 2 ranks x --sub-batches 2 (the run has 2 sub-batches a step)"]


def test_ranks_started_with_other_options_are_refused_before_anything_is_written(work):
    command = [sys.executable, "-m", "minibp.train"]
    rank_0, rank_1 = options(work, "differ", batch=16), options(work, "differ", batch=32)
    result = subprocess.run([mpirun(), "-n", "1"] + command + rank_0 + [":", "-n", "1"] + command + rank_1,
                            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert errors(result) == ["error: rank 1 was started with other options than rank 0: --batch 32 (rank 0 has 16)"]
    assert not (work / "differ").exists()


def test_divergence_on_two_ranks_is_one_error_and_keeps_the_last_good_checkpoint(work):
    result = train(options(work, "diverged", iters=30, lr_schedule="0:0.05,5:1e30", checkpoint_every=2,
                           val_every=100), ranks=2)
    assert result.returncode == 1
    [line] = errors(result)
    saved = checkpoint.load(work / "diverged" / "checkpoint.h5")  # finite, or load would refuse it
    assert "training diverged at iteration" in line and f"(iteration {saved.iteration})" in line
    assert f"mpirun -n 2 python3 -m minibp.train --out {work / 'diverged'} --resume" in line


def start_long_run(work, out, *, tag, timeout):
    argv = options(work, out, iters=100000, checkpoint_every=2, val_every=100000) + ["--rank-timeout", str(timeout)]
    process = subprocess.Popen([mpirun(), "-n", "2", sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT,
                               env=dict(ENV, MINIBP_TEST_TAG=tag), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    metrics, deadline = work / out / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 5):
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[0]
    return process


@pytest.mark.parametrize("how", ["killed", "stopped", "interrupted"])
def test_a_rank_that_dies_or_stops_ends_the_job_and_the_checkpoint_resumes(work, how):
    """Killed: mpirun sees it and ends the job at once. Stopped (a hang): rank 0 gives up after
    --rank-timeout, says so in one line and aborts the job. Interrupted (Ctrl-C on mpirun): the ranks
    stop at the same iteration and save. Each time the checkpoint is whole and resumes."""
    tag, out, timeout = uuid.uuid4().hex, f"fault-{how}", 3
    process = start_long_run(work, out, tag=tag, timeout=timeout)
    victim = rank_pid(tag, 1)
    try:
        started = time.time()
        if how == "interrupted":
            process.send_signal(signal.SIGINT)
        else:
            os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        output = process.communicate(timeout=30)[0]
        took = time.time() - started
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    saved = checkpoint.load(work / out / "checkpoint.h5")  # whole (load checks every array)
    if how == "killed":
        assert process.returncode != 0 and took < 10 and "BAD TERMINATION" in output
    elif how == "stopped":
        assert process.returncode != 0 and took < timeout + 10  # (rank 0 may have been waiting already)
        assert f"error: rank 0 of 2 waited {timeout} s for the others at a " in output
    else:
        assert process.returncode == 130 and f"stopped at iteration {saved.iteration}: checkpoint saved" in output
    assert saved.iteration >= 4 and (saved.iteration % 2 == 0 or how == "interrupted")
    resumed = train(["--out", str(work / out), "--resume", "--iters", str(saved.iteration + 1)], ranks=2)
    assert resumed.returncode == 0, resumed.stderr
    assert not integrity.stale_temporaries(work / out / "checkpoint.h5")
    assert json.loads((work / out / "metrics.jsonl").read_text().splitlines()[-1])["iter"] == saved.iteration + 1


def test_two_ranks_solve_one_memory_budget_alike(work):
    """--memory under mpirun: rank 0 calibrates, every rank solves its record again and they agree; the checkpoint
    records the ranks the budget was solved for (each process holds its share of the batch)."""
    result = train(options(work, "two-memory", memory="auto"), ranks=2)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("stores: ") == 1 and result.stdout.count("memory: peak") == 1
    record = checkpoint.load(work / "two-memory" / "checkpoint.h5").memory
    assert record["ranks"] == 2 and record["sub_batches"] % 2 == 0
