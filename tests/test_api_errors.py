"""The Net API under misuse (checks.py and net.py): clear errors, and nothing of a bad step left behind. (SGD's:
tests/test_optim.py; load_state's: test_params.py.)"""
import warnings

import numpy as np
import pytest

from minibp.optim import SGD
from conftest import device, host
from nets import odd_net, tiny_batch, tiny_net


def test_nan_input_leaves_the_running_statistics_as_they_were(rng):
    net = tiny_net().compile(pass_images=4, bits="4")
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
    net = tiny_net().compile(pass_images=4, bits="4")
    x, _ = tiny_batch(rng)
    with pytest.raises(error, match=match):
        net.forward(x, labels)


@pytest.mark.parametrize("n", [2.7, 0, -1, True, "4", None])
def test_pass_images_must_be_a_positive_integer(n):
    with pytest.raises(ValueError, match="pass_images must be a positive integer"):
        tiny_net().compile(pass_images=n, bits="4")
    with pytest.raises(ValueError, match="pass_images must be a positive integer"):
        tiny_net().plan(pass_images=n, bits="4")


def test_a_whole_float_pass_size_is_accepted():
    assert tiny_net().compile(pass_images=4.0, bits="4").pass_images == 4


def test_the_old_keyword_batch_still_works_for_a_release_with_a_warning():
    """compile(batch=) and plan(batch=) meant one pass's images while --batch and TrainStep's batch mean a step's:
    the old keyword gives the same plan and net for a release, with a DeprecationWarning naming pass_images."""
    with pytest.warns(DeprecationWarning, match=r"Net\.plan\(\)'s batch is now pass_images"):
        old = tiny_net().plan(batch=4, bits="4")
    assert old.buffers == tiny_net().plan(pass_images=4, bits="4").buffers
    with pytest.warns(DeprecationWarning, match=r"Net\.compile\(\)'s batch is now pass_images") as caught:
        net = tiny_net().compile(batch=4, bits="4")
    assert net.pass_images == 4 and len(caught) == 1 and caught[0].filename == __file__  # the caller's line
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="pass_images must be a positive integer"):
        tiny_net().compile(batch=0, bits="4")


def test_the_old_attribute_batch_still_reads_for_a_release_with_a_warning():
    net = tiny_net().compile(pass_images=3, bits="4")
    with pytest.warns(DeprecationWarning, match=r"Net\.batch is now Net\.pass_images") as caught:
        assert net.batch == 3
    assert caught[0].filename == __file__
    with pytest.raises(AttributeError):
        net.batch = 4  # read-only: the net's pass size changes by compiling again
    assert net.pass_images == 3


def test_the_old_and_new_keyword_together_are_refused():
    for call in ("compile", "plan"):
        with pytest.raises(TypeError, match=rf"^Net\.{call}\(\)'s batch is pass_images' old name: give pass_images "
                                            "alone$"):
            getattr(tiny_net(), call)(pass_images=4, batch=4, bits="4")
        with pytest.raises(TypeError, match=rf"^Net\.{call}\(\) missing required keyword-only argument: "
                                            "'pass_images'$"):
            getattr(tiny_net(), call)(bits="4")


def test_the_new_keyword_and_attribute_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net = tiny_net().compile(pass_images=4, bits="4")
        net.plan(pass_images=2, bits="4")
        assert net.pass_images == 4


def test_plan_refuses_what_compile_refuses():
    odd = odd_net()
    with pytest.raises(ValueError, match="multiple of 2"):
        odd.plan(pass_images=2, bits="4")
    with pytest.raises(ValueError, match="multiple of 4"):
        odd.plan(pass_images=2, bits="2")
    odd.plan(pass_images=2, bits="exact")  # any channel count in exact mode


def test_a_diverged_net_can_still_be_recompiled():
    """compile() keeps the net's own state, whatever it holds: the next forward says the loss is NaN."""
    net = tiny_net().compile(pass_images=4, bits="4")
    net.params[0] = np.nan
    net.compile(pass_images=2, bits="4")
    assert np.isnan(host(net.params)[0])
