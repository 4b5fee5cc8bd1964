"""The error model's calibration (minibp/run/calibration.py): a unit's error is the whole gradient's error of its
group at 4 bits, shared as the units' own errors are and carried to k by its own; measured here as nets compiled
side by side give it."""
import numpy as np
import pytest

from minibp import quant
from minibp.run import budget, calibration
from conftest import device, host
from nets import tiny_resnet


def gradients(images, labels, bits, units):
    """{name: host float64} of the tiny net's gradient with each batch-norm unit at its bits (one pass)."""
    net = tiny_resnet(classes=3)
    net.compile(pass_images=len(images), store=list(budget.stores_of(net, bits, quant.Store("4"))), seed=5)
    net.forward(device(images), labels, draw=0)
    net.backward(accumulate=False)
    return {name: host(view).astype(np.float64) for name, view in net.grad_views.items()}


def distance(a, b, names=None):
    return sum(float(np.sum((a[n] - b[n]) ** 2)) for n in (names or a))


def test_each_units_error_is_its_groups_whole_error_shared_as_its_own(rng, monkeypatch):
    """With a group a unit (GROUPS at least the units), err(u, 4) is the whole gradient's error with u alone at 4
    bits, and err(u, k) / err(u, 4) is the ratio of u's own gradient's errors with every unit at k and at 4."""
    monkeypatch.setattr(calibration, "GROUPS", 100)
    images, labels = rng.standard_normal((8, 8, 8, 3)).astype(np.float32), rng.integers(0, 3, 8)
    net = tiny_resnet(classes=3)
    errors = calibration.calibrate(net, images, labels, store=quant.Store("4"), seed=5)
    units = [u for u in net.units if u.bn_channels]
    assert errors.shape == (len(units), 3)
    exact = gradients(images, labels, ["exact"] * len(units), units)
    uniform = {k: gradients(images, labels, [k] * len(units), units) for k in ("2", "4", "8")}
    for row, u in enumerate(units):
        alone = gradients(images, labels, ["4" if i == row else "exact" for i in range(len(units))], units)
        assert errors[row, 1] == pytest.approx(distance(alone, exact), rel=1e-6), u.index
        own = {k: distance(uniform[k], exact, [n for n in exact if n.startswith(f"unit{u.index}.")]) for k in uniform}
        for column, k in enumerate(("2", "4", "8")):
            assert errors[row, column] / errors[row, 1] == pytest.approx(own[k] / own["4"], rel=1e-6)
    assert (errors[:, 0] > errors[:, 1]).all() and (errors[:, 1] > errors[:, 2]).all() and (errors[:, 2] > 0).all()


def test_passes_are_sub_batches_and_whole_passes_only(rng):
    """Images computed in passes give the gradient a step of those sub-batches gives, so the errors of 2 passes of 4
    are not those of 1 pass of 8; a pass size that does not divide the images is refused."""
    images, labels = rng.standard_normal((8, 8, 8, 3)).astype(np.float32), rng.integers(0, 3, 8)
    one = calibration.calibrate(tiny_resnet(classes=3), images, labels, store=quant.Store("4"), seed=5)
    two = calibration.calibrate(tiny_resnet(classes=3), images, labels, store=quant.Store("4"), seed=5, pass_images=4)
    assert one.shape == two.shape and not np.allclose(one, two)
    with pytest.raises(ValueError, match="not whole passes of 3"):
        calibration.calibrate(tiny_resnet(classes=3), images, labels, store=quant.Store("4"), seed=5, pass_images=3)


def test_a_calibration_arena_is_refused_by_its_check(rng):
    def refuse(plan):
        raise ValueError(f"no room for {plan.allocation_bytes} bytes")
    with pytest.raises(ValueError, match="no room for"):
        calibration.calibrate(tiny_resnet(classes=3), np.zeros((2, 8, 8, 3), np.float32), np.zeros(2, np.int64),
                              store=quant.Store("4"), seed=0, check_plan=refuse)


def test_its_host_bytes_are_two_gradients():
    net = tiny_resnet(classes=3)
    assert calibration.calibration_bytes(net) == 2 * net.num_parameters * 4
