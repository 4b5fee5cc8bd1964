"""Find a learning rate: a range test on your data and net, and the schedule it suggests for SGD and AdamW.

    python3 -m minibp.lr_find --data fashion-mnist --model resnet20                  # SGD, then AdamW
    python3 -m minibp.lr_find --data-file arrows.h5 --model resnet20 --optimizer adamw --plot lr.png
    python3 -m minibp.lr_find --data-file arrows.h5 --model docs/vgg_example.py:build --model-arg width=16 \\
        --batch 64 --steps 300 --iters 3000                                            # the run you will train

The idea (a learning-rate range test): train the net from its first weights for --steps steps, one step at each
rate, the rate rising exponentially from --start to --end, and watch the training loss. At rates too low to
matter it stays where it began; then it falls, faster and faster; past the rates the net can take it turns and
climbs. The loss of one batch is noisy, so the test reads its exponential moving average (SMOOTHING, bias-corrected
as Adam's moments are) and stops early where that exceeds 4 times its minimum, or where a loss is not finite.

The rule (suggest): the peak of the suggested schedule is a third of the rate at the smoothed loss's minimum, the
edge of what the net can take: below it, where the loss still fell fast, but not far below, so that a short run
trains at a rate that moves it. (A tenth, the other common reading, trained 3.5 points worse with SGD and 2.2 with
AdamW in the 300-iteration run on Fashion-MNIST that chose the third: docs/results.md.) The schedule is a cosine
with a linear warm-up over 5% of the run, cosine:PEAK:warmup=W, and the command line printed is the trainer's with
the options given here, --optimizer, --iters (the run you will train: default 2000) and that schedule.
bench/lr_find.py checks the rule against a hand grid of rates: on Fashion-MNIST it was within a point of the grid's
best or above it, on drawn shapes it failed (docs/results.md).

Where the smoothed loss falls by less than a quarter of its first value, or climbs 5% above its least before it
reaches its minimum, the suggestion is doubtful, and a warning says so: on data whose loss stays flat through the few
steps the test gives each rate (bench/lr_find.py's drawn shapes), it falls only at rates that diverge in a run of
their own, and the minimum is that fall's.

Each optimizer has its range (--start, --end: SGD 1e-4 to 10, AdamW 1e-6 to 1); without --optimizer both are
tested, one after the other, from the same weights and data order. The test runs the trainer's own step, planned
and compiled as the run's (the model, data, batch, store and optimizer options are the trainer's), with nothing
written but --plot's file: no run folder, no checkpoint; --init-from's run is only read.

Exit status: 0 done, 2 a bad option or input file, 130 interrupted.
"""
import argparse
import math
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import cli, plot
from .kernels import KernelError
from .run import splits, startup
from .run.config import RunConfig
from .run.options import add_option, option, parse_model_arg
from .run.session import Clock

STEPS = 200          # steps of a range test
SMOOTHING = 0.9      # the moving average's beta: about ten steps' memory
DIVERGED = 4.0       # the test stops where the smoothed loss exceeds this many times its minimum
DIVISOR = 3          # the suggested peak: the minimum's rate divided by this
CLIMB = 1.05         # a climb: the smoothed loss this many times its least so far
FELL = 0.25          # a test whose smoothed loss fell by less than this share of its first value saw little learning
WARMUP = 0.05        # the suggested warm-up: this fraction of the run's iterations
ITERS = 2000         # the run the printed command trains, where --iters is not given
RANGES = dict(sgd=(1e-4, 10.0), adamw=(1e-6, 1.0))  # each optimizer's --start and --end
TABLE_ROWS = 15
# the trainer's options this command takes: the run's model, data, store and optimizer (run/options.py)
RUN_OPTIONS = ("data", "data_dir", "data_file", "augment", "val_split", "model", "init_from", "seed", "bits",
               "window", "rounding", "batch", "sub_batches", "memory", "max_sub_batches", "optimizer", "momentum",
               "weight_decay", "clip_norm")


def rates(*, start, end, steps):
    """The rate of each step: exponentially from start to end, both included."""
    return [start * (end / start) ** (i / (steps - 1)) for i in range(steps)]


def smooth(losses, *, beta=SMOOTHING):
    """The exponential moving average of losses, bias-corrected: after i losses, (1 - beta) * sum of beta^(i-j)
    loss_j divided by 1 - beta^i, so the first value is the first loss. NaN from the first loss that is not
    finite on."""
    average, smoothed = 0.0, []
    for i, loss in enumerate(losses, 1):
        average = beta * average + (1 - beta) * loss
        smoothed.append(average / (1 - beta ** i) if np.isfinite(average) else math.nan)
    return smoothed


def stops(smoothed):
    """Whether a range test stops after its last smoothed loss: not finite, or above DIVERGED times the least."""
    last = smoothed[-1]
    return not np.isfinite(last) or last > DIVERGED * min(smoothed)


@dataclass(frozen=True)
class Suggestion:
    peak: float           # the suggested schedule's peak: minimum / DIVISOR
    minimum: float        # the rate at the smoothed loss's minimum ...
    at: int               # ... and its step
    steepest: float       # the rate where the smoothed loss fell fastest against log rate, before the minimum
    still_falling: bool   # the minimum is the last finite step: a higher --end may find a higher rate
    climbed: float = None  # the rate where the smoothed loss first climbed CLIMB times above its least so far, where
    #                        that came before the minimum (past the average's first steps) ...
    fell: float = 1.0      # ... and the share of its first value the smoothed loss fell by at its minimum: either a
    #                        climb or a fall below FELL makes the suggestion doubtful (doubt)

    def doubt(self):
        """Why the suggestion is doubtful (the module docstring), or None."""
        if self.climbed is not None:
            return (f"the smoothed loss climbed {CLIMB - 1:.0%} above its least at rate {self.climbed:.3g}, before "
                    "its minimum")
        if self.fell < FELL:
            return f"the smoothed loss fell by {self.fell:.0%} only, at its minimum"
        return None

    def schedule(self, *, iters):
        """The --lr-schedule suggested for a run of iters iterations: cosine:PEAK:warmup=W, W 5% of them."""
        return f"cosine:{self.peak:.2g}:warmup={max(1, round(WARMUP * iters))}"


def suggest(rates, smoothed, *, beta=SMOOTHING):
    """The Suggestion of a range test (its rates and smoothed losses, as long as each other), read from the steps
    before the first loss that is not finite: the minimum's rate divided by DIVISOR (the module docstring). The
    steepest descent, and a climb before the minimum (climbed), are read after the average's first 1 / (1 - beta)
    steps (its memory), whose few losses make it jump. A ValueError where the smoothed loss never fell below its
    first value (the rates began too high) or fewer than three steps are finite."""
    if len(rates) != len(smoothed):
        raise ValueError(f"{len(rates)} rates for {len(smoothed)} losses")
    n = next((i for i, s in enumerate(smoothed) if not np.isfinite(s)), len(smoothed))
    if n < 3:
        raise ValueError(f"the range test's loss was finite for {n} step{'s' * (n != 1)} only: its rates began too "
                         "high; give a lower --start")
    loss, log_rate = np.asarray(smoothed[:n], np.float64), np.log(np.asarray(rates[:n], np.float64))
    at = int(np.argmin(loss))
    if at == 0:
        raise ValueError(f"the smoothed loss never fell below its first value ({loss[0]:.4g} at rate {rates[0]:.3g}): "
                         "the rates began too high, or the steps are too few to move it; give a lower --start or "
                         "more --steps")
    memory = round(1 / (1 - beta))
    first = min(memory, at - 1)
    slopes = np.diff(loss[first:at + 1]) / np.diff(log_rate[first:at + 1])
    fastest = first + int(np.argmin(slopes))  # between steps fastest and fastest + 1: their geometric mean
    least = np.minimum.accumulate(loss)
    climbed = next((i for i in range(max(1, memory), at) if loss[i] > CLIMB * least[i - 1]), None)
    return Suggestion(peak=float(rates[at]) / DIVISOR, minimum=float(rates[at]), at=at,
                      steepest=float(np.exp(log_rate[fastest:fastest + 2].mean())), still_falling=at == n - 1,
                      climbed=None if climbed is None else float(rates[climbed]), fell=float(1 - loss[at] / loss[0]))


def range_test(step, batches, rates, *, say=print, every=20):
    """(losses, smoothed losses) of a range test: one step of step (a step.TrainStep) at each rate on the next
    batch of batches (Batches), until the rates end or the smoothed loss stops (stops). The net, its optimizer's
    state and the batches' position are restored afterwards, as they were. say: each `every` steps' progress line."""
    net, before, position = step.net, step.net.state(), batches.state()
    clock, losses, smoothed = Clock(first=0, last=len(rates)), [], []
    try:
        for i, lr in enumerate(rates):
            images, labels = batches.next()
            try:
                step.run(images, labels, lr=lr, iteration=i)
                loss = float(step.result()[0])
            except FloatingPointError:  # an eager step's loss that is not finite
                loss = math.nan
            losses.append(loss)
            smoothed = smooth(losses)
            if (i + 1) % every == 0 or stops(smoothed) or i + 1 == len(rates):
                say(f"step {i + 1:{len(str(len(rates)))}d}/{len(rates)}  lr {lr:.3g}  loss {loss:.4f}  smoothed "
                    f"{smoothed[-1]:.4f}  {clock.now(i + 1)}")
            if stops(smoothed):
                break
    finally:
        net.load_state(before)
        batches.restore(position)
    return losses, smoothed


def table(rates, losses, smoothed, suggestion, *, rows=TABLE_ROWS):
    """The range test as about `rows` lines, evenly spaced in log rate, with the minimum's step and the step nearest
    the suggested peak marked."""
    n = len(losses)
    near = int(np.argmin([abs(math.log(r / suggestion.peak)) for r in rates[:n]])) if suggestion else None
    picked = sorted(set(np.round(np.linspace(0, n - 1, min(rows, n))).astype(int)) |
                    ({suggestion.at, near} if suggestion else set()))
    lines = [f"{'step':>5}  {'rate':>9}  {'loss':>8}  {'smoothed':>8}"]
    for i in picked:
        mark = ("  <- minimum" if suggestion and i == suggestion.at else
                f"  <- suggested peak (1/{DIVISOR} the minimum's)" if i == near else "")
        lines.append(f"{i + 1:5d}  {rates[i]:9.3g}  {losses[i]:8.4f}  {smoothed[i]:8.4f}{mark}")
    return "\n".join(lines)


def figure(tests):
    """The smoothed loss against the rate (log scale) of each optimizer's test, its minimum and suggested peak
    marked: tests is [(optimizer, rates, losses, smoothed, Suggestion or None)]."""
    plt = plot.pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, rates_, losses, smoothed, suggestion) in enumerate(tests):
        n = len(losses)
        ax.plot(rates_[:n], losses, color=f"C{i}", lw=0.6, alpha=0.35)
        ax.plot(rates_[:n], smoothed, color=f"C{i}", lw=2, label=f"{name} (smoothed)")
        if suggestion is not None:
            ax.axvline(suggestion.peak, color=f"C{i}", ls="--", lw=1, label=f"{name}: peak {suggestion.peak:.2g}")
            ax.axvline(suggestion.minimum, color=f"C{i}", ls=":", lw=1)
    finite = [s for *_, smoothed, _ in tests for s in smoothed if np.isfinite(s)]
    if finite:  # the climb past the minimum would squeeze the rest
        ax.set_ylim(0.9 * min(finite) - 0.05, min(max(finite), DIVERGED * min(finite)) * 1.05)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("training loss")
    ax.set_title("learning-rate range test (dotted: the minimum; dashed: the suggested peak)", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    plot.legend_below(fig, ax.get_legend_handles_labels()[0], columns=2)
    return fig


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def command_line():
    """python3 -m minibp.lr_find's parser: the trainer's options of a run's model, data, store and optimizer, read
    as the trainer reads them (absent where not given: RunConfig.new gives the rest their defaults), and the test's."""
    parser = argparse.ArgumentParser(prog="python3 -m minibp.lr_find", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    run = parser.add_argument_group("the run (the trainer's options, as python3 -m minibp.train takes them)")
    for name in RUN_OPTIONS:
        add_option(run, name, default=argparse.SUPPRESS)
        if name == "model":
            run.add_argument("--model-arg", dest="model_args", metavar="NAME=VALUE", type=parse_model_arg,
                             action="append", default=argparse.SUPPRESS,
                             help="a keyword argument for your own net's function, VALUE a Python literal")
    add_option(run, "iters", default=None, help=f"the iterations of the run you will train, for the command printed "
               f"(its warm-up is {WARMUP * 100:g}%% of them; default {ITERS})")
    test = parser.add_argument_group("the range test")
    test.add_argument("--steps", type=int, default=STEPS, metavar="N", help=f"steps of the test (default {STEPS})")
    test.add_argument("--start", type=float, metavar="LR", help="the first step's rate (default: SGD "
                      f"{RANGES['sgd'][0]:g}, AdamW {RANGES['adamw'][0]:g}); needs --optimizer")
    test.add_argument("--end", type=float, metavar="LR", help="the last step's rate (default: SGD "
                      f"{RANGES['sgd'][1]:g}, AdamW {RANGES['adamw'][1]:g}); needs --optimizer")
    test.add_argument("--plot", metavar="FILE.png", help="draw the loss against the rate into this file (needs "
                      "matplotlib)")
    test.add_argument("--overwrite", action="store_true", help="replace --plot's file where it is there (default off: "
                      "refused)")
    return parser


def _checked(args, given):
    """The optimizers to test with their (start, end), after the checks of the test's own options: a ValueError in
    the command line's words for a bad one."""
    if args.steps < 10:
        raise ValueError(f"--steps must be at least 10, got {args.steps}")
    if args.iters is not None and args.iters < 1:
        raise ValueError(f"--iters must be a positive integer, got {args.iters}")
    optimizers = [given["optimizer"]] if "optimizer" in given else list(RANGES)
    if len(optimizers) > 1:
        for name in ("start", "end", "weight_decay"):
            if getattr(args, name, None) is not None or name in given:
                raise ValueError(f"{option(name)} is one optimizer's: give --optimizer too (without it both sgd and "
                                 "adamw are tested, each with its own)")
    tested = {}
    for name in optimizers:
        start = RANGES[name][0] if args.start is None else args.start
        end = RANGES[name][1] if args.end is None else args.end
        if not (np.isfinite(start) and np.isfinite(end) and 0 < start < end):
            raise ValueError(f"--start and --end must be finite, positive and --start below --end, got {start:g} and "
                             f"{end:g}")
        tested[name] = (start, end)
    if args.plot is not None:
        out = plot.with_suffix(Path(args.plot))
        if out.exists() and not args.overwrite:
            raise ValueError(f"--plot {out} is there: give --overwrite to replace it, or another name")
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--plot {out}: no folder {out.parent}")
    return tested


def train_command(given, argv_order, *, optimizer, iters, schedule):
    """The trainer's command line of a run with the options given here, this optimizer and schedule."""
    words = ["python3", "-m", "minibp.train"]
    for name in argv_order:
        if name == "optimizer" or (name == "momentum" and optimizer != "sgd"):
            continue
        values = given[name] if name == "model_args" else [given[name]]
        for value in values:
            words += [option(name), f"{value[0]}={value[1]!r}" if name == "model_args" else str(value)]
    return shlex.join(words + ["--optimizer", optimizer, "--iters", str(iters), "--lr-schedule", schedule])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = command_line().parse_args(argv)
    given = {name: getattr(args, name) for name in RUN_OPTIONS + ("model_args",) if hasattr(args, name)}
    order = sorted(given, key=lambda name: min((i for i, word in enumerate(argv) if word.split("=")[0] ==
                                                option(name)), default=len(argv)))
    iters = args.iters or ITERS
    try:
        tested = _checked(args, given)
        drawn = args.plot is not None and have_matplotlib()
        with np.errstate(all="ignore"):  # a diverging step is read from its loss, not warnings
            configs = {optimizer: _config(given, optimizer) for optimizer in tested}  # all checked before a step
            loaded = {}
            tests = [_test(args, configs[optimizer], start, end, loaded=loaded) for optimizer, (start, end) in
                     tested.items()]
        out = plot.save(figure(tests), Path(args.plot), replace=args.overwrite) if drawn else None
    except FileExistsError as e:  # --plot's file appeared while the test ran
        print(f"error: --plot {e.filename} appeared while the test ran: give --overwrite to replace it",
              file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for optimizer, _, _, _, suggestion in tests:
        if suggestion is not None:
            command = train_command(given, order, optimizer=optimizer, iters=iters,
                                    schedule=suggestion.schedule(iters=iters))
            print(f"suggested for {optimizer} (--iters is the run you will train):\n    {command}")
    if out is not None:
        print(f"wrote {out}")
    elif args.plot is not None:
        print(f"no plot drawn: --plot needs matplotlib: {plot.INSTALL}")
    return 0


def _config(given, optimizer):
    """The RunConfig of a range test of this optimizer with the options given (--momentum, SGD's, left out of AdamW's
    test where --optimizer is not given and both are tested)."""
    both = "optimizer" not in given
    return RunConfig.new(startup.fine_tuned({k: v for k, v in dict(given, optimizer=optimizer).items()
                                             if k != "momentum" or optimizer == "sgd" or not both}))


def _test(args, config, start, end, *, loaded):
    """(optimizer, rates, losses, smoothed, Suggestion or None) of one optimizer's range test (config: its
    RunConfig), printed as it goes: a line of the net, the test's progress, its table and its suggestion (or why
    there is none). loaded: {} the first time, then the data it holds, read once for every optimizer."""
    optimizer = config.optimizer
    if "data" not in loaded:
        loaded["data"] = splits.load(config)
    run_data = loaded["data"]
    net, _ = startup.build_net(config, run_data, None)
    step, _ = startup.make_step(net, config, ranks=1, run_data=run_data)
    if config.init_from is not None:
        startup.take_weights(net, config.init_from)
    print(startup.header(config, net, step, run_data, ranks=1).splitlines()[0])
    print(f"range test of {optimizer}: up to {args.steps} steps, the rate from {start:g} to {end:g} exponentially, one "
          f"step each; stops where the smoothed loss exceeds {DIVERGED:g}x its minimum", flush=True)
    steps = rates(start=start, end=end, steps=args.steps)
    losses, smoothed = range_test(step, run_data.batches, steps, say=lambda line: print(line, flush=True),
                                  every=max(1, args.steps // 10))
    try:
        suggestion, why = suggest(steps[:len(smoothed)], smoothed), None
    except ValueError as e:
        suggestion, why = None, str(e)
    print(table(steps, losses, smoothed, suggestion))
    if suggestion is None:
        print(f"{optimizer}: no rate suggested: {why}\n")
        return optimizer, steps, losses, smoothed, None
    falling = (f"; the loss was still falling at --end {end:g}: a higher --end may find a higher rate"
               if suggestion.still_falling else "")
    print(f"{optimizer}: the smoothed loss is least at rate {suggestion.minimum:.3g} (step {suggestion.at + 1}) and "
          f"falls fastest at {suggestion.steepest:.3g}; suggested peak {suggestion.peak:.2g}, 1/{DIVISOR} of the "
          f"minimum's{falling}", flush=True)
    if suggestion.doubt():
        print(f"warning: {suggestion.doubt()}: the test gives each rate few steps, and on data that needs more the "
              "loss stays flat, then falls at rates that diverge in a run of their own. Doubt this suggestion: try a "
              "few rates below it in short runs, or a test with more --steps", flush=True)
    print(flush=True)
    return optimizer, steps, losses, smoothed, suggestion


if __name__ == "__main__":
    sys.exit(cli.run(main))
