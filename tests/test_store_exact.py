"""The training kernels' k-bit store, exactly: the codes layers.batchnorm_relu_forward writes, the a~ that
batchnorm_relu_restore reads back and the BN-ReLU backward from the codes, against minibp.quant's NumPy
reference of the store (window_ref, quantize_ref, dequantize_ref), at 8, 4 and 2 bits, through every
window (fixed, range and block; the edge data spans several blocks).

The data puts values on and next to every bin edge, far outside the window (|v| of 20 to 1000), and in
channels whose b = beta/gamma is very negative or very positive (+-50) or next to the boundaries where
the shift's clamp at 1 and cap at K-1 begin."""
import numpy as np
import pytest

from minibp import layers, quant
import quant_kernels
from conftest import device, host

BITS = [8, 4, 2]
KINDS = list(quant.WINDOWS)
RTOL, ATOL = 1e-5, 1e-6  # float32 rounding, scaled by the size of what is summed (see _assert_close)
FAR = [20.0, -20.0, 37.3, -64.0, 100.0, -100.0, 999.5, -1000.0]


def _channels(bits):
    """(gamma, beta) of each channel: b = beta/gamma exactly (gamma a power of two), except the last two."""
    K = 1 << bits
    cap = np.float32(-(K / 2 - 1) * 6 / K)  # b below this: shift reaches the cap K-1; -cap: the clamp at 1
    b = [0.0, 0.37, -0.81, 50.0, -50.0, cap, np.nextafter(cap, -np.inf), np.nextafter(cap, np.inf),
         cap - np.float32(6 / K), cap + np.float32(6 / K), -cap, np.nextafter(-cap, -np.inf),
         np.nextafter(-cap, np.inf), 2.5, -7.0, 1e-30, 3.0, -3.0]
    gamma = [1.0, 0.5, 2.0, 4.0, 0.25, 1.0, 2.0, 0.5, 1.0, 8.0, 1.0, 0.5, 2.0, 1.0, 1.0, 1.0, 1.0, 0.5]
    b = np.array(b, np.float32)
    gamma = np.array(gamma, np.float32)
    beta = list(b * gamma) + [-5e-7, 0.9]
    gamma = list(gamma) + [1e-9, 1.7]  # 1e-9 is clamped to 1e-8: b = -50
    return np.array(gamma, np.float32), np.array(beta, np.float32)


def _edge_case(bits, rng):
    """x (M, C) and the mean and variance to normalise it with, for _channels' channels: every channel
    has v = (x - mean)/sigma + b on and next to each bin edge around its window, 1e-6, 0, far values and
    random ones. sigma = sqrt(var) is a power of two."""
    K = 1 << bits
    gamma, beta = _channels(bits)
    C = len(gamma)
    b = (beta / np.maximum(gamma, np.float32(layers.GAMMA_MIN))).astype(np.float32)
    shift = quant.window_ref(b, bits=bits)[0]
    mean = (rng.standard_normal(C) * 3).astype(np.float32)
    mean[::2] = 0  # v = x/sigma + b: exactly on an edge wherever float32 lets x/sigma + b be one
    sigma = np.float32(2.0) ** rng.integers(-2, 3, C)
    columns = []
    for c in range(C):
        edges = (np.arange(-2, K + 3, dtype=np.float32) - shift[c]) * np.float32(6 / K) + quant.MASK_THRESHOLD
        targets = np.concatenate([edges, [0.0, 1e-6, -1e-6], FAR, rng.standard_normal(40) * 3 + b[c]])
        x0 = ((targets.astype(np.float64) - b[c]) * sigma[c] + mean[c]).astype(np.float32)
        down, up = [x0], [x0]
        for _ in range(2):  # and the two float32 neighbours each side, so that some land exactly on an edge
            down.append(np.nextafter(down[-1], np.float32(-np.inf)))
            up.append(np.nextafter(up[-1], np.float32(np.inf)))
        columns.append(np.concatenate(down + up[1:]))
    x = np.ascontiguousarray(np.stack(columns, axis=1))
    return x, gamma, beta, mean, sigma * sigma


def _training_case(bits, rng):
    """Activations as a unit sees them: (N, H, W, C), its statistics taken from x (297 rows: two blocks)."""
    x = (rng.standard_normal((3, 11, 9, 16)) * 2 + 0.5).astype(np.float32)
    gamma = (np.abs(rng.standard_normal(16)) + 0.2).astype(np.float32)
    beta = (rng.standard_normal(16) * 2).astype(np.float32)
    return x, gamma, beta, None, None


def _one_sign_case(bits, rng):
    """Channels whose v has one sign over the batch (b of +-8 to 30): the range window leaves zero outside
    its codes there, the mask all ones or all zeros."""
    x = rng.standard_normal((2, 4, 4, 8)).astype(np.float32)
    gamma = np.ones(8, np.float32)
    beta = np.array([8, -8, 12, -12, 30, -30, 9.5, -9.5], np.float32)
    return x, gamma, beta, None, None


def _extremes(x, window, *, per=None):
    """The least and largest x per channel, (2, n, C): each run of `per` rows' (the statistics pass hands over
    each chunk's of layers.STATS_CHUNK rows), else the batch's (range window) or each block's (block window)."""
    rows = x.reshape(-1, x.shape[-1])
    starts = np.arange(0, len(rows), per or (quant.WINDOW_ROWS if window == "block" else len(rows)))
    return np.stack([np.minimum.reduceat(rows, starts), np.maximum.reduceat(rows, starts)])


def _store(x, gamma, beta, *, bits, mean=None, var=None, naive=False, window="fixed", rounding_key=None):
    """(stats, a, codes, windows) as the training forward writes them: with x's own statistics and
    eps = 1e-5, or with the given mean and var and eps = 0 (sigma = sqrt(var) exactly). windows: the block
    window's (blocks, 3, C), else the one window per channel as (1, 3, C)."""
    C = x.shape[-1]
    rows = x.size // C
    stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
    windows = device(np.zeros((quant.windows_per_channel(rows) if window == "block" else 1, 3, C), np.float32))
    stochastic = rounding_key is not None
    if mean is None:
        partial = device(np.zeros(2 * layers.reduction_chunks(rows) * C, np.float32))
        part = layers.batchnorm_statistics(device(x), partial=partial, window=window)
        if window != "fixed":
            assert np.array_equal(host(part[3:]), _extremes(x, window, per=layers.STATS_CHUNK))
        layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, part=part, rows=rows, bits=bits,
                                window=window, windows=windows, stochastic=stochastic)
    else:  # the given statistics, as an evaluation reads the running ones; the windows from the batch's extremes
        running = device(np.stack([mean, var]).astype(np.float32))
        fixed = window == "fixed"
        layers.batchnorm_finish(device(gamma), device(beta), stats, eps=0.0, running=running, bits=bits if fixed else 0,
                                windows=windows if fixed else None, stochastic=stochastic)
        if not fixed:
            layers.code_windows(stats, device(_extremes(x, window, per=layers.STATS_CHUNK)), windows, bits=bits,
                                window=window, stochastic=stochastic)
    a = device(np.zeros(x.shape, np.float32))
    codes = device(np.zeros(x.size * bits // 8, np.uint8))
    key = None if rounding_key is None else device(np.array([rounding_key], np.int64))
    layers.batchnorm_relu_forward(device(x), stats, device(beta), a, bits=bits, naive=naive, codes=codes,
                                  windows=windows, stochastic=stochastic, rounding_key=key)
    return stats, a, codes, windows


def _v(x, stats):
    """v = xhat + b in the forward kernel's float32 arithmetic."""
    mean, sigma, _, b = stats[:4]
    return ((x - mean) / sigma + b).astype(np.float32)


def _window(x, s, bits, window, *, stochastic=False):
    """The reference's window for the unit's statistics s: of b, or of v's range (v of x's extremes):
    (3, C), or (3, blocks, C) for the block window."""
    lo, hi = _extremes(x, window)
    table = quant.window_ref(s[3], bits=bits, kind=window, lo=_v(lo, s), hi=_v(hi, s), stochastic=stochastic)
    return table[:, 0] if window == "range" else table


def _row_windows(s, windows, rows):
    """The window the kernels coded each row through: the one window (3, C), or the block windows per row."""
    w = host(windows)
    return w[0] if w.shape[0] == 1 else quant.row_windows_ref(w, rows)


def _cases(bits):
    rng = np.random.default_rng(bits)
    return [_edge_case(bits, rng), _training_case(bits, rng), _one_sign_case(bits, rng)]


@pytest.mark.parametrize("window", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_forward_codes_are_quantize_ref_byte_for_byte(bits, window):
    for x, gamma, beta, mean, var in _cases(bits):
        stats, _, codes, windows = _store(x, gamma, beta, bits=bits, mean=mean, var=var, window=window)
        s = host(stats)
        rows = x.size // x.shape[-1]
        assert np.array_equal(s[3], (beta / np.maximum(gamma, np.float32(layers.GAMMA_MIN))).astype(np.float32))
        got = host(windows)[0] if window != "block" else np.moveaxis(host(windows), 1, 0)
        assert np.array_equal(got, _window(x, s, bits, window))
        v = _v(x, s).reshape(rows, -1)
        assert np.array_equal(host(codes), quant.quantize_ref(v, _row_windows(s, windows, rows), bits=bits))
        if window != "block":  # quant_kernels.py's kernels (a window per channel) write the same bytes from v
            assert np.array_equal(host(quant_kernels.quantize(device(v), windows[0], bits=bits)), host(codes))


@pytest.mark.parametrize("key", [12345, -2**63, 2**63 - 1])
@pytest.mark.parametrize("window", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_stochastic_codes_are_quantize_ref_byte_for_byte_and_keep_the_mask(bits, window, key):
    """Stochastic rounding: the kernel's windows and codes are the reference's for the key's draws
    (uniform_ref), on the edge data too, and every code keeps its value's side of zero: the mask is exact."""
    for x, gamma, beta, mean, var in _cases(bits):
        stats, _, codes, windows = _store(x, gamma, beta, bits=bits, mean=mean, var=var, window=window,
                                          rounding_key=key)
        s, rows, C = host(stats), x.size // x.shape[-1], x.shape[-1]
        got = host(windows)[0] if window != "block" else np.moveaxis(host(windows), 1, 0)
        assert np.array_equal(got, _window(x, s, bits, window, stochastic=True))
        v = _v(x, s).reshape(rows, -1)
        row_windows = _row_windows(s, windows, rows)
        uniform = quant.uniform_ref(key, rows, C)
        assert np.array_equal(host(codes), quant.quantize_ref(v, row_windows, bits=bits, uniform=uniform))
        q = quant.unpack_ref(host(codes), bits=bits, shape=(rows, C))
        shift = np.broadcast_to(row_windows[0], (rows, C))
        inside = (shift >= 1) & (shift <= (1 << bits) - 1)  # zero is an edge inside the codes
        assert np.array_equal((q >= shift)[inside], (v >= quant.MASK_THRESHOLD)[inside])


@pytest.mark.parametrize("bits", BITS)
def test_edge_data_reaches_every_hard_case(bits):
    """The edge case is what it claims: values exactly on edges, far values, shifts at both bounds."""
    K = 1 << bits
    x, gamma, beta, mean, var = _edge_case(bits, np.random.default_rng(bits))
    stats, _, _, windows = _store(x, gamma, beta, bits=bits, mean=mean, var=var)  # the fixed window
    s, (shift, below, _) = host(stats), host(windows)[0]
    v = _v(x, s)
    edges = (np.arange(K + 1, dtype=np.float32)[:, None] - shift) * below + quant.MASK_THRESHOLD
    on_edge = [np.isin(edges[:, c], v[:, c]) for c in range(v.shape[1])]
    assert on_edge[0].all()  # b = 0: every edge, the zero edge (v = 1e-6) among them
    assert np.mean(on_edge) > 0.5  # and most edges of the other channels
    assert (np.abs(v) >= 20).any(axis=0).all() and (np.abs(v) >= 999).any()
    assert {1, K - 1} <= set(shift.tolist()) and s[3].min() <= -50 and s[3].max() >= 50


@pytest.mark.parametrize("key", [None, 12345])  # rounding to the nearest level, or stochastic rounding's levels
@pytest.mark.parametrize("window", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_masks_are_exact_and_restore_equals_reference(bits, window, key):
    stochastic = key is not None
    for x, gamma, beta, mean, var in _cases(bits):
        stats, _, codes, windows = _store(x, gamma, beta, bits=bits, mean=mean, var=var, window=window,
                                          rounding_key=key)
        s = host(stats)
        rows = x.size // x.shape[-1]
        xhat, a, mask = (t.reshape(x.shape) for t in quant.dequantize_ref(
            host(codes), _row_windows(s, windows, rows), s[3], s[2], bits=bits, shape=(rows, x.shape[-1]),
            stochastic=stochastic))
        # the mask is the ReLU's sign of v for every b, very negative ones included (shift capped at K-1)
        assert np.array_equal(mask.astype(bool), _v(x, s) >= quant.MASK_THRESHOLD)
        restored = device(np.full(x.shape, np.nan, np.float32))
        layers.batchnorm_relu_restore(stats, device(beta), restored, bits=bits, codes=codes, windows=windows,
                                      stochastic=stochastic)
        assert np.array_equal(host(restored), a)
        positive = host(restored) > 0  # where the mask is; stochastic rounding's level zero above zero aside
        assert np.array_equal(positive, mask.astype(bool)) if not stochastic else not (positive & ~mask.astype(bool)).any()
        if stochastic:  # naive feeds its codes forward, which only rounding to the nearest level does
            continue
        # the naive forward feeds the same a~ forward
        _, a_naive, _, _ = _store(x, gamma, beta, bits=bits, mean=mean, var=var, naive=True, window=window)
        assert np.array_equal(host(a_naive), a)
        if window != "block":  # and quant_kernels.py's kernels decode the codes the same way
            decoded = quant_kernels.dequantize(codes, windows[0], stats[3], stats[2], bits=bits, shape=x.shape)
            for name, got, want in zip(("xhat", "a", "mask"), decoded, (xhat, a, mask)):
                assert np.array_equal(host(got), want), name


def _assert_close(got, want, scale, name):
    """|got - want| <= RTOL * scale + ATOL elementwise: scale bounds what float32 rounding can reach."""
    error = np.abs(np.asarray(got, np.float64) - want)
    bound = RTOL * scale + ATOL
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), f"{name}: error {error[worst]:.3g} > {bound[worst]:.3g} at {worst}"


@pytest.mark.parametrize("key", [None, 12345])  # rounding to the nearest level, or stochastic rounding's levels
@pytest.mark.parametrize("window", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_backward_from_codes_equals_reference_on_the_dequantized_store(bits, window, key):
    """dy = da*mask, dbeta = sum dy, dgamma = sum dy*xhat~, dx = gamma/sigma*(dy - dbeta/M - xhat~*dgamma/M)
    + residual_grad, with xhat~ and the mask of the reference's dequantize of the forward's codes."""
    rng = np.random.default_rng(100 + bits)
    for x, gamma, beta, mean, var in _cases(bits):
        stats, _, codes, windows = _store(x, gamma, beta, bits=bits, mean=mean, var=var, window=window,
                                          rounding_key=key)
        s = host(stats)
        C = x.shape[-1]
        M = x.size // C
        da = rng.standard_normal(x.shape).astype(np.float32)
        da.reshape(M, C)[::5] = 0
        residual = rng.standard_normal(x.shape).astype(np.float32)
        dgamma0, dbeta0 = rng.standard_normal((2, C)).astype(np.float32)
        dx, dgamma, dbeta = (device(np.full(x.shape, np.nan, np.float32)), device(dgamma0.copy()),
                             device(dbeta0.copy()))
        partial = device(np.zeros(2 * layers.reduction_chunks(M) * C, np.float32))
        sums = device(np.zeros((2, C), np.float32))
        layers.batchnorm_relu_backward(device(da), stats, device(beta), dx, bits=bits, codes=codes, windows=windows,
                                       stochastic=key is not None, dgamma=dgamma, dbeta=dbeta, partial=partial, sums=sums,
                                       residual_grad=device(residual))

        xhat, _, mask = (t.astype(np.float64).reshape(x.shape) for t in quant.dequantize_ref(
            host(codes), _row_windows(s, windows, M), s[3], s[2], bits=bits, shape=(M, C), stochastic=key is not None))
        sigma, g = s[1].astype(np.float64), s[2].astype(np.float64)
        want_dx, want_dgamma, want_dbeta = layers.batchnorm_relu_backward_ref(da.astype(np.float64), xhat, mask,
                                                                             g, sigma)
        axes = tuple(range(x.ndim - 1))
        dy = np.abs(da * mask)
        sum_dy, sum_dy_xhat = dy.sum(axis=axes), (dy * np.abs(xhat)).sum(axis=axes)
        _assert_close(host(sums)[0], want_dbeta, sum_dy, "this batch's dbeta")
        _assert_close(host(sums)[1], want_dgamma, sum_dy_xhat, "this batch's dgamma")
        _assert_close(host(dbeta), dbeta0 + want_dbeta, sum_dy + np.abs(dbeta0), "dbeta")
        _assert_close(host(dgamma), dgamma0 + want_dgamma, sum_dy_xhat + np.abs(dgamma0), "dgamma")
        dx_scale = g / sigma * (dy + sum_dy / M + np.abs(xhat) * sum_dy_xhat / M) + np.abs(residual)
        _assert_close(host(dx), want_dx + residual, dx_scale, "dx")
