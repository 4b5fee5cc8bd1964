"""A memory budget, solved: for a byte budget, the sub-batches of a step and a store for each batch-norm unit
(exact, 8, 4 or 2 bits), the whole run within the budget, with the least predicted gradient error.

    costs = Costs(net, store=config.store, per_process=128)       # each unit's bytes at each choice, per pass size
    solution = solve(costs, errors, budget=1.25 * 2**30, overhead=lambda n: ...)
    solution.sub_batches, solution.stores, solution.arena_bytes, solution.error

The problem (docs/method.md, "A memory budget"):

    unknowns   S, the sub-batches of a step (a pass computes n = B / S images: B the process's share of the
               batch, which never changes), and s_u in CHOICES for each batch-norm unit u
    bytes      arena(n, s) = fixed(n) + sum_u bytes(u, s_u, n): the plan's allocation to the byte (Net.plan)
    fits       overhead(n) + arena(n, s) <= budget, overhead(n) the process beyond its arena (sizing.Footprint)
    S          the fewest sub-batches at which 2 bits in every unit fit: a mix fits at no fewer, and a larger
               budget never needs more. max_sub_batches lets S go up to that many where more lower the error.
    s          at that S, the least sum_u err(u, s_u) of the units' predicted errors (calibration.py) under the
               bytes: a multiple-choice knapsack. Where the bytes above the all-2-bit mix, counted in their greatest
               common divisor, span at most CELLS (a small net), a dynamic programme solves it exactly; otherwise
               (a ResNet's 10^5 to 10^6 such cells) the greedy of its linear relaxation: each unit's steps along
               the lower convex hull of its (bytes, error) points, all in order of error saved per byte, taken
               while they fit, which is within one step's bytes of the optimum. A budget that holds every unit
               exact keeps every unit exact.

Both are monotone, and which of them solves depends on the net and S, not the budget: a larger budget never gives a
larger predicted error at the same S. Another kind of store (a unit's segment recomputed from an exact input) would
be one more column of (bytes, error) a unit: neither solver changes (docs/method.md).
"""
from dataclasses import dataclass

import numpy as np

from ..arena import align_up, format_bytes
from ..quant import per_unit

CHOICES = ("2", "4", "8", "exact")  # a unit's stores, cheapest first (the knapsack's columns)
CELLS = 1 << 15                     # the most cells an exact programme counts the bytes in (units x CHOICES x CELLS)


@dataclass(frozen=True)
class Solution:
    sub_batches: int        # of the process's share of the batch
    stores: tuple           # (quant.Store,) one a unit
    arena_bytes: int        # the plan's allocation at that mix and pass size
    overhead_bytes: int     # the process beyond its arena (sizing.Footprint), at that pass size
    error: float            # the mix's predicted error, sum_u err(u, s_u)
    budget: int             # the budget solved for

    total_bytes = property(lambda self: self.arena_bytes + self.overhead_bytes)  # what the budget holds


class Costs:
    """Each batch-norm unit's bytes at each of CHOICES, and the rest of the arena, at a pass of n images: from the
    units' own declarations (own_buffers), so that fixed(n) + sum_u bytes(u, s_u, n) is Net.plan's allocation."""

    def __init__(self, net, *, store, per_process, training=True, optimizer="sgd", grad_norm=False,
                 class_weights=False):
        self.net, self.store, self.per_process = net, store, per_process
        self.planned = dict(training=training, optimizer=optimizer, grad_norm=grad_norm, class_weights=class_weights)
        self.units = [u for u in net.units if u.bn_channels]   # the units a choice is made for
        self.choices = [store.at(bits) for bits in CHOICES]     # the run's window, rounding and clip at each bits
        self._at = {}

    def sub_batches(self):
        """The counts of sub-batches a pass size can come from: the divisors of the process's batch, fewest first."""
        return [s for s in range(1, self.per_process + 1) if self.per_process % s == 0]

    def at(self, n):
        """(bytes (units, CHOICES) int64, fixed bytes) of a pass of n images: a unit's bytes are its store's and (k
        bits) its windows', each aligned as the arena aligns it; the statistics, the same at every choice, are fixed."""
        if n not in self._at:
            unit_bytes = np.array([[self._bytes(u, n, s) for s in self.choices] for u in self.units], np.int64)
            cheapest = self.plan(n, [0] * len(self.units)).allocation_bytes
            self._at[n] = unit_bytes, cheapest - int(unit_bytes[:, 0].sum())
        return self._at[n]

    def _bytes(self, u, n, store):
        return sum(align_up(int(np.prod(own.shape)) * np.dtype(own.dtype or self.net.dtype).itemsize)
                   for own in u.own_buffers(n, store=store, keep=True) if own.role != "stats")

    def stores(self, picks):
        """(quant.Store,) one a unit of the net from each batch-norm unit's column in CHOICES (the others keep
        nothing to code: exact)."""
        return stores_of(self.net, [CHOICES[int(j)] for j in picks], self.store)

    def plan(self, n, picks):
        return self.net.plan(pass_images=n, store=list(self.stores(picks)), **self.planned)


def knapsack(costs, errors, capacity):
    """The column of each row (unit) that minimises the sum of errors with the sum of costs at most capacity, or None
    where even the cheapest columns do not fit. costs: (units, choices) bytes, the cheapest first; errors: (units,
    choices). Exact (a dynamic programme) where the costs above the cheapest, in units of their greatest common
    divisor, span at most CELLS; otherwise the greedy of the linear relaxation (_greedy). Which of the two depends on
    the costs alone, not the capacity, so that either is monotone in it; ties go to the cheaper column."""
    costs, errors = np.asarray(costs, np.int64), np.asarray(errors, np.float64)
    cheapest = costs.min(axis=1)
    spare = int(capacity) - int(cheapest.sum())
    if spare < 0:
        return None
    extra = costs - cheapest[:, None]
    cell = max(int(np.gcd.reduce(extra.ravel())), 1)
    weights = extra // cell  # whole cells: exact
    if int(weights.max(axis=1).sum()) > CELLS:
        return _greedy(extra, errors, spare)
    return _programme(weights, errors, min(spare // cell, int(weights.max(axis=1).sum())))


def _programme(weights, errors, W):
    """The exact multiple-choice knapsack in W cells: best[c], the least error of the rows so far within c cells,
    updated row by row; the columns recovered backwards."""
    units, choices = weights.shape
    best = np.zeros(W + 1)
    chosen = np.empty((units, W + 1), np.uint8)  # the column row u took at each c
    candidates = np.empty((choices, W + 1))
    for u in range(units):
        candidates.fill(np.inf)
        for j in range(choices):
            w = int(weights[u, j])
            if w <= W:
                candidates[j, w:] = best[:W + 1 - w] + errors[u, j]
        chosen[u] = candidates.argmin(axis=0)  # (the first of equals: the cheaper, columns being cheapest first)
        best = candidates.min(axis=0)
    picks, c = np.empty(units, np.int64), W
    for u in range(units - 1, -1, -1):
        picks[u] = chosen[u, c]
        c -= int(weights[u, picks[u]])
    return picks


def _greedy(extra, errors, spare):
    """The linear relaxation's greedy: every row's steps along the lower convex hull of its (bytes, error) points, all
    rows' steps in order of error saved per byte, taken while they fit and no further (so a larger spare takes a
    longer prefix: monotone). Within one step's bytes of the relaxation's optimum, which bounds the exact one."""
    steps = []  # (error saved per byte, row, step, bytes, column)
    for u in range(len(extra)):
        j, step = int(np.argmin(extra[u])), 0
        while True:
            dearer = [(errors[u, j] - errors[u, i]) / (extra[u, i] - extra[u, j]) if extra[u, i] > extra[u, j] and
                      errors[u, i] < errors[u, j] else -1.0 for i in range(extra.shape[1])]
            i = int(np.argmax(dearer))
            if dearer[i] <= 0:
                break
            steps.append((-dearer[i], u, step, int(extra[u, i] - extra[u, j]), i))
            j, step = i, step + 1
    picks = np.argmin(extra, axis=1)
    for _, u, _, nbytes, column in sorted(steps):
        if nbytes > spare:
            break
        spare -= nbytes
        picks[u] = column
    return picks


def monotone_errors(errors):
    """(units, CHOICES) errors from measured (units, 3) errors at 2, 4 and 8 bits: each k-bit error at least the
    one of more bits (a measurement's noise may say otherwise) and above zero, exact's zero."""
    e = np.maximum(np.asarray(errors, np.float64), np.finfo(np.float64).tiny)
    e = np.maximum.accumulate(e[:, ::-1], axis=1)[:, ::-1]  # 2 >= 4 >= 8
    return np.concatenate([e, np.zeros((len(e), 1))], axis=1)


def prior_errors(costs):
    """The errors of a net that has not been calibrated (python3 -m minibp.plan): each unit's values times the
    variance of a code at k bits, (2^k - 1)^-2 (a unit of the same spread and the same weight in the gradient)."""
    values = np.array([np.prod(u.in_shape) for u in costs.units], np.float64)
    return values[:, None] * np.array([(2.0 ** k - 1) ** -2 for k in (2, 4, 8)])


def solve(costs, errors, *, budget, overhead, max_sub_batches=None):
    """The Solution for the budget (bytes), or a ValueError naming the least budget that fits and what it takes.
    errors: (units, 3) predicted errors at 2, 4 and 8 bits; overhead(n): the process's bytes beyond the arena at a
    pass of n images. max_sub_batches: S may go up to it where more sub-batches lower the error (default: the
    fewest that fit)."""
    errors = monotone_errors(errors)
    fewest = fewest_sub_batches(costs, budget=budget, overhead=overhead)
    candidates = [s for s in costs.sub_batches() if s == fewest or max_sub_batches is not None and
                  fewest < s <= max_sub_batches]
    solutions = [_solve_at(costs, errors, s, budget=budget, overhead=overhead) for s in candidates]
    return min(solutions, key=lambda sol: (sol.error, sol.sub_batches))


def fewest_sub_batches(costs, *, budget, overhead):
    """The fewest sub-batches at which 2 bits in every unit fit the budget; a ValueError naming the least budget
    and what it takes where none does."""
    fits = next((s for s in costs.sub_batches() if _cheapest_total(costs, s, overhead) <= budget), None)
    if fits is None:
        least, S = least_budget(costs, overhead)
        raise ValueError(f"needs at least {format_bytes(least)}: {least_words(costs, S)} (given "
                         f"{format_bytes(budget)})")
    return fits


def least_budget(costs, overhead):
    """(bytes, sub-batches) of the least budget any mix fits: 2 bits in every unit, a pass of one image."""
    S = costs.sub_batches()[-1]
    return _cheapest_total(costs, S, overhead), S


def least_words(costs, S):
    """What the least budget takes, in words: '2 bits in every unit and 128 sub-batches of 1 image'."""
    n = costs.per_process // S
    return f"2 bits in every unit and {S} sub-batch{'es' * (S > 1)} of {n} image{'s' * (n > 1)}"


def _cheapest_total(costs, s, overhead):
    n = costs.per_process // s
    unit_bytes, fixed = costs.at(n)
    return overhead(n) + fixed + int(unit_bytes[:, 0].sum())


def _solve_at(costs, errors, s, *, budget, overhead):
    n = costs.per_process // s
    unit_bytes, fixed = costs.at(n)
    capacity = budget - overhead(n) - fixed
    if unit_bytes[:, -1].sum() <= capacity:  # every unit exact
        picks = np.full(len(costs.units), len(CHOICES) - 1)
    else:
        picks = knapsack(unit_bytes, errors, capacity)
    arena = fixed + int(unit_bytes[np.arange(len(picks)), picks].sum())
    return Solution(sub_batches=s, stores=costs.stores(picks), arena_bytes=arena, overhead_bytes=int(overhead(n)),
                    error=float(errors[np.arange(len(picks)), picks].sum()), budget=int(budget))


def stores_of(net, bits, store):
    """(quant.Store,) one a unit from a recorded mix: bits (each batch-norm unit's, in unit order) at the run's
    window, rounding and clip (store)."""
    chosen = iter(bits)
    return per_unit([store.at(next(chosen) if u.bn_channels else "exact") for u in net.units], len(net.units))


def unit_bits(net, stores):
    """Each batch-norm unit's bits in unit order: what a checkpoint records of a mix."""
    return [s.bits for u, s in zip(net.units, stores) if u.bn_channels]

