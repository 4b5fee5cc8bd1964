"""Fitting a plan to memory: sizes in bytes as people write them, the largest batch whose arena fits a budget,
and a net compiled only after its plan is known to fit the memory available now (the trainer, the evaluator
and the planner's --budget all ask these questions of Net.plan, the table the arena allocates from).
"""
import math
import re

from .. import backend
from ..arena import format_bytes
from ..params import key

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40,
         "p": 2**50, "pb": 10**15, "pib": 2**50}
MAX_BUDGET = 2**50      # 1 PiB: beyond any machine, and every buffer size stays far inside int64
MAX_BATCH = 2**31 - 1   # the largest batch the search reports
FAR = 2**20             # a batch far enough from 1 that alignment padding barely tilts the predicted slope


def parse_bytes(text):
    """'11GiB', '11 GB', '512MiB', '1e9' -> bytes (int)."""
    match = re.fullmatch(r"\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"a size is a number and a unit (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB), "
                         f"got {text!r}")
    value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if not math.isfinite(value):
        raise ValueError(f"size {text!r} is not a finite number of bytes")
    return int(value)


def check_budget(budget):
    """A budget in bytes as an int; ValueError unless it is positive and at most MAX_BUDGET."""
    if not budget > 0:  # NaN too
        raise ValueError(f"a budget must be a positive number of bytes, got {budget}")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget:.3g} bytes is beyond any machine (at most 1 PiB)")
    return int(budget)


def largest_batch(net, *, store, budget, training=True, optimizer="sgd", grad_norm=False):
    """The largest batch, at this store (quant.Store), (at most MAX_BATCH) whose arena fits the budget; 0 if not even one image fits.
    training, optimizer and grad_norm: Net.plan's.

    The arena grows with the batch, monotonically and nearly linearly (alignment padding and reduction
    chunks aside): plans at batch 1 and FAR predict the answer, a bracket widened from the prediction by
    doubling steps and then a bisection pin it down in O(log(error)) more plans, whatever the budget."""
    budget = check_budget(budget)
    allocation = lambda batch: net.plan(batch=batch, store=store, training=training, optimizer=optimizer,  # noqa: E731
                                        grad_norm=grad_norm).allocation_bytes
    fits = lambda batch: allocation(batch) <= budget  # noqa: E731
    one = allocation(1)
    if one > budget:
        return 0
    per_image = max(1, (allocation(FAR) - one) / (FAR - 1))
    guess = int(min(MAX_BATCH, max(1, 1 + (budget - one) // per_image)))
    lo, hi, step = 1, MAX_BATCH + 1, 1  # lo fits; hi does not (beyond the cap counts as not fitting)
    if fits(guess):
        lo = guess
        while lo + step < hi and fits(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(hi, lo + step)
    else:
        hi = guess
        while hi - step > lo and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(lo, hi - step)
    while hi - lo > 1:
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if fits(middle) else (lo, middle)
    return lo


def compile_within_memory(net, *, batch, store,
                          hint="lower --batch, or compute it in parts with --sub-batches", **options):
    """net.compile(batch=, store=, **options), refused before anything is allocated unless its plan fits the
    memory available now; the refusal gives the plan's size and the largest batch that fits."""
    planned = {k: options[k] for k in ("training", "optimizer", "grad_norm") if k in options}  # what plans differ by

    def check_fits(plan):
        available = backend.available_memory()
        if available is None or plan.allocation_bytes <= available:
            return
        fits = largest_batch(net, store=store, budget=available, **planned) if available > 0 else 0
        if fits == 0:  # no batch size helps: say what is too big
            one = net.plan(batch=1, store=store, **planned).allocation_bytes
            raise ValueError(f"even a batch of 1 needs {format_bytes(one)} but {backend.device} has "
                             f"{format_bytes(available)} available: the net is too large for this machine (input "
                             f"{'x'.join(map(str, net.input_shape))}, {net.classes:,} classes)")
        raise ValueError(f"a batch of {batch} needs {format_bytes(plan.allocation_bytes)} but {backend.device} has "
                         f"{format_bytes(available)} available: the largest batch that fits is {fits} ({hint})")

    return net.compile(batch=batch, store=store, check_plan=check_fits, **options)


def unit_rows(net, plan):
    """[(unit index, input shape, store bytes)] of the units that keep a store in this plan: the activation
    stores' bytes of each (its codes, and the block window's windows, which grow with the batch)."""
    def stores(u):
        names = (key(u.index, role) for role in ("store", "windows"))
        return sum(plan[n].nbytes for n in names if n in plan and plan[n].category == "activation stores")
    return [(u.index, u.in_shape, stores(u)) for u in net.units if key(u.index, "store") in plan]
