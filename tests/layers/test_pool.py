"""The pooling kernels' launch layout (kernels/pool.cu, shape chosen by layers.launch): blocks walk chunks of
pixels, the threads of a block walk a pixel's channels, a one-thread block (the CPU's) a run of channels at once.

Any launch shape gives the same bytes, and those are the NumPy references' exactly: each value is computed
by the same arithmetic in the same order (taps and windows in scan order) whichever thread computes it. The
GPU's launch shapes run here through the CPU shim, so they are checked on every machine."""
import numpy as np
import pytest

from minibp import backend, kernels, layers
from conftest import device, host

# (pool, batch): odd sizes; 130 and 131 channels take two of a one-thread block's runs (128 channels each)
CASES = [(layers.MaxPool((7, 9, 5), kernel=3, stride=2, padding="same"), 3),
         (layers.MaxPool((6, 5, 130), kernel=3, stride=2, padding="same"), 2),
         (layers.MaxPool((5, 7, 3), kernel=2, stride=1, padding="valid"), 2),
         (layers.AvgPool((6, 10, 5), kernel=2, stride=2, out_channels=10), 3),  # the parameter-free shortcut's
         (layers.AvgPool((8, 6, 131), kernel=2, stride=2, out_channels=262), 2),
         (layers.AvgPool((7, 5, 3), kernel=3, stride=1), 2),
         (layers.AvgPool((7, 9, 4), kernel=3, stride=2, padding="same"), 2)]
IDS = [f"{type(p).__name__}{p.size}/{p.stride}-{p.H}x{p.W}x{p.C}" for p, _ in CASES]
# (grid, block): one thread a block (the CPU's), threads sharing a pixel's channels, 2-D blocks with pixel lanes
LAUNCHES = [((g,), b) for g in (1, 3, 5000) for b in ((1,), (7,), (32,), (256,), (8, 4), (3, 5))]
ROWS_PER_CHUNK = (1, 3, 1000)


def _arrays(pool, n):
    """x (integers in [-3, 3]: many ties for the max), dy and a base for the accumulating calls, on the host."""
    rng = np.random.default_rng(pool.H * pool.W * pool.C + n)
    x = rng.integers(-3, 4, (n, pool.H, pool.W, pool.C)).astype(np.float32)
    out = (n,) + pool.out_shape
    dy, y_base = rng.standard_normal((2,) + out).astype(np.float32)
    return dict(x=x, dy=dy, y_base=y_base, dx_base=rng.standard_normal(x.shape).astype(np.float32))


def _calls(pool, a):
    """[(name, kernel, its inputs, output name, the output's first value)] of every kernel call the pool makes."""
    if isinstance(pool, layers.MaxPool):
        return [("forward", "maxpool_forward", dict(x=a["x"]), "y", np.nan),
                ("backward", "maxpool_backward", dict(x=a["x"], dy=a["dy"]), "dx", np.nan)]
    return [(f"{name}{'+=' if accumulate else ''}", kernel, dict(accumulate=accumulate, **inputs), out,
             a[f"{out}_base"] if accumulate else np.nan)
            for name, kernel, inputs, out in (("forward", "avgpool_forward", dict(x=a["x"]), "y"),
                                              ("backward", "avgpool_backward", dict(dy=a["dy"]), "dx"))
            for accumulate in (False, True)]


def _output(a, out, fill):
    """The output array y or dx, filled with fill."""
    return device(np.broadcast_to(fill, a["x"].shape if out == "dx" else a["dy"].shape).astype(np.float32))


def _run(pool, a, launch):
    """{name: host result} of every kernel call of the pool with one launch: dict(grid, block, rows_per_chunk).
    Outputs start as NaN (anything left unwritten shows) or, accumulating, as the base."""
    module = kernels.load("pool.cu", np.float32)
    results = {}
    for name, kernel, inputs, out, fill in _calls(pool, a):
        target = _output(a, out, fill)
        inputs = {key: device(v) if isinstance(v, np.ndarray) else v for key, v in inputs.items()}
        getattr(module, kernel)(**pool.kernel_args(a["x"].shape[0]), **inputs, **{out: target}, **launch)
        results[name] = host(target)
    return results


def _through_layers(pool, a):
    """The same calls through the pool's methods (their launch shape is layers'): {name: device array}."""
    results = {}
    x, dy = device(a["x"]), device(a["dy"])
    for name, _, inputs, out, fill in _calls(pool, a):
        target = _output(a, out, fill)
        accumulate = {"accumulate": inputs["accumulate"]} if "accumulate" in inputs else {}
        if name.startswith("forward"):
            pool.forward(x, target, **accumulate)
        elif accumulate:
            pool.backward_into(dy, target, **accumulate)
        else:
            pool.backward(x, dy, target)
        results[name] = target
    return results


def _host(results):
    return {name: host(array) for name, array in results.items()}


def _references(pool, a):
    """The NumPy references of every call, in float32, summing taps and windows in scan order as the kernels do."""
    x, dy = a["x"], a["dy"]
    if isinstance(pool, layers.MaxPool):
        return {"forward": layers.pool_ref(x, pool.size, pool.stride, pool.pad_top, pool.pad_left, pool.Ho, pool.Wo,
                                           kind="max"),
                "backward": layers.maxpool_backward_ref(x, dy, pool.size, pool.stride, pool.pad_top, pool.pad_left)}
    C, inv_area = pool.C, np.float32(1) / np.float32(pool.size * pool.size)
    pooled = layers.pool_ref(x, pool.size, pool.stride, pool.pad_top, pool.pad_left, pool.Ho, pool.Wo, kind="avg")
    y = np.zeros_like(a["y_base"])
    y[..., :C] = pooled
    y_acc = a["y_base"].copy()
    y_acc[..., :C] += pooled
    window_sums = np.zeros_like(x)  # dy summed over the windows covering each pixel, windows in scan order
    for oh in range(pool.Ho):
        for ow in range(pool.Wo):
            h0, w0 = oh * pool.stride - pool.pad_top, ow * pool.stride - pool.pad_left
            window_sums[:, max(h0, 0):h0 + pool.size, max(w0, 0):w0 + pool.size] += dy[:, oh:oh + 1, ow:ow + 1, :C]
    dx = window_sums * inv_area
    return {"forward": y, "forward+=": y_acc, "backward": dx, "backward+=": a["dx_base"] + dx}


@pytest.mark.parametrize("pool,n", CASES, ids=IDS)
def test_every_launch_shape_gives_the_references_bytes(pool, n):
    a = _arrays(pool, n)
    want = _references(pool, a)
    got = _host(_through_layers(pool, a))  # layers' launch shape
    assert got.keys() == want.keys()
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    for grid, block in LAUNCHES:
        for per_chunk in ROWS_PER_CHUNK:
            got = _run(pool, a, dict(grid=grid, block=block, rows_per_chunk=per_chunk))
            for name in want:
                assert np.array_equal(got[name], want[name]), (name, grid, block, per_chunk)


@pytest.mark.parametrize("device_name", ["cpu", "gpu"])
@pytest.mark.parametrize("pool,n", CASES[:2] + CASES[3:5], ids=IDS[:2] + IDS[3:5])
def test_the_pools_launch_as_layers_launch_says(monkeypatch, pool, n, device_name):
    """On the CPU one-thread blocks, each a contiguous run of pixels; on a GPU a pixel's channels across
    threadIdx.x. The GPU's shapes run here through the shim (only the choice is the GPU's): the same bytes."""
    if backend.device == "gpu" and device_name == "cpu":
        pytest.skip("the CPU's launch shapes run through the shim on the CPU; on a GPU its own shapes run")
    a = _arrays(pool, n)
    want = _host(_through_layers(pool, a))
    launches, load = [], kernels.load

    class Recorder:  # a kernel module that records each call's arguments
        def __init__(self, module):
            self.module = module

        def __getattr__(self, name):
            def call(**arguments):
                launches.append((name, arguments))
                getattr(self.module, name)(**arguments)
            return call

    load("pool.cu", np.float32)  # built for this machine before backend.device reads "gpu"
    monkeypatch.setattr(kernels, "load", lambda filename, dtype: Recorder(load(filename, dtype)))
    with monkeypatch.context() as m:
        m.setattr(backend, "device", device_name)
        got = _through_layers(pool, a)
        shapes = [layers.launch(args["N"] * (args["Ho"] * args["Wo"] if name.endswith("forward") else
                                              args["H"] * args["W"]), pool.C) for name, args in launches]
    assert len(launches) == len(want)
    for (name, arguments), shape in zip(launches, shapes):
        assert {key: arguments.get(key) for key in shape} == shape, name
        assert (shape["block"] == (1,)) == (device_name == "cpu"), name
    for name, array in _host(got).items():
        assert np.array_equal(array, want[name]), name
