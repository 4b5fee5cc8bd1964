"""The memory budget's solver (minibp/run/budget.py): the knapsack against every assignment enumerated, the plan's bytes
to the byte, monotone in the budget, and the least budget refused in one line."""
import itertools

import numpy as np
import pytest

from minibp import quant
from minibp.run import budget
from minibp.run.budget import CHOICES, Costs, knapsack, monotone_errors, solve
from nets import small_net, tiny_resnet


def brute_force(costs, errors, capacity):
    """The least error of any assignment within capacity (every one enumerated), or None."""
    best = None
    for picks in itertools.product(range(costs.shape[1]), repeat=len(costs)):
        rows = np.arange(len(costs))
        if costs[rows, picks].sum() <= capacity:
            error = errors[rows, picks].sum()
            best = error if best is None or error < best else best
    return best


def test_the_knapsack_is_every_assignments_best(rng):
    """Exact where the costs are whole cells (small nets: 256-byte buffers), feasible always."""
    for _ in range(200):
        units = int(rng.integers(1, 6))
        costs = np.sort(rng.integers(1, 300, (units, 4)), axis=1) * 256
        errors = monotone_errors(rng.random((units, 3)) * [100, 10, 1])
        capacity = int(rng.integers(costs.min(axis=1).sum() - 512, costs.max(axis=1).sum() + 512))
        picks, best = knapsack(costs, errors, capacity), brute_force(costs, errors, capacity)
        if best is None:
            assert picks is None
            continue
        rows = np.arange(units)
        assert costs[rows, picks].sum() <= capacity
        assert errors[rows, picks].sum() == pytest.approx(best, rel=1e-12, abs=1e-300)


def test_the_greedy_of_a_large_net_fits_and_is_within_a_step_of_the_best(rng):
    """Costs whose greatest common divisor leaves more than CELLS cells (a ResNet's): the linear relaxation's greedy,
    which fits, and is as good as the best assignment of a capacity smaller by its largest step (it stops short of
    the relaxation's optimum by less than one step, and that optimum bounds the exact one); a larger capacity never
    gives a larger error."""
    units = 6
    for _ in range(8):
        costs = np.sort(rng.integers(10**6, 10**9, (units, 4)), axis=1) + 1  # odd: a divisor of 1 byte
        errors = monotone_errors(rng.random((units, 3)) * [100, 10, 1])
        largest = int((costs - costs[:, :1]).max())
        previous = np.inf
        for capacity in np.linspace(costs.min(axis=1).sum(), costs.max(axis=1).sum(), 16).astype(np.int64):
            picks = knapsack(costs, errors, capacity)
            error = errors[np.arange(units), picks].sum()
            assert costs[np.arange(units), picks].sum() <= capacity and error <= previous
            smaller = brute_force(costs, errors, capacity - largest)
            assert smaller is None or error <= smaller * (1 + 1e-12)
            previous = error


def test_errors_fall_with_bits_and_exact_is_free():
    e = monotone_errors([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
    assert e[0].tolist() == [2.0, 2.0, 0.5, 0.0]  # 4 bits never worse than 2: the measurement's noise evened out
    assert (e[1, :3] > 0).all() and e[1, 3] == 0


def costs_of(net, batch=8):
    return Costs(net, store=quant.Store("4"), per_process=batch)


def test_costs_are_the_plans_allocation_to_the_byte(rng):
    """fixed(n) + sum_u bytes(u, s_u, n) is Net.plan's allocation for any mix, at every pass size."""
    net = small_net()
    costs = costs_of(net)
    for n in (1, 2, 8):
        unit_bytes, fixed = costs.at(n)
        for _ in range(5):
            picks = rng.integers(0, len(CHOICES), len(costs.units))
            want = fixed + unit_bytes[np.arange(len(picks)), picks].sum()
            assert costs.plan(n, picks).allocation_bytes == want


def test_solutions_fit_and_are_monotone_in_the_budget():
    """Over budgets from the least to beyond exact: the bytes within the budget, the sub-batches never more and, at
    the same sub-batches, the predicted error never larger as the budget grows; every unit exact at the top."""
    net = tiny_resnet(classes=3)
    costs = costs_of(net, batch=16)
    errors = budget.prior_errors(costs)
    overhead = lambda n: 10**6  # noqa: E731
    least = overhead(16) + costs.at(1)[1] + int(costs.at(1)[0][:, 0].sum())
    most = overhead(16) + costs.at(16)[1] + int(costs.at(16)[0][:, -1].sum())
    previous = None
    for b in np.linspace(least, most + 4096, 60).astype(int):
        sol = solve(costs, errors, budget=int(b), overhead=overhead)
        assert sol.total_bytes <= b
        assert sol.total_bytes == overhead(16 // sol.sub_batches) + costs.plan(
            16 // sol.sub_batches, [CHOICES.index(b) for b in budget.unit_bits(net, sol.stores)]).allocation_bytes
        if previous is not None:
            assert sol.sub_batches <= previous.sub_batches
            if sol.sub_batches == previous.sub_batches:
                assert sol.error <= previous.error
        previous = sol
    assert previous.sub_batches == 1 and set(budget.unit_bits(net, previous.stores)) == {"exact"}


def test_more_sub_batches_are_taken_only_where_allowed_and_better():
    net = tiny_resnet(classes=3)
    costs = costs_of(net, batch=16)
    errors, overhead = budget.prior_errors(costs), (lambda n: 0)
    b = costs.at(16)[1] + int(costs.at(16)[0][:, 0].sum()) + 1000  # all 2-bit at one sub-batch, barely
    fewest = solve(costs, errors, budget=b, overhead=overhead)
    more = solve(costs, errors, budget=b, overhead=overhead, max_sub_batches=16)
    assert fewest.sub_batches == 1 and more.sub_batches > 1 and more.error < fewest.error


def test_a_budget_below_the_least_is_refused_naming_it():
    net = tiny_resnet(classes=3)
    costs = costs_of(net, batch=16)
    with pytest.raises(ValueError, match=r"^needs at least [0-9.]+ [KM]iB: 2 bits in every unit and 16 sub-batches "
                                         r"of 1 image \(given 1000 B\)$"):
        solve(costs, budget.prior_errors(costs), budget=1000, overhead=lambda n: 0)


def test_a_recorded_mix_is_its_stores():
    net = tiny_resnet(classes=3)
    bits = (["exact", "8", "4", "2"] * 3)[:sum(1 for u in net.units if u.bn_channels)]
    stores = budget.stores_of(net, bits, quant.Store("4", rounding="stochastic"))
    assert budget.unit_bits(net, stores) == bits
    assert {s.rounding for s in stores if s.k} == {"stochastic"}
