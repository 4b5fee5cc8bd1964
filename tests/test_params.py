"""The parameter table's state (params.py) as named arrays, through net.state and net.load_state: it round-trips,
and a state that does not fit the net, is not numbers or holds values that are not finite is refused whole; the
optimizer's arrays (momentum, AdamW's second moment) are optional both ways."""
import numpy as np
import pytest

from minibp.net import Net
from minibp.optim import SGD, AdamW
from conftest import device
from nets import tiny_batch, tiny_net, train_steps


def test_state_round_trips_and_refuses_another_net(rng):
    a = tiny_net().compile(pass_images=4, bits=4)
    train_steps(a, rng)
    b = tiny_net().compile(pass_images=4, bits=4, seed=9)
    b.load_state(a.state())
    x = device(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
    assert np.array_equal(a.predict(x), b.predict(x))
    assert set(a.state()) >= {"params/unit1.gamma", "momentum/unit1.gamma", "running/unit1.bn"}
    other = Net((8, 8, 3))
    other.conv(8, kernel=3)
    other.classifier(3)
    other.compile(pass_images=4, bits=4)
    with pytest.raises(ValueError, match="does not fit this net"):
        other.load_state(a.state())
    bad = a.state()
    bad["params/unit1.gamma"] = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"has shape \(3,\)"):
        b.load_state(bad)


@pytest.mark.parametrize("name", ["params/unit1.w", "momentum/unit2.gamma", "running/unit1.bn"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e39])  # 1e39: finite as given, infinite as float32
def test_load_state_refuses_values_that_are_not_finite(rng, name, bad):
    net = tiny_net().compile(pass_images=4, bits="4")
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
    net = tiny_net().compile(pass_images=4, bits="4")
    state = net.state()
    state["params/unit1.gamma"] = np.array(["1"] * 8)
    with pytest.raises(TypeError, match="state 'params/unit1.gamma' must be an array of numbers, got <U1"):
        net.load_state(state)


def _adamw_trained(rng):
    net = tiny_net().compile(pass_images=4, bits="4", optimizer="adamw")
    x, y = tiny_batch(rng)
    net.forward(x, y)
    net.backward()
    AdamW(net).step(lr=1e-3, iteration=0)
    return net


def test_the_optimizer_state_is_optional_both_ways(rng):
    adamw = _adamw_trained(rng)
    state = adamw.state()
    names = [name for name, _, _ in adamw.parameter_table()]
    assert {"second_moment/" + n for n in names} | {"momentum/" + n for n in names} <= set(state)
    assert all(state["second_moment/" + n].shape == state["params/" + n].shape for n in names)
    for options in (dict(), dict(training=False)):  # an SGD net, an evaluation net: the second moment left out
        other = tiny_net().compile(pass_images=4, bits="4", seed=3, **options)
        other.load_state(state)
        assert all(np.array_equal(other.state()[k], v) for k, v in state.items() if k in other.state())
        assert not any(k.startswith("second_moment/") for k in other.state())
    sgd_state = {k: v for k, v in state.items() if not k.startswith("second_moment/")}
    fresh = tiny_net().compile(pass_images=4, bits="4", seed=3, optimizer="adamw")
    fresh.load_state(sgd_state)  # an SGD state: the second moment starts at zero, as momentum would
    loaded = fresh.state()
    assert all(np.array_equal(loaded[k], v) for k, v in sgd_state.items())
    assert all(not loaded["second_moment/" + n].any() for n in names)


@pytest.mark.parametrize("bad", [np.nan, -np.inf, 1e39])
def test_load_state_refuses_a_second_moment_that_is_not_finite(rng, bad):
    net = _adamw_trained(rng)
    before = net.state()
    state = dict(before, **{"second_moment/unit1.gamma": np.full(8, bad)})
    with pytest.raises(ValueError, match="state 'second_moment/unit1.gamma' holds values that are not finite"):
        net.load_state(state)
    with pytest.raises(ValueError, match=r"state 'second_moment/unit1.w' has shape \(3,\)"):
        net.load_state(dict(before, **{"second_moment/unit1.w": np.ones(3)}))
    after = net.state()
    assert all(np.array_equal(after[k], before[k]) for k in before)
