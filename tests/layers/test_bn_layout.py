"""The batch-norm kernels' launch layout (kernels/bn.cu, chosen by layers.launch): blocks walk chunks of rows,
the threads of a block walk a row's channels (exact mode) or code bytes (k bits).

Any launch shape gives the same bytes: each element is computed by the same arithmetic whichever thread
computes it, and each partial sum is one chunk's rows added in order by one thread, so only the chunk
length (rows_per_chunk of a reduction) can change a float result, by rounding. The GPU's launch shapes run
here through the CPU shim (a block's threads one after another), so they are checked on every machine."""
import numpy as np
import pytest

from minibp import backend, kernels, layers, quant
from conftest import device, host

BITS = [0, 8, 4, 2]
SHAPES = [(rows, C) for rows in (1, 5, 1000) for C in (8, 24, 200, 256)]  # 200: a CPU row in pieces of 128 and 72 channels
# (grid, block): one thread a block (the CPU's), threads sharing a row's groups, 2-D blocks with row lanes
LAUNCHES = [((g,), b) for g in (1, 3, 5000) for b in ((1,), (7,), (32,), (256,), (8, 4), (3, 5))]
ROWS_PER_CHUNK = (1, 3, 1000)  # of the elementwise kernels: any split of the rows


def _case(rows, C, bits, *, window="fixed", stochastic=False):
    """A unit's arrays: x, its stats (the default launch's), the windows of its codes (through `window`: the
    block window's, else one window per channel; none in exact mode) and window_rows, beta, da and a residual
    gradient."""
    rng = np.random.default_rng(7 * C + rows)
    x = (rng.standard_normal((rows, C)) * 2 + 0.5).astype(np.float32)
    gamma = (np.abs(rng.standard_normal(C)) + 0.3).astype(np.float32)
    beta = (rng.standard_normal(C) * 0.8).astype(np.float32)
    stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
    partial = device(np.zeros(2 * layers.reduction_chunks(rows) * C, np.float32))
    part = layers.batchnorm_statistics(device(x), partial=partial, window=window)
    count = quant.windows_per_channel(rows) if window == "block" else 1
    windows = device(np.zeros((count, 3, C), np.float32)) if bits else None
    layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, part=part, rows=rows, bits=bits,
                            window=window, windows=windows, stochastic=stochastic)
    da, residual = rng.standard_normal((2, rows, C)).astype(np.float32)
    store = layers.bn.store_args(stats, rows, windows=windows)
    return dict(x=device(x), stats=stats, beta=device(beta), da=device(da), residual=device(residual),
                windows=store["windows"], window_rows=store["window_rows"])


def _empty(rows, C, bits):
    """Output buffers, filled with NaN / 0xAB so that anything a launch leaves unwritten shows."""
    return dict(a=device(np.full((rows, C), np.nan, np.float32)),
                x_copy=device(np.full((rows, C), np.nan, np.float32)) if bits == 0 else None,
                codes=device(np.full(rows * C * bits // 8, 0xAB, np.uint8)) if bits else None,
                dx=device(np.full((rows, C), np.nan, np.float32)),
                partial=device(np.full(5 * rows * C, np.nan, np.float32)))  # room for 5 values of chunks of one row


def _run(arrays, rows, C, bits, *, launch, naive=False, reduction_rows=None, rounding_key=None):
    """Every BN kernel once with one launch shape: {name: host array}. launch is dict(grid, block, and for
    the elementwise kernels rows_per_chunk); reductions sum chunks of reduction_rows (default: layers')."""
    module = kernels.load("bn.cu", np.float32)
    out = _empty(rows, C, bits)
    shape = dict(grid=launch["grid"], block=launch["block"])
    elementwise = dict(rows=rows, C=C, rows_per_chunk=launch["rows_per_chunk"], bits=bits)
    store = dict(x_copy=out["x_copy"], codes=out["codes"], stats=arrays["stats"], beta=arrays["beta"],
                 windows=arrays["windows"], window_rows=arrays["window_rows"], stochastic=rounding_key is not None)
    key = None if rounding_key is None else device(np.array([rounding_key], np.int64))
    module.batchnorm_relu_forward(**elementwise, naive=naive, rounding_key=key, x=arrays["x"], a=out["a"], **store,
                                  **shape)
    result = {"a": host(out["a"]).copy(), "store": host(out["codes"] if bits else out["x_copy"]).copy()}
    module.batchnorm_relu_restore(**elementwise, **store, a=out["a"], **shape)
    result["restored"] = host(out["a"]).copy()
    per_chunk = reduction_rows or layers.ROWS_PER_CHUNK
    chunks = -(-rows // per_chunk)
    part = out["partial"][: 2 * chunks * C]
    module.batchnorm_relu_backward_sums(rows=rows, C=C, rows_per_chunk=per_chunk, bits=bits, da=arrays["da"],
                                        partial=part, a=None, **store, **shape)
    result["backward_partial"] = host(part).copy()
    sums, gradients = device(np.zeros((2, C), np.float32)), device(np.zeros((2, C), np.float32))
    module.batchnorm_backward_finish(C=C, chunks=chunks, accumulate=True, partial=part, sums=sums, dbeta=gradients[0],
                                     dgamma=gradients[1], threads=C)
    result["sums"] = host(sums).copy()
    module.batchnorm_relu_backward_dx(**elementwise, da=arrays["da"], sums=sums, inv_count=1.0 / rows,
                                      residual_grad=arrays["residual"], shortcut_grad=None, dx=out["dx"], **store,
                                      **shape)
    result["dx"] = host(out["dx"]).copy()
    per_chunk = reduction_rows or layers.STATS_CHUNK
    chunks = -(-rows // per_chunk)
    part = out["partial"][: 5 * chunks * C]
    module.batchnorm_statistics(rows=rows, C=C, rows_per_chunk=per_chunk, extremes=True, x=arrays["x"], residual=None,
                                saved=None, partial=part, **shape)
    result["statistics_partial"] = host(part).copy()
    part = host(part).reshape(5, chunks, C)
    result["moments"] = _combined(part, rows, per_chunk)
    result["extremes"] = np.stack([part[3].min(axis=0), part[4].max(axis=0)])
    return result


def _combined(part, rows, per_chunk):
    """(mean, variance) of the statistics' chunks (sums about each chunk's shift), combined in float64 as
    batchnorm_finish combines them."""
    n = np.minimum(rows - np.arange(part.shape[1]) * per_chunk, per_chunk)[:, None]
    s1, s2, shift = part[:3].astype(np.float64)
    mean = (s1 + n * shift).sum(axis=0) / rows
    return np.stack([mean, (s2 + 2 * (shift - mean) * s1 + n * (shift - mean) ** 2).sum(axis=0) / rows])


def _gpu_launch(monkeypatch, rows, C, *, bits, rows_per_chunk=None):
    """The launch shape layers would choose on a GPU (only the choice: the kernels still run here)."""
    with monkeypatch.context() as m:
        m.setattr(backend, "device", "gpu")
        return layers.launch(rows, C, bits=bits, rows_per_chunk=rows_per_chunk)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("rows,C", SHAPES)
def test_every_launch_shape_gives_the_same_bytes(bits, rows, C):
    arrays = _case(rows, C, bits)
    want = _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits))
    assert not any(np.isnan(v).any() for k, v in want.items() if k != "store"), "a launch left outputs unwritten"
    for grid, block in LAUNCHES:
        for per_chunk in ROWS_PER_CHUNK:
            got = _run(arrays, rows, C, bits, launch=dict(grid=grid, block=block, rows_per_chunk=per_chunk))
            for name in want:
                assert np.array_equal(got[name], want[name]), (name, grid, block, per_chunk)


@pytest.mark.parametrize("bits", [8, 4, 2])
def test_the_block_window_gives_the_same_bytes_for_every_launch_shape(bits):
    """Rows read their block's window whatever lane or chunk holds them: 1000 rows, four blocks."""
    rows, C = 1000, 24
    arrays = _case(rows, C, bits, window="block")
    assert arrays["windows"].shape == (4, 3, C) and arrays["window_rows"] == quant.WINDOW_ROWS
    want = _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits))
    for grid, block in LAUNCHES:
        for per_chunk in ROWS_PER_CHUNK:
            got = _run(arrays, rows, C, bits, launch=dict(grid=grid, block=block, rows_per_chunk=per_chunk))
            for name in want:
                assert np.array_equal(got[name], want[name]), (name, grid, block, per_chunk)


@pytest.mark.parametrize("C", [24, 200])  # the CPU's wide rows: four rows of 24 channels; pieces of 128 and 72
@pytest.mark.parametrize("window", ["fixed", "block"])
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_stochastic_codes_are_the_same_for_every_launch_shape(bits, window, C):
    """Each element's draw comes from its row and channel, whichever lane, chunk or thread codes it, and the
    stochastic levels read back alike (the GPU's launch shapes run through the shim here): 1000 rows, four
    block windows."""
    rows = 1000
    arrays = _case(rows, C, bits, window=window, stochastic=True)
    want = _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits), rounding_key=-77)
    assert not np.array_equal(want["store"], _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits))["store"])
    for grid, block in LAUNCHES:
        for per_chunk in ROWS_PER_CHUNK:
            got = _run(arrays, rows, C, bits, launch=dict(grid=grid, block=block, rows_per_chunk=per_chunk),
                       rounding_key=-77)
            for name in want:  # the codes, and what every kernel reads back from them
                assert np.array_equal(got[name], want[name]), (name, grid, block, per_chunk)


@pytest.mark.parametrize("bits", [4, 2])
def test_the_naive_forward_is_the_same_for_every_launch_shape(bits):
    rows, C = 5, 24
    arrays = _case(rows, C, bits)
    want = _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits), naive=True)
    assert np.array_equal(want["a"], want["restored"])  # a~ went forward
    for grid, block in LAUNCHES:
        got = _run(arrays, rows, C, bits, launch=dict(grid=grid, block=block, rows_per_chunk=2), naive=True)
        assert np.array_equal(got["a"], want["a"]) and np.array_equal(got["store"], want["store"]), (grid, block)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_nan_goes_forward_in_naive_mode_and_only_where_it_is(bits):
    """The naive ablation feeds a~ forward, but a NaN stays NaN (a diverged net shows in its loss); the other
    channels of its row still get a~, whichever thread holds them."""
    rows, C = 5, 24
    arrays = _case(rows, C, bits)
    x = host(arrays["x"]).copy()
    x[2, 5] = np.nan
    arrays["x"] = device(x)
    for launch in (layers.launch(rows, C, bits=bits), dict(grid=(2,), block=(4, 2), rows_per_chunk=1)):
        got = _run(arrays, rows, C, bits, launch=launch, naive=True)
        nan = np.isnan(got["a"])
        assert nan[2, 5] and nan.sum() == 1
        assert np.array_equal(got["a"][~nan], got["restored"][~nan])


@pytest.mark.parametrize("bits,window", [(0, "fixed")] + [(b, w) for b in BITS if b for w in quant.WINDOWS])
@pytest.mark.parametrize("rows,C", [(1, 8), (1000, 24), (5, 256)])
def test_the_gpu_launch_shape_gives_the_same_bytes(monkeypatch, bits, rows, C, window):
    """layers.launch's GPU shape: a row's groups across threadIdx.x (a power of two, adjacent threads on
    adjacent addresses), row lanes across threadIdx.y, 256 threads a block; run here through the shim.
    Exact mode (bits 0) codes nothing, so it runs once; the k-bit stores through every window (the block
    window's 1000 rows in four blocks, the last one short)."""
    arrays = _case(rows, C, bits, window=window)
    want = _run(arrays, rows, C, bits, launch=layers.launch(rows, C, bits=bits))
    launch = _gpu_launch(monkeypatch, rows, C, bits=bits)
    groups = C * bits // 8 if bits else C
    x, y = launch["block"]
    assert x * y == layers.GPU_BLOCK and x & (x - 1) == 0 and min(groups, layers.GPU_BLOCK) <= x < 2 * groups
    assert launch["grid"][0] <= layers.GPU_MAX_BLOCKS and launch["rows_per_chunk"] == 1
    reduction = _gpu_launch(monkeypatch, rows, C, bits=bits, rows_per_chunk=layers.ROWS_PER_CHUNK)
    assert reduction["block"] == launch["block"] and reduction["rows_per_chunk"] == layers.ROWS_PER_CHUNK
    got = _run(arrays, rows, C, bits, launch=launch)
    for name in want:
        assert np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("bits", [0, 4])
def test_other_chunkings_of_a_reduction_differ_only_by_rounding(bits):
    """Chunks of 1, 7 or all 1000 rows: each chunk is a float32 sum in row order, so the totals differ from
    float64's by rounding, at most about (terms a chunk adds) * 6e-8 of the sum of |terms| (1000 * 6e-8 here);
    1e-5 of that sum holds it with room and still catches a term counted twice or left out."""
    rows, C = 1000, 24
    arrays = _case(rows, C, bits)
    launch = layers.launch(rows, C, bits=bits)
    x, stats = host(arrays["x"]).astype(np.float64), host(arrays["stats"]).astype(np.float64)
    default = _run(arrays, rows, C, bits, launch=launch)
    if bits:  # xhat~ and the mask as the backward pass reads them from the codes
        xhat, _, mask = quant.dequantize_ref(default["store"], host(arrays["windows"])[0], stats[3], stats[2], bits=bits,
                                             shape=(rows, C))
    else:
        xhat = (x - stats[0]) / stats[1]
        mask = default["restored"] > 0
    dy = host(arrays["da"]).astype(np.float64) * mask
    sums = (dy, dy * xhat)
    for per_chunk in (1, 7, 1000):
        got = _run(arrays, rows, C, bits, launch=launch, reduction_rows=per_chunk)
        assert np.array_equal(got["extremes"], np.stack([x.min(axis=0), x.max(axis=0)]))  # exact in any chunking
        np.testing.assert_allclose(got["moments"], [x.mean(axis=0), x.var(axis=0)], rtol=1e-5, atol=1e-6)
        for i, term in enumerate(sums):
            error = np.abs(got["sums"][i] - term.sum(axis=0))
            assert np.all(error <= 1e-5 * np.abs(term).sum(axis=0)), (i, per_chunk)


@pytest.mark.parametrize("mean,outliers", [(1000.0, False), (1e4, False), (-3000.0, False), (1000.0, True)])
def test_one_pass_statistics_keep_the_digits_of_a_large_mean(mean, outliers):
    """The one-pass variance sums (x - s) and (x - s)^2 with a shift s near the mean, so a mean far from zero
    costs no digits: the mean within an ulp of float32 at that size, the variance within 1e-5 of float64's.
    Outliers: the first rows (one image's pixels) 11 standard deviations out do not move the shift far."""
    rows, C = 4096, 24
    x = (np.random.default_rng(3).standard_normal((rows, C)) + mean).astype(np.float32)
    if outliers:
        x[:64] += 11
    stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
    part = layers.batchnorm_statistics(device(x), partial=device(np.zeros(layers.reduction_chunks(rows) * C,
                                                                                 np.float32)))
    layers.batchnorm_finish(device(np.ones(C, np.float32)), device(np.zeros(C, np.float32)), stats, eps=0.0,
                            part=part, rows=rows)
    got, x = host(stats), x.astype(np.float64)
    assert np.all(np.abs(got[0] - x.mean(axis=0)) <= np.spacing(np.float32(abs(mean))))
    np.testing.assert_allclose(got[1] ** 2, x.var(axis=0), rtol=1e-5, atol=0)  # (stats[1] is sigma: eps 0)


def test_a_partial_scratch_too_small_is_refused():
    """A kernel would write past its end: the call is refused first, naming the scratch."""
    rows, C = 100, 8
    arrays = _case(rows, C, 0)
    with pytest.raises(ValueError, match="partial holds"):  # 3 values of 2 chunks of 64 rows
        layers.batchnorm_statistics(arrays["x"], partial=device(np.zeros(3 * 2 * C - 1, np.float32)))
    zeros = [device(np.zeros(shape, np.float32)) for shape in ((rows, C), C, C, (2, C))]
    with pytest.raises(ValueError, match="partial holds"):  # 2 values of 7 chunks of 16 rows
        layers.batchnorm_relu_backward(arrays["da"], arrays["stats"], arrays["beta"], zeros[0], bits=0,
                                       x_copy=arrays["x"], dgamma=zeros[1], dbeta=zeros[2],
                                       partial=device(np.zeros(2 * 7 * C - 1, np.float32)), sums=zeros[3])


@pytest.mark.parametrize("C", [1, 7, 16, 40, 300])
@pytest.mark.parametrize("accumulate", [True, False])
def test_the_backward_finish_adds_each_channel_in_order_on_every_launch_shape(C, accumulate):
    """batchnorm_backward_finish's sums are each channel's partial sums added chunk after chunk, in float32: the
    same bytes whether the CPU's one-thread blocks share pieces of FINISH_PIECE channels (any number of blocks) or a
    thread sums a channel (layers.finish_launch's GPU shape, and any other block)."""
    chunks = 37
    rng = np.random.default_rng(C)
    part = rng.standard_normal((2, chunks, C)).astype(np.float32)
    before = rng.standard_normal((2, C)).astype(np.float32)
    sums = np.zeros((2, C), np.float32)
    for k in range(chunks):  # in order: a float32 add a chunk
        sums = sums + part[:, k]
    gradients = (before if accumulate else np.zeros_like(before)) + sums
    module = kernels.load("bn.cu", np.float32)
    for shape in [dict(grid=(g,), block=(1,)) for g in (1, 2, 3, 64)] + [layers.finish_launch(C), dict(threads=C),
                                                                        dict(grid=(2,), block=(32,))]:
        got_sums, got = device(np.full((2, C), np.nan, np.float32)), device(before.copy())
        module.batchnorm_backward_finish(C=C, chunks=chunks, accumulate=accumulate, partial=device(part),
                                         sums=got_sums, dbeta=got[0], dgamma=got[1], **shape)
        assert np.array_equal(host(got_sums), sums) and np.array_equal(host(got), gradients), shape


@pytest.mark.parametrize("C", [7, 40, 300])
def test_the_statistics_finish_gives_the_same_bytes_on_every_launch_shape(monkeypatch, C):
    """batchnorm_finish over channels (for_finish_channels): the CPU's pieces on any number of one-thread blocks, or
    a thread a channel, give the same statistics, running statistics (training and evaluation) and values kept."""
    rows = 1000
    x = device(np.random.default_rng(C).standard_normal((rows, C)).astype(np.float32) * 3 + 1)
    part = layers.batchnorm_statistics(x, partial=device(np.zeros(layers.reduction_chunks(rows) * C, np.float32)))
    gamma, beta = device(np.linspace(0.5, 2, C).astype(np.float32)), device(np.linspace(-1, 1, C).astype(np.float32))
    results = []
    for shape in [dict(grid=(g,), block=(1,)) for g in (1, 2, 64)] + [dict(threads=C), dict(grid=(2,), block=(32,))]:
        monkeypatch.setattr(layers.bn, "finish_launch", lambda C, shape=shape: shape)
        stats, running = device(np.zeros((layers.STATS_ROWS, C), np.float32)), device(np.ones((2, C), np.float32))
        before = device(np.zeros((2, C), np.float32))
        layers.batchnorm_finish(gamma, beta, stats, eps=1e-5, part=part, rows=rows, running=running,
                                running_before=before)
        evaluation = device(np.zeros((layers.STATS_ROWS, C), np.float32))
        layers.batchnorm_finish(gamma, beta, evaluation, eps=1e-5, running=running)
        results.append([host(a).copy() for a in (stats, running, before, evaluation)])
    for got in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(got, results[0]))
