"""The Net and SGD API under misuse: clear errors, and nothing of a bad step left behind."""
import numpy as np
import pytest

from minibp.models import preact_resnet
from minibp.net import Net
from minibp.optim import SGD
from conftest import device, host
from gradcheck import numerical_gradient, relative_error


def tiny_net(*, dtype=np.float32):
    net = Net((8, 8, 3), dtype=dtype)
    net.conv(8, kernel=3)
    with net.residual():
        net.conv(8, kernel=3)
    net.classifier(3)
    return net


def tiny_batch(rng, n=4):
    return device(rng.standard_normal((n, 8, 8, 3)).astype(np.float32)), rng.integers(0, 3, n)


def test_nan_input_leaves_the_running_statistics_as_they_were(rng):
    net = tiny_net().compile(batch=4, bits="4")
    x, y = tiny_batch(rng)
    net.forward(x, y)  # one good step moves the running statistics away from (0, 1)
    before = host(net.arena["running"]).copy()
    bad = host(x).copy()
    bad[1, 2, 3, 0] = np.nan
    with pytest.raises(FloatingPointError):
        net.forward(device(bad), y)
    assert np.array_equal(host(net.arena["running"]), before)
    loss, _ = net.forward(x, y, train=False)  # evaluation still works
    assert np.isfinite(loss)
    with pytest.raises(RuntimeError, match="forward"):  # nothing to back-propagate from a failed step
        net.backward()


def test_using_the_net_before_compile_is_a_clear_error():
    net = tiny_net()
    with pytest.raises(RuntimeError, match="compile"):
        net.backward()
    with pytest.raises(RuntimeError, match="compile"):
        net.zero_grad()
    with pytest.raises(RuntimeError, match="compile"):
        net.load_state({})
    with pytest.raises(RuntimeError, match="compile"):
        net.initialize(seed=1)
    with pytest.raises(RuntimeError, match="compile"):
        SGD(net)


@pytest.mark.parametrize("labels,error,match", [
    ([0, 1, 2, 0], TypeError, "integer array"),
    (None, ValueError, "needs labels"),
    (np.array([0.0, 1.0, 2.0, 0.0]), ValueError, "integers"),
    (np.array([0.5, 1.0, 2.0, 0.0], np.float32), ValueError, "integers"),
])
def test_labels_must_be_an_integer_array(rng, labels, error, match):
    net = tiny_net().compile(batch=4, bits="4")
    x, _ = tiny_batch(rng)
    with pytest.raises(error, match=match):
        net.forward(x, labels)


@pytest.mark.parametrize("batch", [2.7, 0, -1, True, "4", None])
def test_batch_must_be_a_positive_integer(batch):
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        tiny_net().compile(batch=batch, bits="4")
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        tiny_net().plan(batch=batch, bits="4")


def test_a_whole_float_batch_is_accepted():
    assert tiny_net().compile(batch=4.0, bits="4").batch == 4


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


def test_plan_refuses_what_compile_refuses():
    odd = Net((4, 4, 3))
    odd.conv(3)
    odd.classifier(2)
    with pytest.raises(ValueError, match="multiple of 2"):
        odd.plan(batch=2, bits="4")
    with pytest.raises(ValueError, match="multiple of 4"):
        odd.plan(batch=2, bits="2")
    odd.plan(batch=2, bits="exact")  # any channel count in exact mode


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


@pytest.mark.parametrize("depth", [11, 20])
def test_projection_resnets_train(rng, depth):
    net = preact_resnet(depth, input_shape=(8, 8, 3), classes=3, shortcut="projection").compile(batch=4, bits="4")
    opt = SGD(net)
    x, y = tiny_batch(rng)
    losses = []
    for _ in range(3):
        net.zero_grad()
        losses.append(net.forward(x, y)[0])
        net.backward()
        opt.step(lr=0.05)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_projection_block_then_fewer_channels_matches_finite_differences(rng):
    """The residual buffer carries the projection's output, the adding unit's input (16 channels here),
    not the adding unit's output (4 channels)."""
    net = Net((8, 8, 3), dtype=np.float64)
    net.conv(8, kernel=3)
    with net.residual(shortcut="projection"):
        net.conv(8, kernel=1)
        net.conv(16, kernel=3, stride=2)
    net.conv(4, kernel=1)  # adds the projection, then reduces the channels
    net.classifier(3)
    net.compile(batch=2, bits="exact", seed=1)
    x = device(rng.standard_normal((2, 8, 8, 3)))
    y = rng.integers(0, 3, 2)
    net.forward(x, y)
    net.backward()
    loss = lambda: net.forward(x, y)[0]  # noqa: E731
    for name, analytic in net.grad_views.items():
        assert relative_error(host(analytic), numerical_gradient(loss, net.param_views[name])) < 1e-6, name


@pytest.mark.parametrize("name", ["params/unit1.w", "momentum/unit2.gamma", "running/unit1.bn"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e39])  # 1e39: finite as given, infinite as float32
def test_load_state_refuses_values_that_are_not_finite(rng, name, bad):
    net = tiny_net().compile(batch=4, bits="4")
    x, y = tiny_batch(rng)
    net.forward(x, y)
    net.backward()
    SGD(net).step(lr=0.1)  # momentum and running statistics away from zero
    before = net.state()
    state = {k: v.astype(np.float64) for k, v in before.items()}
    state[name].flat[-1] = bad
    with pytest.raises(ValueError, match=f"state '{name}' holds values that are not finite"):
        net.load_state(state)
    after = net.state()
    assert all(np.array_equal(after[k], before[k]) for k in before)  # nothing of it was loaded


def test_load_state_refuses_arrays_that_are_not_numbers():
    net = tiny_net().compile(batch=4, bits="4")
    state = net.state()
    state["params/unit1.gamma"] = np.array(["1"] * 8)
    with pytest.raises(TypeError, match="state 'params/unit1.gamma' must be an array of numbers, got <U1"):
        net.load_state(state)


def test_a_diverged_net_can_still_be_recompiled():
    """compile() keeps the net's own state, whatever it holds: the next forward says the loss is NaN."""
    net = tiny_net().compile(batch=4, bits="4")
    net.params[0] = np.nan
    net.compile(batch=2, bits="4")
    assert np.isnan(host(net.params)[0])
