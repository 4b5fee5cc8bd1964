"""What the trainer tells a person: console lines with the elapsed time and an ETA, loss and accuracy
averaged over the logging interval, the plan once, a wall-clock time in every metrics record, a --help
grouped with every default stated and examples that match the README, and one vocabulary for the store."""
import argparse
import re
import shlex
import time

import numpy as np
import pytest

from minibp import evaluate, train
from minibp.run import session
from minibp.run.options import build_parser
from runs import ROOT, base_args, read_metrics

LINE = re.compile(r"iter +\d+/\d+  (loss \d\.\d{4}  acc \d\.\d{3}( \(over \d+\))?  lr \S+  \d+ img/s|validation loss \d\.\d{4}  "
                  r"acc \d\.\d{4})  elapsed \d+:\d\d  eta (\d+:)?\d+:\d\d$")


def test_every_line_tells_time_and_a_train_line_averages_its_interval(tmp_path, data_dir, capsys):
    started = time.time()
    assert train.main(base_args(tmp_path, out="every", iters=6, log_every=1, val_every=6)) == 0
    assert train.main(base_args(tmp_path, out="third", iters=6, log_every=3, val_every=3)) == 0
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if line.startswith("iter ")]
    assert len(lines) == 6 + 1 + 2 + 2 and all(LINE.fullmatch(line) for line in lines), lines
    assert sum(line.startswith("plan of a step") for line in printed) == 2  # once a run
    every, third = ([r for r in read_metrics(tmp_path / run) if r["kind"] == "train"] for run in ("every", "third"))
    for record, interval in zip(third, (every[:3], every[3:])):  # the same steps, from the same seed
        assert record["averaged_over"] == 3
        assert record["loss"] == pytest.approx(np.mean([r["loss"] for r in interval]), rel=1e-12)
        assert record["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in interval]), rel=1e-12)
    records = read_metrics(tmp_path / "every") + read_metrics(tmp_path / "third")
    assert all(started <= r["time"] <= time.time() for r in records)


def test_the_clock_reads_hours_minutes_seconds_and_extrapolates_this_sessions_pace(monkeypatch):
    assert [session.clock_time(s) for s in (0, 59.4, 83, 3599.6, 3725.2)] == ["0:00", "0:59", "1:23", "1:00:00",
                                                                            "1:02:05"]
    now = [1000.0]
    monkeypatch.setattr(session.time, "monotonic", lambda: now[0])
    clock = session.Clock(first=100, last=400)  # a session resumed at iteration 100 of 400
    assert clock.now(100) == "elapsed 0:00  eta ?"
    now[0] += 50
    assert clock.now(150) == "elapsed 0:50  eta 4:10"  # 1 s an iteration, 250 to go


def test_help_is_grouped_and_every_option_states_its_default():
    parser = build_parser()
    titles = [group.title for group in parser._action_groups]
    for title in ("model and data", "activation store and step", "schedule", "run folder",
                  "several processes (mpirun)", "ImageNet (--data imagenet)"):
        assert title in titles
    for action in parser._actions:
        if action.dest != "help" and action.help != argparse.SUPPRESS:  # (an old spelling, kept out of --help)
            assert action.help and "default" in action.help, action.option_strings


def commands(text, program="python3 -m minibp.train"):
    """The command lines of `program` in text (continued lines joined, comments dropped)."""
    text = text.replace("\\\n", " ")
    return [" ".join(found.split()) for found in re.findall(re.escape(program) + r"[^\n#&`]*", text)]


def test_the_docstring_examples_parse_and_hold_the_readmes_main_command():
    examples = commands(train.__doc__)
    assert len(examples) >= 6
    for example in examples:
        build_parser().parse_args(shlex.split(example)[3:])  # an option the parser does not know exits
    readme = commands((ROOT / "README.md").read_text())
    main = [c for c in readme if "--data fashion-mnist --model resnet20 --bits 4" in c and "--out runs/fm-4bit" in c]
    assert main and all(command in examples for command in main)


def test_evaluate_names_the_store_in_trains_words(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2, bits="2", window="range")) == 0
    assert "bits 2 (range window)" in capsys.readouterr().out
    assert evaluate.main([str(tmp_path / "run")]) == 0
    said = capsys.readouterr().out
    best = tmp_path / "run" / "best.h5"
    assert said.startswith(f"{best} (the run's best validation, iteration 2): resnet11, bits 2 (range "
                           "window): test accuracy") and "mode" not in said


def test_the_rate_after_a_validation_counts_training_time_alone(tmp_path, data_dir, monkeypatch):
    # A validation between two log lines restarted the interval's clock but kept its images: the next line's
    # img/s came out 2 to 4 times too high. On a fake clock, a step takes 1 s and a validation 100 s.
    from minibp import step
    clock = [0.0]
    real_run, real_evaluate = step.TrainStep.run, session.evaluate

    def run(self, *args, **kwargs):
        clock[0] += 1.0
        return real_run(self, *args, **kwargs)

    def evaluate(*args, **kwargs):
        clock[0] += 100.0
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(step.TrainStep, "run", run)
    monkeypatch.setattr(session, "evaluate", evaluate)
    monkeypatch.setattr(session.time, "perf_counter", lambda: clock[0])
    assert train.main(base_args(tmp_path, iters=8, batch=16, log_every=4, val_every=3, checkpoint_every=8)) == 0
    rates = [r["images_per_s"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert rates == [16.0, 16.0]


def test_the_header_names_the_optimizer_the_schedule_and_the_clip(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, out="sgd", iters=1)) == 0
    assert train.main(base_args(tmp_path, out="adamw", iters=2, optimizer="adamw", clip_norm=2,
                                lr_schedule="cosine:0.001:warmup=1")) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("optimizer ")]
    assert lines == ["optimizer sgd (momentum 0.9, weight decay 0.0002); schedule 0:0.05 over 1 iterations; "
                     "gradient not clipped",
                     "optimizer adamw (betas 0.9, 0.999, weight decay 0.05); schedule cosine:0.001:warmup=1 over 2 "
                     "iterations; gradient clipped to norm 2"]


def test_the_clock_goes_on_from_the_runs_earlier_sessions_and_leaves_a_first_build_out_of_the_eta(monkeypatch):
    now, compiling = [1000.0], [7.0]
    monkeypatch.setattr(session.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(session.build, "compiling_seconds", lambda: compiling[0])
    clock = session.Clock(first=100, last=400, earlier=200.0)  # resumed at 100 after 200 s of training
    now[0] += 80
    compiling[0] += 30  # a kernel file built during this session: 30 of its 80 s
    assert clock.now(150) == "elapsed 4:40  eta 4:10"  # 280 s in all; (80 - 30) / 50 = 1 s an iteration
    assert clock.done(150) == " (100 earlier, 50 now) in 1:20 of 4:40"
    assert session.Clock(first=100, last=400).done(100) == " (100 earlier, 0 now) in 0:00"  # no clock kept
    assert session.Clock(first=0, last=400).done(0) == " in 0:00"


def test_a_resume_says_what_it_averages_and_how_much_of_the_run_it_ran(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=3, log_every=2, val_every=3, checkpoint_every=3,
                                patience=4)) == 0
    first = capsys.readouterr().out
    assert "; stops early after 4 validations without a better one (--patience)" in first
    assert re.search(r"^done: 3 iterations in \d+:\d\d;", first, re.M)
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    train_lines = [line for line in lines if line.startswith("iter ") and "  loss " in line]
    assert "(over 1)" in train_lines[0] and "(over" not in train_lines[1]  # iteration 4 of a 2-iteration interval
    done = next(line for line in lines if line.startswith("done:"))
    assert re.match(r"done: 6 iterations \(3 earlier, 3 now\) in \d+:\d\d of \d+:\d\d;", done), done
    from minibp.run import checkpoint
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").clock["seconds"] > 0
