"""The training script end to end on a tiny data set: learning, metrics, checkpoints, resume, Ctrl-C."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from minibp import evaluate, train
from minibp.run import checkpoint, session
from runs import ROOT, base_args, one_line_error, read_metrics, untimed


@pytest.mark.slow
def test_training_lowers_the_loss_and_writes_metrics(tmp_path, data_dir, capsys):
    # the rate drops for the last 20 iterations, as a schedule's does: at 0.05 this small net's validation
    # swings between chance and 0.9 from one iteration to the next (in exact training too)
    assert train.main(base_args(tmp_path, iters=80, log_every=10, val_every=40, lr_schedule="0:0.05,60:0.005")) == 0
    records = read_metrics(tmp_path / "run")
    train_records = [r for r in records if r["kind"] == "train"]
    val_records = [r for r in records if r["kind"] == "val"]
    assert [r["iter"] for r in train_records] == list(range(10, 81, 10))
    assert [r["iter"] for r in val_records] == [40, 80]
    assert set(train_records[0]) >= {"loss", "accuracy", "lr", "images_per_s", "planned_bytes", "time"}
    assert train_records[-1]["loss"] < train_records[0]["loss"] * 0.8
    assert val_records[-1]["accuracy"] > 0.45  # 4 classes: chance is 0.25
    printed = capsys.readouterr().out
    assert "iter 80/80  validation loss" in printed and printed.count("plan of a step") == 1
    # the evaluation command reads the checkpoint and agrees with the last validation
    assert evaluate.main([str(tmp_path / "run"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration"] == 80 and abs(result["accuracy"] - val_records[-1]["accuracy"]) < 1e-9


def test_every_store_trains_and_changes_only_what_it_should(tmp_path, data_dir):
    """From the same seed the first loss is exact training's in every mode but naive (which feeds
    approximations forward); the approximate backward of 8 and 2 bits then moves the weights
    differently from exact."""
    losses = {}
    for bits in ("exact", "8", "2", "naive"):
        assert train.main(base_args(tmp_path, out=bits, bits=bits, iters=3, log_every=1, val_every=3)) == 0
        records = read_metrics(tmp_path / bits)
        losses[bits] = [r["loss"] for r in records if r["kind"] == "train"]
        assert len(losses[bits]) == 3 and all(np.isfinite(losses[bits]))
        assert checkpoint.load(tmp_path / bits / "checkpoint.h5").config["bits"] == bits
    assert losses["8"][0] == losses["2"][0] == losses["exact"][0] != losses["naive"][0]
    assert losses["8"][2] != losses["exact"][2] and losses["2"][2] != losses["8"][2]


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_resume_gives_bit_identical_weights(tmp_path, data_dir, rounding):
    """Stochastic rounding too: its draws come from the seed, the iteration and the sub-batch (step.py)."""
    assert train.main(base_args(tmp_path, out="straight", iters=6, rounding=rounding)) == 0
    assert train.main(base_args(tmp_path, out="resumed", iters=3, rounding=rounding)) == 0
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--iters", "6"]) == 0
    a, b = checkpoint.load(tmp_path / "straight" / "checkpoint.h5"), checkpoint.load(tmp_path / "resumed" /
                                                                                      "checkpoint.h5")
    assert a.iteration == b.iteration == 6
    assert a.state.keys() == b.state.keys()
    assert all(np.array_equal(a.state[name], b.state[name]) for name in a.state)
    assert [untimed(r) for r in read_metrics(tmp_path / "straight") if r["kind"] == "val"] == [
        untimed(r) for r in read_metrics(tmp_path / "resumed") if r["kind"] == "val"]


@pytest.mark.slow
def test_split_computes_a_batch_in_smaller_sub_batches(tmp_path, data_dir):
    common = dict(batch=16, iters=30, log_every=10, val_every=30, lr_schedule="0:0.05")
    assert train.main(base_args(tmp_path, out="whole", **common)) == 0
    assert train.main(base_args(tmp_path, out="split", sub_batches=2, **common)) == 0
    whole, split = ([r for r in read_metrics(tmp_path / run) if r["kind"] == "train"] for run in ("whole", "split"))
    assert split[0]["planned_bytes"] < 0.7 * whole[0]["planned_bytes"]  # the arena is planned for 8, not 16
    # the accumulated gradients train (the loss, averaged over 10 iterations at this rate, moves too little)
    assert split[-1]["accuracy"] > split[0]["accuracy"] + 0.1


@pytest.mark.slow
def test_ctrl_c_leaves_a_checkpoint_that_resumes(tmp_path, data_dir):
    argv = base_args(tmp_path, iters=100000, log_every=1, val_every=100000, checkpoint_every=100000)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    metrics = tmp_path / "run" / "metrics.jsonl"
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    assert "--resume" in output
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")
    assert saved.iteration >= 2
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", str(saved.iteration + 1)]) == 0
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration == saved.iteration + 1


@pytest.mark.parametrize("overrides,match", [
    (dict(batch=10, sub_batches=3), "multiple of --sub-batches"),
    (dict(model="resnet12"), "unknown model"),
    (dict(lr_schedule="1:0.1"), "start at iteration 0"),
    (dict(lr_schedule="fast"), "ITER:LR"),
    (dict(data="cifar100"), "minibp.prepare cifar100"),
    (dict(iters=0), "--iters"),
])
def test_bad_flags_and_missing_files_are_clear_errors(tmp_path, data_dir, capsys, overrides, match):
    assert train.main(base_args(tmp_path, **overrides)) == 2
    assert match in capsys.readouterr().err


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path, capsys):
    assert train.main(base_args(tmp_path, data="fashion-mnist", data_dir=str(tmp_path / "nothing"))) == 2
    err = capsys.readouterr().err
    assert "apt-get install dataset-fashion-mnist" in err and "minibp.prepare fashion-mnist" in err


def test_resume_and_overwrite_are_guarded(tmp_path, data_dir, capsys):
    assert train.main(["--out", str(tmp_path / "nothing"), "--resume"]) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert train.main(base_args(tmp_path, iters=3, val_every=3)) == 0
    assert train.main(base_args(tmp_path, iters=3, val_every=3)) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_unknown_flag_exits_with_usage(tmp_path):
    with pytest.raises(SystemExit):
        train.main(["--bits", "3"])


def test_a_validation_whose_loss_is_not_finite_is_logged_and_training_goes_on(tmp_path, capsys):
    # On 2x2 images the running statistics can make the validation's loss overflow while the training steps
    # stay finite: that was a FloatingPointError traceback, met again by every resume.
    from runs import make_dataset
    make_dataset(tmp_path / "data", shape=(2, 2, 3))
    argv = base_args(tmp_path, iters=8, lr_schedule="0:0.2", val_every=2, checkpoint_every=2, bits="exact")
    assert train.main(argv) in (0, 1)  # 1: the training itself diverged later, a one-line error of its own
    out = capsys.readouterr().out
    failed = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "val" and r["loss"] is None]
    assert "Traceback" not in out
    if failed:  # (where the arithmetic overflows: a CPU's own summation order decides the iteration)
        assert "validation failed: the loss over the" in out and failed[0]["accuracy"] is None


def test_a_failed_validation_is_recorded_once_and_a_resume_does_not_redo_it(tmp_path, data_dir, capsys,
                                                                            monkeypatch):
    real = session.evaluate
    calls = []

    def evaluate(net, split, mean, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise FloatingPointError(f"the loss over the {split.name} split is inf")
        return real(net, split, mean, **kwargs)

    monkeypatch.setattr(session, "evaluate", evaluate)
    assert train.main(base_args(tmp_path, iters=4, val_every=2, checkpoint_every=4)) == 0
    assert "iter 4/4  validation failed: the loss over the" in capsys.readouterr().out
    vals = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "val"]
    assert [(r["iter"], r["loss"] is None) for r in vals] == [(2, False), (4, True)]
    assert "inf" in vals[1]["error"]
    assert train.main(["--out", str(tmp_path / "run"), "--resume"]) == 0
    assert len(calls) == 2  # the resume found iteration 4 validated (failed, but done)


def test_a_resume_on_data_of_other_classes_blames_the_data(tmp_path, data_dir, capsys):
    from runs import make_dataset
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    other = make_dataset(tmp_path / "other", classes=5)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4", "--data-dir", str(other.parent)]) == 2
    err = capsys.readouterr().err
    assert f"the data differ from the run's: {other} holds 8x8x3 images (H x W x C) of 5 classes" in err


def test_adamw_with_clipping_resumes_bit_identically_and_logs_the_norm(tmp_path, data_dir, capsys):
    opts = dict(optimizer="adamw", clip_norm=0.5, lr_schedule="0:0.002")
    assert train.main(base_args(tmp_path, out="straight", iters=6, **opts)) == 0
    assert train.main(base_args(tmp_path, out="resumed", iters=3, **opts)) == 0
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--iters", "6"]) == 0
    a, b = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("straight", "resumed"))
    assert a.config["optimizer"] == "adamw" and a.config["clip_norm"] == 0.5 and a.config["weight_decay"] == 0.05
    assert any(name.startswith("second_moment/") for name in a.state) and a.state.keys() == b.state.keys()
    assert all(np.array_equal(a.state[name], b.state[name]) for name in a.state)
    norms = [r["grad_norm"] for r in read_metrics(tmp_path / "straight") if r["kind"] == "train"]
    assert len(norms) == 3 and all(n > 0 for n in norms)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--optimizer", "sgd"]) == 2
    assert "--optimizer sgd (the run has adamw)" in capsys.readouterr().err
    assert train.main(base_args(tmp_path, out="bad", clip_norm=0)) == 2
    assert "--clip-norm must be a finite positive number, got 0.0" in capsys.readouterr().err


def test_patience_stops_a_run_that_stopped_improving_and_a_resume_keeps_it(tmp_path, data_dir, capsys, monkeypatch):
    """--patience N: after N validations in a row without a better one the run saves and stops early (exit 0);
    the patience is recorded, a resume keeps it (and stops at once), and a larger one trains on."""
    accuracies = iter([0.5, 0.4, 0.5, 0.3, 0.6, 0.2, 0.2, 0.2, 0.2, 0.2])  # one a validation, in order
    monkeypatch.setattr(session, "evaluate", lambda *args, **kwargs: (1.0, next(accuracies)))
    assert train.main(base_args(tmp_path, iters=20, val_every=1, checkpoint_every=5, patience=2)) == 0
    out = capsys.readouterr().out
    assert "stopped early at iteration 3: 2 validations in a row without a better one than iteration 1's " \
           "(--patience 2); to train on: python3 -m minibp.train --out" in out and "--resume --patience 4" in out
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")
    assert (saved.iteration, saved.config["patience"]) == (3, 2)
    assert checkpoint.load(tmp_path / "run" / "best.h5").iteration == 1
    assert train.main(["--out", str(tmp_path / "run"), "--resume"]) == 0  # kept: nothing more to train
    assert "stopped early at iteration 3" in capsys.readouterr().out
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration == 3
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--patience", "4"]) == 0
    assert "stopped early at iteration 9: 4 validations in a row without a better one than iteration 5's" in \
        capsys.readouterr().out
    vals = [r["iter"] for r in read_metrics(tmp_path / "run") if r["kind"] == "val"]
    assert vals == list(range(1, 10))  # each once
    resume = [r["changed"] for r in read_metrics(tmp_path / "run") if r["kind"] == "resume"]
    assert resume == [dict(patience=[2, 4])]


def test_a_smaller_patience_that_stops_a_run_at_once_is_recorded_and_its_advice_trains_on(tmp_path, data_dir, capsys,
                                                                                         monkeypatch):
    """A resume with a smaller --patience stops at once: the checkpoint records that patience (the metrics did, the
    checkpoint did not), and the advised --patience gives the run patience validations more, not a stop at once."""
    accuracies = iter([0.5, 0.4, 0.3, 0.2, 0.1])
    monkeypatch.setattr(session, "evaluate", lambda *args, **kwargs: (1.0, next(accuracies)))
    assert train.main(base_args(tmp_path, iters=20, val_every=1, checkpoint_every=5, patience=3)) == 0
    assert "stopped early at iteration 4" in capsys.readouterr().out
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--patience", "1"]) == 0
    out = capsys.readouterr().out
    assert "stopped early at iteration 4: 3 validations" in out and "--resume --patience 4" in out  # 3 spent + 1
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["patience"] == 1
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--patience", "4"]) == 0
    assert "stopped early at iteration 5: 4 validations in a row without a better one than iteration 1's" in \
        capsys.readouterr().out  # one validation more: the resumed patience's 1


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_patience_that_is_not_a_positive_count_is_refused_in_one_line(tmp_path, data_dir, capsys, value):
    assert train.main(base_args(tmp_path, patience=value)) == 2
    assert one_line_error(capsys.readouterr().err) == f"error: --patience must be a positive integer, got {value}"
    assert not (tmp_path / "run").exists()


def test_ranks_are_compared_on_their_options_as_they_resolve_them():
    # a rank started without --rounding was named as "--rounding None", though it runs nearest
    from minibp import dist
    from minibp.run.options import read_command_line

    def agreed(argv):
        invocation, given = read_command_line(argv)
        return train.as_agreed(invocation, given)

    class TwoRanks:  # what each rank would send: dist.Group.agree compares them
        def __init__(self, argvs):
            self.sent = [dict(agreed(argv), device="cpu") for argv in argvs]

        def gather_objects(self, _mine):
            return self.sent

    for argvs, differ in (
            ([["--rounding", "stochastic"], []], "--rounding nearest (rank 0 has stochastic)"),
            ([[], ["--data", "imagenet", "--batch", "256"]], "--data imagenet (rank 0 has cifar10)"),
            ([["--out", "r", "--resume", "--bits", "2"], ["--out", "r", "--resume"]],
             "--bits (the run's) (rank 0 has 2)")):
        with pytest.raises(ValueError, match="rank 1 was started with other options than rank 0: (.*; )?" +
                           re.escape(differ)) as error:
            dist.Group.agree(TwoRanks(argvs), {})
        assert "--rounding None" not in str(error.value)
    sent = TwoRanks([["--data", "imagenet"], ["--data", "imagenet", "--batch", "256"]]).sent
    assert sent[0] == sent[1]  # the same run, one rank naming ImageNet's default batch
