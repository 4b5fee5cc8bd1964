"""python3 -m minibp.lr_find: the rule that reads a rate off a range test (exact, on a synthetic curve), a short
real test on a data file of the test's own that leaves the disk and the net as they were, and the refusals."""
import math
import shlex

import numpy as np
import pytest

from minibp import cli, lr_find, plot
from minibp.io import data
from minibp.optim import SGD
from minibp.run.config import RunConfig
from minibp.run.options import read_command_line
from minibp.step import TrainStep
from nets import tiny_net
from runs import one_line_error


def synthetic(steps=101):
    """Rates from 1e-4 to 10, 20 steps a decade, and a smoothed loss against x = log10(rate) that falls as
    2 - tanh(2 (x + 2.025)), fastest at x = -2.025 (the middle of steps 39 and 40), until x = 0 (step 80), and
    climbs as x^2 after it: the minimum is at rate 1, the steepest descent at 10^-2.025."""
    rates = lr_find.rates(start=1e-4, end=10.0, steps=steps)
    x = np.log10(rates)
    fall = 2 - np.tanh(2 * (x + 2.025))
    return rates, list(np.where(x <= 1e-12, fall, fall[80] + x ** 2))


def test_the_rule_reads_a_third_of_the_minimum_and_the_steepest_descent_off_a_synthetic_curve():
    rates, smoothed = synthetic()
    s = lr_find.suggest(rates, smoothed)
    assert s.at == 80 and s.minimum == rates[80] == pytest.approx(1.0, rel=1e-12)
    assert s.peak == rates[80] / 3 and s.steepest == pytest.approx(10 ** -2.025, rel=1e-12)
    assert not s.still_falling
    assert s.schedule(iters=2000) == "cosine:0.33:warmup=100" and s.schedule(iters=10) == "cosine:0.33:warmup=1"
    # cut before the climb: the minimum is the last step, and the loss may fall further
    cut = lr_find.suggest(rates[:61], smoothed[:61])
    assert cut.at == 60 and cut.still_falling and cut.peak == rates[60] / 3
    # a loss that is not finite ends the curve read: the same as the cut
    assert lr_find.suggest(rates[:63], smoothed[:61] + [math.nan, 1.0]) == cut
    assert s.climbed is None and s.fell == pytest.approx(1 - smoothed[80] / smoothed[0], rel=1e-12) and not s.doubt()
    assert cut.climbed is None and cut.doubt() is None
    # a climb and then a deeper fall (a transient, at rates a run of their own diverges at) is said: the rate where
    # it first climbed 5% above the least so far; one within the average's first ten steps is not (they jump)
    bumped = smoothed[:84] + [smoothed[80] * 1.06] * 3 + [0.5] * 14
    doubtful = lr_find.suggest(rates, bumped)
    assert doubtful.at == 87 and doubtful.climbed == rates[84] and doubtful.peak == rates[87] / 3
    assert doubtful.doubt() == (f"the smoothed loss climbed 5% above its least at rate {rates[84]:.3g}, before its "
                                "minimum")
    # a loss that fell by less than a quarter: little learning seen
    shallow = lr_find.suggest(rates, [3.0] * 50 + [2.3] + [3.0] * 50)
    assert shallow.at == 50 and shallow.climbed is None
    assert shallow.doubt() == "the smoothed loss fell by 23% only, at its minimum"
    assert lr_find.suggest(rates, [smoothed[0], 1.2 * smoothed[0]] + smoothed[2:]) == s


def test_the_rule_refuses_a_curve_that_never_falls_or_ends_at_once():
    rates = lr_find.rates(start=1e-3, end=1.0, steps=20)
    with pytest.raises(ValueError, match="never fell below its first value .* lower --start"):
        lr_find.suggest(rates, list(np.linspace(2, 3, 20)))
    with pytest.raises(ValueError, match="finite for 2 steps only"):
        lr_find.suggest(rates, [2.0, 1.9] + [math.inf] * 18)
    with pytest.raises(ValueError, match="20 rates for 3 losses"):
        lr_find.suggest(rates, [2.0, 1.9, 1.8])


def test_the_smoothed_loss_is_a_bias_corrected_moving_average_and_stops_at_four_times_its_minimum():
    assert lr_find.smooth([1.0, 2.0, 3.0], beta=0.5) == pytest.approx([1.0, 5 / 3, 2.125 / 0.875], rel=1e-15)
    assert lr_find.smooth([2.0] * 5) == pytest.approx([2.0] * 5, rel=1e-15)  # no pull towards 0 at the start
    assert [math.isnan(v) for v in lr_find.smooth([1.0, math.nan, 1.0])] == [False, True, True]
    assert not lr_find.stops([3.0, 1.0, 3.9]) and lr_find.stops([3.0, 1.0, 4.1]) and lr_find.stops([1.0, math.nan])
    assert lr_find.rates(start=1e-3, end=1.0, steps=4) == pytest.approx([1e-3, 1e-2, 1e-1, 1.0], rel=1e-12)


class Stream:
    """Batches of random 8x8x3 images for tiny_net, with a position to save and restore (as Batches')."""

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def next(self):
        return self.rng.standard_normal((4, 8, 8, 3)).astype(np.float32), self.rng.integers(0, 3, 4)

    def state(self):
        return self.rng.bit_generator.state

    def restore(self, state):
        self.rng.bit_generator.state = state


def test_a_range_test_leaves_the_net_its_optimizer_and_the_batches_as_they_were():
    net = tiny_net()
    net.compile(pass_images=4, bits=4, seed=0)
    step, stream = TrainStep(net, SGD(net)), Stream()
    before, first = net.state(), stream.next()[0]
    stream.restore(np.random.default_rng(0).bit_generator.state)
    lines = []
    losses, smoothed = lr_find.range_test(step, stream, lr_find.rates(start=1e-3, end=1e3, steps=40), say=lines.append,
                                          every=10)
    assert 3 <= len(losses) == len(smoothed) and smoothed == lr_find.smooth(losses)
    assert len(losses) < 40 and lr_find.stops(smoothed)  # rates up to 1000 diverge
    assert lines[0].startswith("step 10/40  lr ") and "smoothed" in lines[0] and "elapsed" in lines[0]
    after = net.state()
    assert after.keys() == before.keys() and all(np.array_equal(after[k], before[k]) for k in before)
    assert np.array_equal(stream.next()[0], first)


def write_data(path, *, n=192, seed=0):
    """A learnable 4-class data file of 8x8 RGB images (a mean image a class, plus noise), with a val split."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(40, 216, (4, 8, 8, 3))

    def split(count):
        labels = rng.integers(0, 4, count)
        return np.clip(prototypes[labels] + rng.normal(0, 25, (count, 8, 8, 3)), 0, 255).astype(np.uint8), labels
    data.write(path, train=split(n), val=split(32), test=split(32), classes=4, name="blobs")
    return path


def listing(folder):
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_short_range_test_prints_its_table_and_ready_commands_and_writes_nothing_but_its_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    path = write_data(tmp_path / "blobs.h5")
    before = listing(tmp_path)
    argv = ["--data-file", str(path), "--model", "resnet11", "--batch", "16", "--steps", "30", "--iters", "400",
            "--plot", str(tmp_path / "lr.png")]
    assert lr_find.main(argv) == 0
    out = capsys.readouterr().out
    assert listing(tmp_path) == sorted(before + [x for x in listing(tmp_path) if x[0] == "lr.png"])
    assert (tmp_path / "lr.png").read_bytes()[:4] == b"\x89PNG" and out.endswith(f"wrote {tmp_path / 'lr.png'}\n")
    assert out.count("range test of ") == 2 and out.count("<- minimum") == 2 and "step 30/30" in out
    commands = [line.strip() for line in out.splitlines() if line.startswith("    python3 -m minibp.train")]
    assert len(commands) == 2
    for command, optimizer in zip(commands, ("sgd", "adamw")):
        words = shlex.split(command)[3:]
        invocation, given = read_command_line(words)  # ready to paste: the trainer reads it, and the run is valid
        config = RunConfig.new(given)
        assert (config.optimizer, config.iters, config.batch, config.model) == (optimizer, 400, 16, "resnet11")
        assert config.lr_schedule.startswith("cosine:") and config.lr_schedule.endswith(":warmup=20")
    # the plot is never written over without --overwrite, and a missing matplotlib is one line
    again = (tmp_path / "lr.png").read_bytes()
    assert lr_find.main(argv) == 2
    assert "--plot" in one_line_error(capsys.readouterr().err) and (tmp_path / "lr.png").read_bytes() == again


def test_without_matplotlib_the_table_is_printed_and_one_line_says_how_to_draw_it(tmp_path, capsys, monkeypatch):
    path = write_data(tmp_path / "blobs.h5")
    monkeypatch.setattr(lr_find, "have_matplotlib", lambda: False)
    assert lr_find.main(["--data-file", str(path), "--model", "resnet11", "--batch", "16", "--steps", "10",
                         "--optimizer", "adamw", "--plot", str(tmp_path / "lr.png")]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == f"no plot drawn: --plot needs matplotlib: {plot.INSTALL}"
    assert "range test of adamw" in out and "range test of sgd" not in out and not (tmp_path / "lr.png").exists()


@pytest.mark.parametrize("extra,message", [
    (["--steps", "5"], "--steps must be at least 10"),
    (["--optimizer", "sgd", "--start", "1", "--end", "0.1"], "--start below --end"),
    (["--start", "1e-5"], "--start is one optimizer's: give --optimizer too"),
    (["--weight-decay", "0.1"], "--weight-decay is one optimizer's"),
    (["--optimizer", "adamw", "--momentum", "0.8"], "--momentum is SGD's"),
    (["--batch", "10", "--sub-batches", "3"], "multiple of --sub-batches"),
    (["--plot", "nowhere/lr.png"], "no folder nowhere"),
    (["--iters", "0"], "--iters must be a positive integer"),
])
def test_bad_options_are_refused_in_one_line_before_a_step(tmp_path, capsys, monkeypatch, extra, message):
    path = write_data(tmp_path / "blobs.h5")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lr_find, "range_test", lambda *a, **k: pytest.fail("a step ran"))
    assert lr_find.main(["--data-file", str(path), "--model", "resnet11", "--batch", "16"] + extra) == 2
    assert message in one_line_error(capsys.readouterr().err)


def test_a_missing_data_file_or_a_bad_choice_is_status_2(tmp_path, capsys):
    assert lr_find.main(["--data-file", str(tmp_path / "none.h5"), "--model", "resnet11"]) == 2
    one_line_error(capsys.readouterr().err)
    with pytest.raises(SystemExit) as e:  # argparse's own refusal
        lr_find.main(["--bits", "3"])
    assert e.value.code == 2


def test_ctrl_c_ends_it_with_status_130(tmp_path, capsys, monkeypatch):
    path = write_data(tmp_path / "blobs.h5")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(lr_find, "range_test", interrupted)
    assert cli.run(lambda: lr_find.main(["--data-file", str(path), "--model", "resnet11", "--batch", "16"])) == 130
    assert "stopped" in capsys.readouterr().err


def test_help_names_the_trainers_options_and_the_tests(capsys):
    with pytest.raises(SystemExit) as e:
        lr_find.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(flag in out for flag in ("--data-file", "--model-arg", "--memory", "--optimizer",
                                                             "--weight-decay", "--steps", "--start", "--plot"))
