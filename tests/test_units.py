"""Units: a new kind of unit (ReLU, conv and bias, without batch norm) in a net, its gradients and its store.
(The Net API around them: tests/test_net.py; the state as named arrays: test_params.py; old checkpoints:
run/test_checkpoint.py.)"""
import numpy as np

from minibp.net import Net
from minibp.units import ReluConvUnit
from conftest import device, host
from gradcheck import numerical_gradient, relative_error


def net_with_relu_conv(dtype=np.float64):
    net = Net((6, 6, 3), dtype=dtype)
    net.conv(4, kernel=3)
    net.add(ReluConvUnit((6, 6, 4), 4, kernel=3))          # ReLU -> conv + bias, no BN
    with net.residual():
        net.add(ReluConvUnit((6, 6, 4), 4, kernel=1))
    net.classifier(3)
    return net


def test_a_new_unit_kind_matches_finite_differences(rng):
    net = net_with_relu_conv().compile(pass_images=2, bits="exact", seed=2, input_grad=True)
    x, y = device(rng.standard_normal((2, 6, 6, 3))), rng.integers(0, 3, 2)
    net.forward(x, y)
    net.backward()
    loss = lambda: net.forward(x, y)[0]  # noqa: E731
    assert any(name.endswith(".bias") for name in net.grad_views)
    for name, analytic in net.grad_views.items():
        numeric = numerical_gradient(loss, net.param_views[name])
        # (the last unit's bias feeds batch norm, which cancels it: both gradients are then ~0)
        assert relative_error(host(analytic), numeric) < 1e-6 or np.abs(host(analytic) - numeric).max() < 1e-10, name
    assert relative_error(host(net.arena["input_grad"]), numerical_gradient(loss, x)) < 1e-6


def test_a_new_unit_kind_keeps_its_input_in_full_precision_at_4_bits(rng):
    net = net_with_relu_conv(np.float32)
    plan = net.plan(pass_images=2, bits=4)
    assert plan["unit1.x_copy"].dtype == np.float32 and plan["unit1.x_copy"].shape == (2 * 6 * 6 * 4,)
    assert plan["unit3.codes"].dtype == np.uint8  # the classifier's BN input: 4-bit codes
