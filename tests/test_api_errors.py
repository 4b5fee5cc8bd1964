"""The Net API under misuse (checks.py and net.py): clear errors, and nothing of a bad step left behind. (SGD's:
tests/test_optim.py; load_state's: test_params.py.)"""
import numpy as np
import pytest

from minibp.optim import SGD
from conftest import device, host
from nets import odd_net, tiny_batch, tiny_net


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


def test_plan_refuses_what_compile_refuses():
    odd = odd_net()
    with pytest.raises(ValueError, match="multiple of 2"):
        odd.plan(batch=2, bits="4")
    with pytest.raises(ValueError, match="multiple of 4"):
        odd.plan(batch=2, bits="2")
    odd.plan(batch=2, bits="exact")  # any channel count in exact mode


def test_a_diverged_net_can_still_be_recompiled():
    """compile() keeps the net's own state, whatever it holds: the next forward says the loss is NaN."""
    net = tiny_net().compile(batch=4, bits="4")
    net.params[0] = np.nan
    net.compile(batch=2, bits="4")
    assert np.isnan(host(net.params)[0])
