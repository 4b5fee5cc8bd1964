"""The store's window through the whole net: the option, and what the range window is for."""
import numpy as np
import pytest

from minibp import backend, models


def _gradients(bits, window, images, labels):
    net = models.preact_resnet(11, input_shape=images.shape[1:], classes=10)
    net.compile(batch=len(labels), bits=bits, window=window, seed=3)
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
    net = models.preact_resnet(11, input_shape=(8, 8, 1), classes=10)
    with pytest.raises(ValueError, match="window must be one of"):
        net.compile(batch=4, bits=4, window="sigma")
    assert net.compile(batch=4, bits="naive", window="range").window == "fixed"
    assert net.compile(batch=4, bits=4).window == "range"  # the default
