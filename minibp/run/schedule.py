"""Learning-rate schedules: the text --lr-schedule takes, parsed for a run's iterations.

    0:0.01,400:0.1,32000:0.01          StepSchedule: the rate from each iteration on (the paper's)
    cosine:0.1:warmup=200              CosineSchedule: linear warm-up, then a half cosine to 0 at the run's end

A run records its schedule as the text (a resume may change it) and parses it for its iterations.
"""
import math
from dataclasses import dataclass

import numpy as np

REFERENCE_SCHEDULE = "0:0.01,400:0.1,32000:0.01,48000:0.001"  # the paper's recipe, for 64k iterations
STEPS_SYNTAX = f"ITER:LR[,ITER:LR...], e.g. {REFERENCE_SCHEDULE}"
COSINE_SYNTAX = "cosine:PEAK[:warmup=ITERS], e.g. cosine:0.1:warmup=200"


@dataclass(frozen=True)
class StepSchedule:
    """'0:0.01,400:0.1,...': the rate from each iteration on (the paper's)."""
    steps: tuple  # ((iteration, rate), ...) from iteration 0, sorted

    def rate(self, iteration):
        return [lr for start, lr in self.steps if start <= iteration][-1]

    def divided(self, by):
        """The schedule's text with every rate divided by `by` (a diverged run's advice)."""
        return ",".join(f"{it}:{lr / by:g}" for it, lr in self.steps)


@dataclass(frozen=True)
class CosineSchedule:
    """'cosine:PEAK[:warmup=W]': a linear warm-up to PEAK over the first W iterations, PEAK * (t + 1) / W at
    iteration t (the first step already moves), then a half cosine from PEAK down towards 0 at the run's
    end, PEAK * (1 + cos(pi * (t - W) / (iters - W))) / 2. It stretches with --iters when a resume changes it."""
    peak: float
    warmup: int
    iters: int

    def rate(self, iteration):
        if iteration < self.warmup:
            return self.peak * (iteration + 1) / self.warmup
        return self.peak * (1 + math.cos(math.pi * (iteration - self.warmup) / (self.iters - self.warmup))) / 2

    def divided(self, by):
        return f"cosine:{self.peak / by:g}" + (f":warmup={self.warmup}" if self.warmup else "")


def parse_schedule(text, *, iters):
    """A schedule's text (--lr-schedule) -> StepSchedule or CosineSchedule (for a run of `iters` iterations,
    which a cosine needs), or a ValueError that gives the syntax."""
    if text.startswith("cosine:"):
        return _cosine(text, iters)
    try:
        steps = sorted((int(it), float(lr)) for it, lr in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise ValueError(f"a learning-rate schedule is {STEPS_SYNTAX}, or {COSINE_SYNTAX}; got {text!r}") from None
    if not steps or steps[0][0] != 0 or any(lr < 0 or not np.isfinite(lr) for _, lr in steps):
        raise ValueError(f"the schedule must start at iteration 0 with finite non-negative rates, got {text!r}")
    repeated = sorted({it for (it, _), (nxt, _) in zip(steps, steps[1:]) if it == nxt})
    if repeated:
        raise ValueError(f"the schedule gives iteration {repeated[0]} more than one rate: {text!r}")
    return StepSchedule(tuple(steps))


def _cosine(text, iters):
    parts = text.split(":")
    try:
        peak = float(parts[1])
        options = dict(part.split("=") for part in parts[2:])
        warmup = int(options.pop("warmup", 0))
    except ValueError:
        raise ValueError(f"a cosine schedule is {COSINE_SYNTAX}; got {text!r}") from None
    if len(parts) > 3 or options or not np.isfinite(peak) or peak < 0 or warmup < 0:
        raise ValueError(f"a cosine schedule is {COSINE_SYNTAX}, a finite non-negative PEAK; got {text!r}")
    if warmup >= iters:
        raise ValueError(f"the schedule's warm-up ({warmup} iterations) must end before the run does "
                         f"(--iters {iters}): {text!r}")
    return CosineSchedule(peak, warmup, iters)
