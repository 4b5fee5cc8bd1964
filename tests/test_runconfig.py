"""A run's configuration: the learning-rate schedules (steps, and cosine with a linear warm-up) and your
own net's keyword arguments, as the command line reads them and a run records them."""
import argparse
import math

import numpy as np
import pytest

from minibp import checkpoint, train
from minibp.runconfig import CosineSchedule, StepSchedule, model_args, parse_model_arg, parse_schedule
from test_train import base_args, make_dataset, read_metrics


def test_the_cosine_schedule_warms_up_linearly_then_follows_a_half_cosine():
    schedule = parse_schedule("cosine:0.1:warmup=200", iters=1000)
    assert schedule == CosineSchedule(peak=0.1, warmup=200, iters=1000)
    expected = {0: 0.1 / 200, 99: 0.1 * 100 / 200, 199: 0.1,      # (t + 1) / W of the peak: the first step moves
                200: 0.1, 400: 0.1 * (1 + math.cos(math.pi / 4)) / 2, 600: 0.05,
                999: 0.1 * (1 + math.cos(math.pi * 799 / 800)) / 2}
    for iteration, rate in expected.items():
        assert schedule.rate(iteration) == pytest.approx(rate, rel=1e-12), iteration
    rates = [schedule.rate(t) for t in range(1000)]
    assert all(a < b for a, b in zip(rates[:199], rates[1:200])) and all(a > b for a, b in zip(rates[200:], rates[201:]))
    plain = parse_schedule("cosine:0.1", iters=10)
    assert plain.rate(0) == 0.1 and plain.rate(5) == pytest.approx(0.05) and plain.warmup == 0


def test_a_diverged_run_is_advised_the_same_schedule_at_a_tenth_of_the_rate():
    assert parse_schedule("cosine:0.1:warmup=200", iters=1000).divided(10) == "cosine:0.01:warmup=200"
    assert parse_schedule("cosine:0.1", iters=1000).divided(10) == "cosine:0.01"
    steps = parse_schedule("0:0.05,400:0.1", iters=1000)
    assert steps == StepSchedule(((0, 0.05), (400, 0.1))) and steps.divided(10) == "0:0.005,400:0.01"
    assert [steps.rate(t) for t in (0, 399, 400, 999)] == [0.05, 0.05, 0.1, 0.1]


@pytest.mark.parametrize("text,match", [("cosine:fast", "cosine:PEAK"), ("cosine:0.1:warmup=ten", "cosine:PEAK"),
                                        ("cosine:0.1:cooldown=5", "cosine:PEAK"), ("cosine:-0.1", "non-negative"),
                                        ("cosine:0.1:warmup=100", "must end before the run does"),
                                        ("cosine", "ITER:LR"), ("0:0.1,5", "ITER:LR")])
def test_a_bad_schedule_names_the_syntax(text, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(text, iters=100)


def test_a_cosine_schedule_is_recorded_and_resumed_like_the_step_schedule(tmp_path):
    make_dataset(tmp_path / "data")
    text = "cosine:0.05:warmup=2"
    assert train.main(base_args(tmp_path, iters=3, log_every=1, val_every=3, lr_schedule=text)) == 0
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["lr_schedule"] == text
    # a resume that moves the end stretches the decay: the rate of iteration t is the schedule's over 6
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 0
    stretched = parse_schedule(text, iters=6)
    logged = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert [r["lr"] for r in logged] == [parse_schedule(text, iters=3).rate(t) for t in range(3)] + [
        stretched.rate(t) for t in range(3, 6)]
    assert np.isclose(logged[1]["lr"], 0.05) and logged[-1]["lr"] < logged[3]["lr"]


@pytest.mark.parametrize("text,pair", [("width=32", ("width", 32)), ("pool='max'", ("pool", "max")),
                                       ("widths=[16, 32]", ("widths", [16, 32])), ("dropout=None", ("dropout", None)),
                                       ("scale=-1.5e-3", ("scale", -1.5e-3)), ("deep=True", ("deep", True))])
def test_model_arguments_are_python_literals(text, pair):
    assert parse_model_arg(text) == pair


@pytest.mark.parametrize("text", ["width", "2w=3", "pool=max", "width=32 * 2", "=4"])
def test_a_model_argument_that_is_not_name_equals_literal_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_model_arg(text)


def test_model_arguments_are_recorded_as_json_would_give_them_back():
    assert model_args([("widths", (16, 32)), ("pool", "max")]) == {"widths": [16, 32], "pool": "max"}
    with pytest.raises(ValueError, match="width is given twice"):
        model_args([("width", 8), ("width", 16)])
    with pytest.raises(ValueError, match="cannot be recorded"):
        model_args({"channels": {8, 16}})
    with pytest.raises(ValueError, match="cannot be recorded"):
        model_args({"scale": float("nan")})
