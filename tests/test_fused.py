"""The kernels that fold a unit's small array operations into few launches, each against its NumPy reference, bit
for bit: the statistics' sums and their finish (mean, variance, the running statistics, the coefficients and the
windows), the backward's sums (with a~ restored in the same pass) and their finish, the rounding keys, the weight
and bias gradients' sums, the global average pool."""
import numpy as np
import pytest

from minibp import kernels, layers, quant
from minibp.layers import bn, conv_direct
from conftest import device, host

SHAPES = [(1, 8), (100, 24), (1000, 200), (333, 256)]  # 200, 256: a CPU thread's pieces of 128 channels


def _case(rows, C, seed=0, mean=0.5):
    rng = np.random.default_rng(seed + rows + C)
    x = (rng.standard_normal((rows, C)) * 2 + mean).astype(np.float32)
    gamma = (rng.standard_normal(C) + 0.8).astype(np.float32)  # some below GAMMA_MIN: the clamp
    beta = (rng.standard_normal(C) * 0.5).astype(np.float32)
    running = rng.standard_normal((2, C)).astype(np.float32) ** 2
    return x, gamma, beta, running


def _statistics(x, window, **residual):
    rows, C = x.shape
    stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
    part = layers.batchnorm_statistics(device(x), partial=device(np.zeros(2 * layers.reduction_chunks(rows) * C,
                                                                          np.float32)), window=window, **residual)
    return stats, part


@pytest.mark.parametrize("window", ["fixed", "range"])
@pytest.mark.parametrize("rows,C", SHAPES)
def test_statistics_are_the_reference_bit_for_bit(rows, C, window):
    x = _case(rows, C, mean=300.0)[0]
    _, part = _statistics(x, window)
    assert np.array_equal(host(part), layers.batchnorm_statistics_ref(x, window=window))


def test_statistics_add_a_residual_in_place_and_save_the_sum():
    """A residual block's schedule in the statistics' pass: x += residual, saved = x, then x's statistics; saved may
    be the residual buffer itself (a unit that adds one block's shortcut and starts the next block)."""
    rows, C = 300, 24
    x, residual = _case(rows, C)[0], _case(rows, C, seed=1)[0]
    x_dev, residual_dev = device(x.copy()), device(residual.copy())
    part = layers.batchnorm_statistics(x_dev, partial=device(np.zeros(2 * layers.reduction_chunks(rows) * C,
                                                                      np.float32)), window="range",
                                       residual=residual_dev, saved=residual_dev)
    assert np.array_equal(host(x_dev), x + residual) and np.array_equal(host(residual_dev), x + residual)
    assert np.array_equal(host(part), layers.batchnorm_statistics_ref(x + residual, window="range"))


@pytest.mark.parametrize("bits,window", [(0, "fixed"), (4, "fixed"), (4, "range"), (4, "block"), (2, "block"),
                                         (8, "range")])
@pytest.mark.parametrize("rows,C", SHAPES[1:] + [(9000, 8)])  # 36 block windows a channel
def test_the_finish_is_the_reference_bit_for_bit(rows, C, bits, window):
    """Training: mean, sigma, the clamped gamma, b, the running statistics' update (and their values kept), the
    windows; all as batchnorm_finish_ref computes them."""
    x, gamma, beta, running = _case(rows, C)
    stats, part = _statistics(x, window)
    S, offset = C + 5, 3  # the unit's channels within a net's running statistics
    run = np.zeros((2, S), np.float32)
    run[:, offset:offset + C] = running
    run_dev, before = device(run), device(np.full((2, S), np.nan, np.float32))
    count = quant.windows_per_channel(rows) if window == "block" else 1
    windows = device(np.zeros((count, 3, C), np.float32)) if bits else None
    layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, part=part, rows=rows, running=run_dev,
                            offset=offset, momentum=0.9, running_before=before, bits=bits, window=window,
                            windows=windows, stochastic=window == "block")
    want_stats, want_running, want_windows = layers.batchnorm_finish_ref(
        gamma, beta, host(part), rows=rows, eps=1e-5, running=running, momentum=0.9, bits=bits, window=window,
        stochastic=window == "block")
    assert np.array_equal(host(stats), want_stats)
    assert np.array_equal(host(run_dev)[:, offset:offset + C], want_running)
    assert np.array_equal(np.delete(host(run_dev), np.s_[offset:offset + C], axis=1), np.zeros((2, S - C)))
    assert np.array_equal(host(before)[:, offset:offset + C], running)
    if bits:
        assert np.array_equal(host(windows), want_windows)


def test_the_finish_defers_increments_and_an_evaluation_reads_the_running_statistics():
    rows, C = 100, 24
    x, gamma, beta, running = _case(rows, C)
    stats, part = _statistics(x, "fixed")
    run_dev, increments = device(running.copy()), device(np.zeros((2, C), np.float32))
    layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, part=part, rows=rows, running=run_dev,
                            increments=increments, momentum=0.9)
    assert np.array_equal(host(run_dev), running)  # left as it was
    want_stats, want_running, _ = layers.batchnorm_finish_ref(gamma, beta, host(part), rows=rows, eps=1e-5,
                                                              running=np.zeros((2, C), np.float32), momentum=0.9)
    assert np.array_equal(host(increments), want_running)  # the increments alone (0 * momentum + increment)
    layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, running=run_dev, bits=4,
                            windows=device(np.zeros((1, 3, C), np.float32)))
    got = host(stats)
    assert np.array_equal(got[0], running[0]) and np.array_equal(got[1], np.sqrt(running[1] + np.float32(1e-5)))
    with pytest.raises(ValueError, match="the range window is the batch's"):
        layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, running=run_dev, bits=4, window="range",
                                windows=device(np.zeros((1, 3, C), np.float32)))


@pytest.mark.parametrize("bits", [0, 4, 2])
def test_the_backward_sums_restore_a_in_the_same_pass_and_finish_in_order(bits):
    """batchnorm_relu_backward with restored: the a~ batchnorm_relu_restore writes, the same dx, and dbeta, dgamma
    the chunks' partial sums added in order onto what the gradients held."""
    rows, C = 1000, 24
    x, gamma, beta, _ = _case(rows, C)
    stats, part = _statistics(x, "block")
    store = dict(bits=bits, x_copy=device(np.zeros((rows, C), np.float32)) if not bits else None,
                 codes=device(np.zeros(rows * C * bits // 8, np.uint8)) if bits else None,
                 windows=device(np.zeros((quant.windows_per_channel(rows), 3, C), np.float32)) if bits else None)
    layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, part=part, rows=rows, bits=bits,
                            window="block", windows=store["windows"])
    layers.batchnorm_relu_forward(device(x), stats, device(beta), device(np.zeros((rows, C), np.float32)), **store)
    da = device(np.random.default_rng(1).standard_normal((rows, C)).astype(np.float32))
    restored = device(np.zeros((rows, C), np.float32))
    layers.batchnorm_relu_restore(stats, device(beta), restored, **store)
    results = []
    for fused in (False, True):
        a = device(np.zeros((rows, C), np.float32)) if fused else None
        dx, sums = device(np.zeros((rows, C), np.float32)), device(np.zeros((2, C), np.float32))
        dbeta, dgamma = device(np.ones(C, np.float32)), device(np.full(C, 2, np.float32))
        partial = device(np.zeros(2 * layers.reduction_chunks(rows) * C, np.float32))
        layers.batchnorm_relu_backward(da, stats, device(beta), dx, **store, dgamma=dgamma, dbeta=dbeta,
                                       partial=partial, sums=sums, restored=a)
        chunks = -(-rows // layers.ROWS_PER_CHUNK)
        want = np.add.reduce(host(partial)[: 2 * chunks * C].reshape(2, chunks, C), axis=1)  # in order
        assert np.array_equal(host(sums), want)
        assert np.array_equal(host(dbeta), np.float32(1) + want[0]) and np.array_equal(host(dgamma), 2 + want[1])
        results.append((host(dx), host(sums)))
        if fused:
            assert np.array_equal(host(a), host(restored))
    assert all(np.array_equal(u, v) for u, v in zip(*results))


def test_rounding_keys_are_the_references_and_the_draw_counts_on():
    keys, draw = device(np.zeros(7, np.int64)), device(np.array([41], np.int64))
    for expected_draw in (41, 42):
        layers.rounding_keys(keys, draw, seed=-3)
        assert host(keys).tolist() == [quant.rounding_key(-3, expected_draw, u) for u in range(7)]
    assert host(draw)[0] == 43


def test_bias_and_weight_gradient_sums_are_in_order():
    rng = np.random.default_rng(2)
    dy = rng.standard_normal((1000, 12)).astype(np.float32)
    dbias = device(np.ones(12, np.float32))
    kernels.load("conv.cu").bias_grad(rows=1000, C=12, accumulate=True, dy=device(dy), dbias=dbias, threads=12)
    assert np.array_equal(host(dbias), np.float32(1) + np.add.reduce(dy, axis=0))
    kernels.load("conv.cu").bias_grad(rows=1000, C=12, accumulate=False, dy=device(dy), dbias=dbias, threads=12)
    assert np.array_equal(host(dbias), np.float32(0) + np.add.reduce(dy, axis=0))
    partial = rng.standard_normal((5, 3 * 3 * 4, 6)).astype(np.float32)  # (chunks, kh*kw*Cin, Cout)
    dw = rng.standard_normal((6, 3, 3, 4)).astype(np.float32)
    got = device(dw.copy())
    kernels.load("conv_direct.cu").conv_weight_grad_finish(chunks=5, K=36, Cout=6, accumulate=True,
                                                           partial=device(partial), dw=got, threads=dw.size)
    assert np.array_equal(host(got), conv_direct.conv_weight_grad_finish_ref(partial, dw))
    assert np.array_equal(host(got), dw + partial.sum(axis=0).T.reshape(dw.shape))  # NumPy's order, too


def test_the_global_average_pool_is_numpys_mean():
    x = np.random.default_rng(3).standard_normal((3, 5, 7, 6)).astype(np.float32)
    pool, y = layers.GlobalAvgPool((5, 7, 6)), device(np.zeros((3, 1, 1, 6), np.float32))
    pool.forward(device(x), y)
    assert np.array_equal(host(y).reshape(3, 6), np.mean(x.reshape(3, 35, 6), axis=1))
    dx = device(np.zeros(x.shape, np.float32))
    pool.backward(None, y, dx)
    assert np.array_equal(host(dx), np.broadcast_to(host(y) * np.float32(1 / 35), x.shape))


def test_statistics_refuse_a_scratch_too_small_or_windows_of_another_size():
    x = _case(100, 8)[0]
    stats = device(np.zeros((layers.STATS_ROWS, 8), np.float32))
    with pytest.raises(ValueError, match="partial holds"):
        layers.batchnorm_statistics(device(x), partial=device(np.zeros(10, np.float32)))
    stats, part = _statistics(x, "block")
    with pytest.raises(ValueError, match="block window over 100 rows takes 1 block"):
        layers.batchnorm_finish(device(np.ones(8, np.float32)), device(np.zeros(8, np.float32)), stats, eps=1e-5,
                                part=part, rows=100, bits=4, window="block",
                                windows=device(np.zeros((2, 3, 8), np.float32)))
    assert bn.WINDOW_KIND == {None: 0, "fixed": 1, "range": 2, "block": 3}  # kernels/bn.cu's WindowKind
