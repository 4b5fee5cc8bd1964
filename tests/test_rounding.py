"""Stochastic rounding of the k-bit stores (quant.codes_ref with uniform draws, quant_code_stochastic in
kernels/quant.cuh): unbiased on each side of zero but for the clip (docs/method.md), its draws uniform and
stateless, a resumed step drawing as an uninterrupted one, and no memory of its own. (The kernel's codes
equal the reference's byte for byte: tests/test_store_exact.py.)"""
import numpy as np
import pytest

from minibp import quant
from minibp.optim import SGD
from minibp.step import TrainStep
from conftest import device, host
from nets import tiny_resnet

DRAWS = 1 << 14  # rows: each row of a column draws anew


def _vhat(v, window, *, bits, key=7):
    """(DRAWS, C) decoded values of each column's one value v (C,), coded DRAWS times at random: the level of
    each code, the bins' edges, zero a level on each side of it (below zero code q is q - shift + 1 widths
    from zero, at and above it q - shift)."""
    C = len(v)
    values = np.broadcast_to(np.asarray(v, np.float32), (DRAWS, C))
    q = quant.codes_ref(values, window, bits=bits, uniform=quant.uniform_ref(key, DRAWS, C)).astype(np.float32)
    shift, below, above = window
    return np.where(q < shift, (q - shift + 1) * below, (q - shift) * above), q >= shift


def _window(shift, below, above, n):
    return np.stack([np.full(n, v) for v in (shift, below, above)]).astype(np.float32)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_stochastic_rounding_is_unbiased_over_each_side_of_the_window(bits):
    """Values anywhere between the last levels of their side, those next to zero included: the mean of DRAWS
    codings is u within 6 standard errors (a coding's spread is at most a bin, w/2 each way: the bound
    6 * w / (2 sqrt(DRAWS)), 0.023 w, where rounding to the bin's midpoint is off by up to w/2)."""
    K = 1 << bits
    shift, below, above = np.float32(max(K // 4, 2)), np.float32(0.3), np.float32(0.7)
    rng = np.random.default_rng(bits)
    u_above = np.concatenate([rng.uniform(0, 0.5, 8), rng.uniform(0, K - 1 - shift, 16)]) * above
    u_below = -np.concatenate([rng.uniform(0, 0.5, 8), rng.uniform(0, shift - 1, 16)]) * below
    u = np.concatenate([u_above, u_below]).astype(np.float32)
    vhat, mask = _vhat(u + quant.MASK_THRESHOLD, _window(shift, below, above, len(u)), bits=bits)
    assert np.array_equal(mask, np.broadcast_to(u >= 0, mask.shape))  # never across zero
    w = np.where(u < 0, below, above)
    error = np.abs(vhat.mean(axis=0, dtype=np.float64) - u)
    assert np.all(error <= 6 * w / (2 * np.sqrt(DRAWS))), (error / w).max()
    nearest = quant.codes_ref(u + quant.MASK_THRESHOLD, _window(shift, below, above, len(u)), bits=bits)
    nearest_vhat = (nearest - shift + np.float32(0.5)) * np.where(nearest < shift, below, above)
    assert np.abs(nearest_vhat - u).max() > 0.1 * w.max()  # what the test would see of a biased rounding


def test_the_clip_is_the_only_bias_and_rounding_never_crosses_zero():
    """A value rounds to one of the two levels around it on its own side of zero (zero a level on each side,
    so the mask stays exact); one on a level stays there; one beyond the last level of its side (a clipped
    window's clip) decodes to that level."""
    bits, shift, below, above = 4, np.float32(4), np.float32(0.25), np.float32(0.5)  # levels -0.75 .. 0, 0 .. 5.5
    u = np.array([0.0, 0.1, 0.4999, -0.01, -0.2, 1.5, -0.5, 5.5, 6.0, 30.0, -0.75, -5.0], np.float32)
    levels = [(0, 0), (0, 0.5), (0, 0.5), (-0.25, 0), (-0.25, 0), (1.5, 1.5), (-0.5, -0.5), (5.5, 5.5), (5.5, 5.5),
              (5.5, 5.5), (-0.75, -0.75), (-0.75, -0.75)]
    vhat, mask = _vhat(u + quant.MASK_THRESHOLD, _window(shift, below, above, len(u)), bits=bits)
    assert np.array_equal(mask, np.broadcast_to(u >= 0, mask.shape))
    for column, (low, high) in enumerate(np.float32(levels)):
        assert set(np.unique(vhat[:, column])) <= {low, high}, (u[column], np.unique(vhat[:, column]))
        assert (low == high) or len(np.unique(vhat[:, column])) == 2  # both happen


def test_the_draws_are_uniform_and_differ_by_key_row_and_channel():
    """2^20 draws: mean 1/2 and each sixteenth within 6 standard errors; neighbouring channels, rows and
    keys uncorrelated to 0.01."""
    draws = quant.uniform_ref(12345, 1 << 14, 64)
    assert draws.dtype == np.float32 and draws.min() >= 0 and draws.max() < 1
    n = draws.size
    assert abs(draws.mean() - 0.5) <= 6 * np.sqrt(1 / 12 / n)
    counts = np.bincount((draws * 16).astype(int).ravel(), minlength=16)
    assert np.all(np.abs(counts - n / 16) <= 6 * np.sqrt(n / 16))
    other = quant.uniform_ref(12346, 1 << 14, 64)
    for a, b in ((draws[:, 1:], draws[:, :-1]), (draws[1:], draws[:-1]), (draws, other)):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    assert quant.rounding_key(0, 1, 2) != quant.rounding_key(0, 2, 1) != quant.rounding_key(1, 1, 2)


def _net(rounding):
    net = tiny_resnet()
    return net.compile(pass_images=4, bits=2, rounding=rounding, seed=3)


def _steps(net, iterations, *, split=2):
    step = TrainStep(net, SGD(net, momentum=0.9), sub_batches=split)
    rng = np.random.default_rng(0)
    for it in range(iterations.stop):
        images = rng.standard_normal((4 * split, 8, 8, 3)).astype(np.float32)
        labels = rng.integers(0, 10, 4 * split)
        if it in iterations:
            step.run(device(images), labels, lr=0.05, iteration=it)


def test_a_resumed_run_draws_as_an_uninterrupted_one_and_the_draws_matter():
    """Steps 0-3 in one go, or 0-1, the state into a fresh net, then 2-3: the same weights bit for bit
    (the draws come from the seed, the iteration and the sub-batch, with no state). The nearest
    rounding's weights differ: the draws do reach the gradients."""
    whole = _net("stochastic")
    _steps(whole, range(4))
    first = _net("stochastic")
    _steps(first, range(2))
    resumed = _net("stochastic")
    resumed.load_state(first.state())
    _steps(resumed, range(2, 4))
    assert np.array_equal(host(resumed.params), host(whole.params))
    nearest = _net("nearest")
    _steps(nearest, range(4))
    assert not np.array_equal(host(nearest.params), host(whole.params))


def test_stochastic_rounding_takes_no_memory_and_only_k_bit_stores():
    assert _net("stochastic").arena.plan.total_bytes == _net("nearest").arena.plan.total_bytes
    for bits in ("exact", "naive"):
        with pytest.raises(ValueError, match="stochastic rounding codes a k-bit store"):
            tiny_resnet().compile(pass_images=4, bits=bits, rounding="stochastic")
    with pytest.raises(ValueError, match="rounding must be one of nearest, stochastic"):
        tiny_resnet().compile(pass_images=4, bits=4, rounding="up")
