"""Nothing lost, nothing silent: the trainer under divergence, kills, SIGTERM and a failing validation, and the
cheap checks that refuse a run before anything is allocated. (Damaged checkpoints: tests/run/test_checkpoint.py; two
trainers at once and damaged metrics: run/test_folder.py; options that do not fit a resumed run: run/test_config.py.)"""
import signal
import time

import h5py
import numpy as np
import pytest

from minibp import integrity, train
from minibp.run import checkpoint, session
from runs import base_args, make_dataset, one_line_error, read_metrics, start_trainer, wait_for_lines


# ----------------------------------------------------------------------------- data loss

@pytest.mark.parametrize("rate", ["1e6", "1e30"])
def test_divergence_keeps_the_last_good_checkpoint(tmp_path, data_dir, capsys, rate):
    """From iteration 5 on the rate explodes; the run must stop with the iteration-5 checkpoint intact."""
    argv = base_args(tmp_path, iters=30, lr_schedule=f"0:0.05,5:{rate}", checkpoint_every=5, log_every=1,
                     val_every=100)
    assert train.main(argv) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "diverged" in line and "--resume --lr-schedule 0:0.005,5:" in line
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")  # finite, or load would refuse it
    assert saved.iteration == 5 and "(iteration 5)" in line
    # the advice works: resumed with a rate that does not diverge, the run finishes
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--lr-schedule", "0:0.005",
                       "--iters", str(saved.iteration + 2)]) == 0


def params(path):
    return {k: v for k, v in checkpoint.load(path).state.items() if k.startswith("params/")}


def test_a_run_with_best_h5_and_no_checkpoint_resumes_from_it_and_loses_nothing(tmp_path, data_dir, capsys):
    # --resume on a folder with best.h5 but no checkpoint.h5 advised --overwrite, which deletes that best.h5
    assert train.main(base_args(tmp_path, out="straight", iters=8, val_every=2, checkpoint_every=100)) == 0
    assert train.main(base_args(tmp_path, iters=6, val_every=2, checkpoint_every=100)) == 0
    run = tmp_path / "run"
    (run / "checkpoint.h5").unlink()
    best = checkpoint.load(run / "best.h5")
    capsys.readouterr()
    assert train.main(["--out", str(run), "--resume", "--iters", "8"]) == 0
    out = capsys.readouterr()
    assert f"resumed from {run / 'best.h5'} at iteration {best.iteration}" in out.out and "--overwrite" not in out.err
    # as if nothing had been lost: the weights of a run that went straight to iteration 8
    assert all(np.array_equal(a, b) for a, b in zip(params(run / "checkpoint.h5").values(),
                                                    params(tmp_path / "straight" / "checkpoint.h5").values()))


def test_divergence_after_a_validation_never_advises_what_would_lose_best_h5(tmp_path, data_dir, capsys):
    # validated at iteration 2, diverged before any checkpoint: the advice was --overwrite, losing best.h5
    argv = base_args(tmp_path, iters=30, lr_schedule="0:0.05,3:1e30", checkpoint_every=100, val_every=2,
                     log_every=1)
    assert train.main(argv) == 1
    line = one_line_error(capsys.readouterr().err)
    run = tmp_path / "run"
    best = checkpoint.load(run / "best.h5").validation
    assert "--overwrite" not in line and "best.h5 (iteration 2" in line and "--resume --lr-schedule 0:0.005,3:" in line
    assert not (run / "checkpoint.h5").exists()
    # the advice works, and keeps the best weights until a better validation replaces them
    assert train.main(["--out", str(run), "--resume", "--lr-schedule", "0:0.005", "--iters", "3"]) == 0
    now = checkpoint.load(run / "best.h5").validation
    assert (now["accuracy"], -now["loss"]) >= (best["accuracy"], -best["loss"])
    assert checkpoint.load(run / "checkpoint.h5").iteration == 3


def test_divergence_after_a_best_newer_than_the_checkpoint_resumes_from_it(tmp_path, data_dir, capsys):
    # checkpoint at 3, best at 4, diverged after: resumed from iteration 3 at another rate, the run would have
    # written its own validation of iteration 4 over best.h5's
    argv = base_args(tmp_path, iters=30, lr_schedule="0:0.05,4:1e30", checkpoint_every=3, val_every=4, log_every=1)
    assert train.main(argv) == 1
    line = one_line_error(capsys.readouterr().err)
    run = tmp_path / "run"
    assert checkpoint.load(run / "checkpoint.h5").iteration == 3
    assert "best.h5 (iteration 4" in line and "--resume --lr-schedule 0:0.005,4:" in line and "--overwrite" not in line
    assert train.main(["--out", str(run), "--resume", "--lr-schedule", "0:0.005", "--iters", "6"]) == 0
    assert f"resumed from {run / 'best.h5'} at iteration 4" in capsys.readouterr().out


def damage_best(run):
    with h5py.File(run / "best.h5", "r+") as f:
        f["state/params"][next(iter(f["state/params"]))][...] *= 2  # its checksum no longer holds


@pytest.mark.parametrize("how", ["damaged", "foreign", "not a checkpoint"])
def test_a_resume_checks_best_h5_as_it_checks_the_checkpoint(tmp_path, data_dir, capsys, how):
    assert train.main(base_args(tmp_path, iters=4, val_every=2, checkpoint_every=2)) == 0
    run = tmp_path / "run"
    if how == "damaged":
        damage_best(run)
    elif how == "foreign":  # another run's, of another seed
        assert train.main(base_args(tmp_path, out="other", seed=1, iters=4, val_every=2, checkpoint_every=2)) == 0
        (run / "best.h5").write_bytes((tmp_path / "other" / "best.h5").read_bytes())
    else:
        (run / "best.h5").write_bytes(b"not HDF5")
    before = (run / "best.h5").read_bytes()
    capsys.readouterr()
    assert train.main(["--out", str(run), "--resume", "--iters", "6"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{run / 'best.h5'}" in line and "move it out of" in line
    assert (run / "best.h5").read_bytes() == before and checkpoint.load(run / "checkpoint.h5").iteration == 4


def test_checkpointing_every_iteration_through_divergence_leaves_a_finite_checkpoint(tmp_path, data_dir, capsys):
    argv = base_args(tmp_path, iters=30, lr_schedule="0:0.05,5:1e6", checkpoint_every=1, log_every=1, val_every=100)
    assert train.main(argv) == 1
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")  # load refuses NaN or Inf
    assert f"(iteration {saved.iteration})" in one_line_error(capsys.readouterr().err)


def test_the_final_checkpoint_is_saved_before_the_final_validation(tmp_path, data_dir, monkeypatch, capsys):
    def broken(*_args, **_kwargs):
        raise ValueError("the validation failed")
    monkeypatch.setattr(session, "evaluate", broken)
    assert train.main(base_args(tmp_path, iters=4, val_every=100, checkpoint_every=100)) == 2
    assert "the validation failed" in one_line_error(capsys.readouterr().err)
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration == 4


@pytest.mark.parametrize("iters", [4, 6], ids=["same-iters", "more-iters"])
def test_a_validation_cut_off_after_its_checkpoint_runs_on_resume(tmp_path, data_dir, monkeypatch, iters):
    """Killed between the iteration-4 checkpoint and its validation: the resumed run validates iteration 4
    first, also when --iters moves the end (4 was a validation point only as the old last iteration)."""
    real = session.evaluate
    monkeypatch.setattr(session, "evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    # (a second Ctrl-C quits at once, as a kill would: nothing more is written)
    assert train.main(base_args(tmp_path, iters=4, val_every=100, checkpoint_every=100)) == 130
    run = tmp_path / "run"
    assert checkpoint.load(run / "checkpoint.h5").iteration == 4
    assert not [r for r in read_metrics(run) if r["kind"] == "val"]
    monkeypatch.setattr(session, "evaluate", real)
    assert train.main(["--out", str(run), "--resume", "--iters", str(iters)]) == 0
    assert [r["iter"] for r in read_metrics(run) if r["kind"] == "val"] == sorted({4, iters})
    assert train.main(["--out", str(run), "--resume"]) == 0  # a finished run validates nothing twice
    assert [r["iter"] for r in read_metrics(run) if r["kind"] == "val"] == sorted({4, iters})


@pytest.mark.slow
def test_kill_loop_loses_nothing_and_repeats_no_iteration(tmp_path, data_dir):
    """SIGKILL a run at random moments, restart it each time as a user would (resume if a checkpoint
    exists, else start again), and end with the weights of an uninterrupted run."""
    iters = 10
    common = dict(iters=iters, log_every=1, val_every=5, checkpoint_every=1)
    assert train.main(base_args(tmp_path, out="straight", **common)) == 0
    run = tmp_path / "run"
    rng = np.random.default_rng(1)
    for _ in range(4):
        resume = (run / "checkpoint.h5").exists()
        argv = ["--out", str(run), "--resume"] if resume else base_args(tmp_path, **common) + ["--overwrite"]
        process = start_trainer(argv)
        wait_for_lines(run / "metrics.jsonl", 1)  # the kernels are loaded and training is under way
        time.sleep(rng.uniform(0.0, 0.6))
        process.kill()
        process.wait()
    resume = (run / "checkpoint.h5").exists()
    argv = ["--out", str(run), "--resume"] if resume else base_args(tmp_path, **common) + ["--overwrite"]
    assert train.main(argv) == 0
    a, b = (checkpoint.load(tmp_path / name / "checkpoint.h5") for name in ("straight", "run"))
    assert a.iteration == b.iteration == iters
    assert all(np.array_equal(a.state[name], b.state[name]) for name in a.state)
    records = read_metrics(run)
    train_iters = [r["iter"] for r in records if r["kind"] == "train"]
    assert train_iters == list(range(1, iters + 1))
    assert [r["accuracy"] for r in records if r["kind"] == "val"] == [
        r["accuracy"] for r in read_metrics(tmp_path / "straight") if r["kind"] == "val"]
    assert not integrity.stale_temporaries(run / "checkpoint.h5")


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_like_ctrl_c(tmp_path, data_dir):
    process = start_trainer(base_args(tmp_path, iters=100000, log_every=1, val_every=100000, checkpoint_every=1))
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 2)
    process.send_signal(signal.SIGTERM)  # a scheduler's stop: saves like Ctrl-C
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 143 and "Traceback" not in output, output  # SIGTERM's own status (130: Ctrl-C's)
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration >= 2


# ----------------------------------------------------------------------------- cheap checks first

def test_a_broken_test_split_is_found_before_training(tmp_path, capsys):
    path = make_dataset(tmp_path / "data")
    with h5py.File(path, "r+") as f:
        labels = f["test/labels"][...]
        labels[0] = 99
        f["test/labels"][...] = labels
    assert train.main(base_args(tmp_path, iters=4)) == 2
    assert "test" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_batch_larger_than_the_data_is_refused_before_allocating(tmp_path, data_dir, capsys):
    started = time.time()
    assert train.main(base_args(tmp_path, model="resnet1001", batch=100000)) == 2
    assert "between 1 and the split's 256 images" in one_line_error(capsys.readouterr().err)
    assert time.time() - started < 30
