"""The error model's calibration (minibp/run/calibration.py): each unit's error is the squared distance of its own
gradient under k-bit stores from the exact one, measured as two nets compiled side by side would give it."""
import numpy as np
import pytest

from minibp import quant
from minibp.run import calibration
from conftest import device, host
from nets import tiny_resnet


def test_each_units_error_is_its_gradients_squared_distance_from_exact(rng):
    images = rng.standard_normal((8, 8, 8, 3)).astype(np.float32)
    labels = rng.integers(0, 3, 8)
    errors = calibration.calibrate(tiny_resnet(classes=3), images, labels, store=quant.Store("4"), seed=5)
    units = [u for u in tiny_resnet(classes=3).units if u.bn_channels]
    assert errors.shape == (len(units), 3)
    grads = {}
    for bits in ("exact", "2", "4", "8"):
        net = tiny_resnet(classes=3).compile(batch=8, bits=bits, seed=5)
        net.forward(device(images), labels, draw=0)
        net.backward(accumulate=False)
        grads[bits] = {name: host(view).astype(np.float64) for name, view in net.grad_views.items()}
    for column, bits in enumerate(("2", "4", "8")):
        for row, u in enumerate(units):
            names = [n for n in grads[bits] if n.startswith(f"unit{u.index}.")]
            want = sum(float(np.sum((grads[bits][n] - grads["exact"][n]) ** 2)) for n in names)
            assert errors[row, column] == pytest.approx(want, rel=1e-9), (u.index, bits)
    assert (errors[:, 0] > errors[:, 1]).all() and (errors[:, 1] > errors[:, 2]).all() and (errors[:, 2] > 0).all()


def test_a_calibration_arena_is_refused_by_its_check(rng):
    def refuse(plan):
        raise ValueError(f"no room for {plan.allocation_bytes} bytes")
    with pytest.raises(ValueError, match="no room for"):
        calibration.calibrate(tiny_resnet(classes=3), np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int64),
                              store=quant.Store("4"), seed=0, check_plan=refuse)


def test_its_host_bytes_are_the_gradients_copy_and_a_roles_difference():
    net = tiny_resnet(classes=3)
    largest = max(int(np.prod(p.shape)) for u in net.units for p in u.parameters())
    assert calibration.calibration_bytes(net) == net.num_parameters * 4 + 2 * largest * 8
