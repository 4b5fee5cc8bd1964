"""The parameter table's state (params.py) as named arrays, through net.state and net.load_state: it round-trips,
and a state that does not fit the net, is not numbers or holds values that are not finite is refused whole."""
import numpy as np
import pytest

from minibp.net import Net
from minibp.optim import SGD
from conftest import device
from nets import tiny_batch, tiny_net, train_steps


def test_state_round_trips_and_refuses_another_net(rng):
    a = tiny_net().compile(batch=4, bits=4)
    train_steps(a, rng)
    b = tiny_net().compile(batch=4, bits=4, seed=9)
    b.load_state(a.state())
    x = device(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
    assert np.array_equal(a.predict(x), b.predict(x))
    assert set(a.state()) >= {"params/unit1.gamma", "momentum/unit1.gamma", "running/unit1.bn"}
    other = Net((8, 8, 3))
    other.conv(8, kernel=3)
    other.classifier(3)
    other.compile(batch=4, bits=4)
    with pytest.raises(ValueError, match="does not fit this net"):
        other.load_state(a.state())
    bad = a.state()
    bad["params/unit1.gamma"] = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"has shape \(3,\)"):
        b.load_state(bad)


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
