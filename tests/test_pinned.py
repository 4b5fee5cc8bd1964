"""A pinned loss trajectory: ResNet-20, exact and 4 bits, six SGD steps from a fixed seed on fixed
random data. The values were measured before the net was restructured into units; any change to the
arithmetic of a training step (not just its organisation) moves them beyond float32 rounding."""
import numpy as np
import pytest

from minibp.models import preact_resnet
from minibp.optim import SGD
from conftest import device

PINNED = {
    "exact": [2.246315, 2.760445, 2.645308, 2.539691, 2.993634, 2.421022],
    "4": [2.246315, 2.767684, 2.59255, 2.548159, 2.98404, 2.440898],
}


@pytest.mark.parametrize("bits", list(PINNED))
def test_resnet20_loss_trajectory_is_pinned(bits):
    rng = np.random.default_rng(2024)
    net = preact_resnet(20, input_shape=(16, 16, 3), classes=10)
    net.compile(batch=8, bits=bits, seed=5)
    opt = SGD(net, momentum=0.9, weight_decay=2e-4)
    losses = []
    for _ in range(len(PINNED[bits])):
        x = rng.standard_normal((8, 16, 16, 3)).astype(np.float32)
        y = rng.integers(0, 10, 8)
        net.zero_grad()
        losses.append(net.forward(device(x), y)[0])
        net.backward()
        opt.step(lr=0.1)
    np.testing.assert_allclose(losses, PINNED[bits], rtol=2e-6)
