"""The arena: plan totals without allocation, aligned views, refusal of unplanned buffers."""
import numpy as np
import pytest

from minibp import backend
from minibp.arena import ALIGNMENT, Arena, Plan


def _plan():
    plan = Plan()
    plan.add("act0", (2, 5, 5, 3), np.float32, "shared activations")
    plan.add("store0", (75,), np.uint8, "stores")
    plan.add("store1", (13,), np.uint8, "stores")
    plan.add("params", (7,), np.float64, "parameters")
    return plan


def test_plan_totals_by_category_without_allocating():
    plan = _plan()
    assert plan.bytes_by_category() == {"shared activations": 600, "stores": 88, "parameters": 56}
    assert plan.total_bytes == 744 == sum(plan.bytes_by_category().values())
    assert plan.allocation_bytes == 768 + 3 * 256 + 256  # each buffer padded to 256 bytes, and the base
    assert "total" in plan.summary() and "stores" in plan.summary()


def test_plan_of_a_huge_net_costs_nothing():
    plan = Plan()
    plan.add("huge", (10**6, 10**6), np.float32, "x")  # 4 TB: never allocated by planning
    assert plan.total_bytes == 4 * 10**12


def test_views_are_aligned_disjoint_and_shaped():
    arena = Arena(_plan())
    spans = []
    for name, spec in arena.plan.buffers.items():
        view = arena[name]
        assert view.shape == spec.shape and view.dtype == spec.dtype
        address = view.data.ptr if backend.device == "gpu" else view.ctypes.data
        assert address % ALIGNMENT == 0, name
        spans.append((address, address + spec.nbytes))
    spans.sort()
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    arena["act0"][...] = 1
    arena["store0"][...] = 7
    assert float(arena["act0"].sum()) == 150 and int(arena["store0"].sum()) == 7 * 75


def test_unplanned_buffer_is_refused():
    arena = Arena(_plan())
    with pytest.raises(KeyError, match="not in the arena's plan"):
        arena["act1"]


def test_duplicate_and_negative_buffers_are_refused():
    plan = _plan()
    with pytest.raises(ValueError, match="already"):
        plan.add("act0", (1,), np.float32, "x")
    with pytest.raises(ValueError, match="negative"):
        plan.add("bad", (-1,), np.float32, "x")
