"""SGD with momentum: the kernel against its reference, weight decay on weights only, hyperparameters and learning
rates that are not numbers in range refused, and a net recompiled under it."""
import re

import numpy as np
import pytest

from minibp import optim
from minibp.net import Net
from minibp.optim import SGD
from conftest import device, host
from nets import tiny_batch, tiny_net


def _net():
    net = Net((4, 4, 2))
    net.conv(4, kernel=3)
    net.conv(4, kernel=1)
    net.classifier(3)
    return net.compile(batch=2, bits="4", seed=0)


def test_sgd_kernel_equals_reference_exactly(rng):
    net = _net()
    params0 = host(net.params).copy()
    grads = rng.standard_normal(params0.shape).astype(np.float32)
    velocity = rng.standard_normal(params0.shape).astype(np.float32)
    net.grads[...] = device(grads)
    net.arena["velocity"][...] = device(velocity)
    opt = optim.SGD(net, momentum=0.9, weight_decay=2e-4)
    opt.step(lr=0.1)
    want_p, want_v = optim.sgd_momentum_ref(params0, grads, velocity, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                            weight_decay=2e-4)
    assert np.array_equal(host(net.params), want_p)
    assert np.array_equal(host(net.arena["velocity"]), want_v)


def test_weight_decay_skips_batchnorm_and_bias():
    net = _net()
    net.params[...] = 1
    net.grads[...] = 0
    optim.SGD(net, momentum=0.0, weight_decay=0.5).step(lr=1.0)
    for name, _, param in net.parameter_table():
        assert np.all(host(net.param_views[name]) == (0.5 if param.decayed else 1.0)), name
    assert not any(p.decayed for _, _, p in net.parameter_table() if p.role in ("gamma", "beta", "bias"))


def test_bad_options_are_refused():
    net = _net()
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD(net, momentum=1.5)
    with pytest.raises(ValueError, match="lr must be finite and >= 0, got nan"):
        optim.SGD(net).step(lr=float("nan"))
    with pytest.raises(RuntimeError, match="compile"):
        optim.SGD(Net((4, 4, 2)))


@pytest.mark.parametrize("lr,error,match", [
    ("0.1", TypeError, "lr must be a real number, got '0.1' (str)"),
    (True, TypeError, "lr must be a real number, got True (bool)"),
    (None, TypeError, "lr must be a real number, got None (NoneType)"),
    (np.array([0.1, 0.2]), TypeError, "lr must be a real number, got array"),
    (-0.1, ValueError, "lr must be finite and >= 0, got -0.1"),
    (float("inf"), ValueError, "lr must be finite and >= 0, got inf"),
])
def test_step_refuses_a_learning_rate_that_is_not_a_finite_number(lr, error, match):
    net = _net()
    before = host(net.params).copy()
    with pytest.raises(error, match=re.escape(match)):
        optim.SGD(net).step(lr=lr)
    assert np.array_equal(host(net.params), before)


@pytest.mark.parametrize("lr", [0, 0.1, np.float32(0.1), np.float64(0.1), 1])
def test_step_takes_any_real_learning_rate(lr):
    net = _net()
    net.grads[...] = 1
    optim.SGD(net, momentum=0.0, weight_decay=0.0).step(lr=lr)
    assert np.allclose(host(net.params), host(_net().params) - float(lr))


def test_step_needs_a_net_compiled_for_training():
    net = _net()
    opt = optim.SGD(net)
    net.compile(batch=2, bits="4", training=False)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        opt.step(lr=0.1)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        optim.SGD(net)


@pytest.mark.parametrize("options,error,match", [
    (dict(weight_decay=float("nan")), ValueError, "weight_decay must be finite and >= 0, got nan"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay must be finite and >= 0"),
    (dict(weight_decay=-1e-4), ValueError, "weight_decay must be finite and >= 0"),
    (dict(weight_decay="2e-4"), TypeError, r"weight_decay must be a real number, got '2e-4' \(str\)"),
    (dict(momentum=float("nan")), ValueError, r"momentum must be in \[0, 1\), got nan"),
    (dict(momentum=1.0), ValueError, r"momentum must be in \[0, 1\), got 1.0"),
    (dict(momentum="0.9"), TypeError, "momentum must be a real number"),
    (dict(momentum=False), TypeError, "momentum must be a real number, got False"),
])
def test_sgd_refuses_hyperparameters_that_are_not_numbers_in_range(options, error, match):
    net = tiny_net().compile(batch=2, bits="4")
    with pytest.raises(error, match=match):
        SGD(net, **options)


def test_sgd_follows_a_recompiled_net(rng):
    net = tiny_net().compile(batch=4, bits="4")
    opt = SGD(net, momentum=0.9)
    net.compile(batch=2, bits="4")  # a new arena, with a new momentum buffer
    x, y = tiny_batch(rng, 2)
    net.zero_grad()
    net.forward(x, y)
    net.backward()
    opt.step(lr=0.1)
    momentum = [v for name, v in net.state().items() if name.startswith("momentum/")]
    assert max(np.abs(v).max() for v in momentum) > 0  # the step's momentum is in the state a checkpoint saves
