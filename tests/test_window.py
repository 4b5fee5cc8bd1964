"""The store's window through the whole net: the option, and what the range window is for."""
import numpy as np
import pytest

from minibp import backend, layers, models, quant
from minibp.params import key
from conftest import device, host
from nets import tiny_resnet


def _gradients(bits, window, images, labels):
    net = models.preact_resnet(11, input_shape=images.shape[1:], classes=10)
    net.compile(pass_images=len(labels), bits=bits, window=window, seed=3)
    net.zero_grad()
    net.forward(images, labels)
    net.backward()
    return net, backend.to_host(net.grads).astype(np.float64)


def test_the_range_window_removes_the_clipping_error_of_heavy_tails():
    """Inputs with a few values far out (as trained activations have): at 8 bits the paper's window clips
    them and the range window does not, so its weight gradients are several times closer to exact."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((16, 8, 8, 1)).astype(np.float32)
    images.reshape(-1)[rng.choice(images.size, 20, replace=False)] *= 12
    labels = rng.integers(0, 10, 16)
    _, exact = _gradients("exact", "range", images, labels)
    error = {w: np.linalg.norm(_gradients("8", w, images, labels)[1] - exact) / np.linalg.norm(exact)
             for w in ("fixed", "range")}
    assert error["range"] < error["fixed"] / 3, error


def test_window_option_is_checked_and_the_naive_ablation_keeps_the_papers():
    net = tiny_resnet(channels=1)
    for bits in (4, "exact", "naive"):  # checked even where it would not be used
        with pytest.raises(ValueError, match="window must be one of"):
            net.compile(pass_images=4, bits=bits, window="sigma")
    assert net.compile(pass_images=4, bits="naive", window="range").store.window == "fixed"
    assert net.compile(pass_images=4, bits=4).store.window == "block"  # the default


def test_the_block_window_fits_each_block_of_rows():
    """Two blocks of rows, one spread 100x wider than the other: the range window's bins are set by the wide
    block, the block window's by each block's own, so the narrow block's xhat~ is far closer to exact."""
    rng = np.random.default_rng(1)
    rows, C, bits = 2 * quant.WINDOW_ROWS, 8, 4
    x = rng.standard_normal((rows, C)).astype(np.float32)
    x[quant.WINDOW_ROWS:] *= 100
    gamma, beta = np.ones(C, np.float32), np.zeros(C, np.float32)
    error = {}
    for window in ("range", "block"):
        stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
        windows = device(np.zeros((quant.windows_per_channel(rows) if window == "block" else 1, 3, C), np.float32))
        part = layers.batchnorm_statistics(device(x), partial=device(np.zeros(4 * rows * C, np.float32)),
                                               window=window)
        layers.batchnorm_finish(device(gamma), device(beta), stats, eps=1e-5, bits=bits, window=window,
                                part=part, rows=rows, windows=windows)
        codes = device(np.zeros(rows * C * bits // 8, np.uint8))
        layers.batchnorm_relu_forward(device(x), stats, device(beta), device(np.zeros((rows, C), np.float32)),
                                      bits=bits, codes=codes, windows=windows)
        s = host(stats)
        table = host(windows)[0] if window == "range" else quant.row_windows_ref(host(windows), rows)
        xhat_t = quant.dequantize_ref(host(codes), table, s[3], s[2], bits=bits, shape=(rows, C))[0]
        xhat = (x - s[0]) / s[1]
        narrow = slice(0, quant.WINDOW_ROWS)
        error[window] = np.linalg.norm(xhat_t[narrow] - xhat[narrow]) / np.linalg.norm(xhat[narrow])
    assert error["block"] < error["range"] / 10, error


def test_the_plan_holds_the_block_windows_with_the_store():
    """(blocks, 3, C) windows a unit, in the activation stores: at most 0.375/k more than the codes."""
    net = tiny_resnet(channels=1)
    plans = {w: net.plan(pass_images=16, bits=4, window=w) for w in ("range", "block")}
    extra = (plans["block"].bytes_by_category()["activation stores"]
             - plans["range"].bytes_by_category()["activation stores"])
    units = [u for u in net.units if key(u.index, "windows") in plans["block"]]
    windows = [plans["block"][key(u.index, "windows")] for u in units]
    assert len(units) == sum(key(u.index, "codes") in plans["block"] for u in net.units) > 0
    for u, w in zip(units, windows):
        H, W, C = u.in_shape
        assert w.shape == (quant.windows_per_channel(16 * H * W), 3, C), (u.index, w.shape)
    assert extra == sum(w.nbytes for w in windows) > 0
    assert net.compile(pass_images=16, bits=4, window="block").store.window == "block"
    assert net.compile(pass_images=16, bits="exact", window="block").store.window == "fixed"  # exact codes nothing


def test_the_planner_names_the_window_and_its_unit_rows_add_up(capsys):
    """python3 -m minibp.plan --window W: the per-unit rows hold the windows too, so they sum to the stores."""
    import json
    from minibp import plan
    for window in ("block", "range"):
        assert plan.main(["--model", "resnet20", "--batch", "8", "--window", window, "--units", "--json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["window"] == window
        assert sum(u["bytes"] for u in result["unit_stores"]) == result["categories"]["activation stores"]


@pytest.mark.parametrize("window,rounding", [("block", "nearest"), ("range", "stochastic")])
def test_a_clip_of_its_own_is_the_default_clips_when_equal_and_is_coded_through(window, rounding):
    """quant.Store(clip=...): the clip the default names gives the same gradients bit for bit; another clip
    reaches the windows the kernels take, as quant.window_ref computes them for that clip."""
    rng = np.random.default_rng(2)
    images = rng.standard_normal((16, 8, 8, 1)).astype(np.float32)
    images.reshape(-1)[rng.choice(images.size, 20, replace=False)] *= 12  # tails for the clip to cut
    labels = rng.integers(0, 10, 16)

    def gradients(clip):
        net = models.preact_resnet(11, input_shape=(8, 8, 1), classes=10)
        net.compile(pass_images=16, bits=2, window=window, rounding=rounding, clip=clip, seed=3)
        net.zero_grad()
        net.forward(images, labels)
        net.backward()
        return backend.to_host(net.grads).copy()

    default = gradients(None)
    assert np.array_equal(gradients(quant.clip_of(window, 2)), default)
    assert not np.array_equal(gradients(np.inf), default)

    rows, C, bits = 2 * quant.WINDOW_ROWS, 4, 2
    x = rng.standard_normal((rows, C)).astype(np.float32)
    x[rng.choice(rows, 6, replace=False)] *= 15
    stats = device(np.zeros((layers.STATS_ROWS, C), np.float32))
    windows = device(np.zeros((quant.windows_per_channel(rows) if window == "block" else 1, 3, C), np.float32))
    part = layers.batchnorm_statistics(device(x), partial=device(np.zeros(4 * rows * C, np.float32)),
                                           window=window)
    blocks = x.reshape(quant.windows_per_channel(rows) if window == "block" else 1, -1, C)  # the rows each window spans
    layers.batchnorm_finish(device(np.ones(C, np.float32)), device(np.zeros(C, np.float32)), stats, eps=1e-5,
                            bits=bits, window=window, part=part, rows=rows, windows=windows,
                            stochastic=rounding == "stochastic", clip=1.5)
    s = host(stats)
    v = lambda t: ((t - s[0]) / s[1] + s[3]).astype(np.float32)  # noqa: E731 (xhat + b: mean, sigma, gamma, b)
    table = quant.window_ref(s[3], bits=bits, kind="block", lo=v(blocks.min(axis=1)), hi=v(blocks.max(axis=1)),
                             clip=1.5, stochastic=rounding == "stochastic")  # (3, blocks, C); a range is one block
    assert np.allclose(host(windows), table.transpose(1, 0, 2), rtol=1e-6, atol=1e-6)
    assert not np.allclose(host(windows), quant.window_ref(s[3], bits=bits, kind="block", lo=v(blocks.min(axis=1)),
                                                           hi=v(blocks.max(axis=1)), stochastic=rounding == "stochastic")
                           .transpose(1, 0, 2), rtol=1e-6, atol=1e-6)  # the default clip's are others


def test_a_clip_is_a_k_bit_range_or_block_windows_and_the_trainer_records_it():
    from minibp.run.config import RunConfig
    for store, match in [(dict(bits="2", window="fixed", clip=4), "fixed window has the paper's"),
                         (dict(bits="exact", clip=4), "codes through none of its choosing"),
                         (dict(bits="2", clip=0), "positive number of standard deviations")]:
        with pytest.raises(ValueError, match=match):
            quant.Store(**store)
    config = RunConfig.new(dict(data="fashion-mnist", model="resnet20", bits="2", clip=4.0))
    assert str(config.store) == "bits 2 (block window, clip 4 sigma)" and config.as_dict()["clip"] == 4.0
    assert config.folder().name == "fashion-mnist-resnet20-2-clip4-seed0"
