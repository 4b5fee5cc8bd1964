"""checks.py: what a caller hands the net, accepted exactly when it is what the message says is expected.
(The same checks through the Net API, and that a refused step leaves nothing behind: tests/test_api_errors.py.)"""
from types import SimpleNamespace

import numpy as np
import pytest

from minibp import checks


@pytest.mark.parametrize("value, expected", [(1, 1), (128, 128), (np.int64(3), 3), (4.0, 4), (np.float32(2), 2)])
def test_positive_int_takes_positive_whole_numbers(value, expected):
    assert checks.positive_int(value, "batch") == expected and type(checks.positive_int(value, "batch")) is int


@pytest.mark.parametrize("value", [0, -1, 2.7, True, "8", None, float("nan"), float("inf")])
def test_positive_int_refuses_the_rest(value):
    with pytest.raises((ValueError, OverflowError), match="batch must be a positive integer"):
        checks.positive_int(value, "batch")


@pytest.mark.parametrize("value", [-1, 1.0, False, "0"])
def test_index_takes_whole_numbers_from_zero(value):
    assert checks.index(0, "unit") == 0 and checks.index(np.int32(5), "unit") == 5
    with pytest.raises(ValueError, match="unit must be a whole number >= 0"):
        checks.index(value, "unit")


def test_net_input_is_three_positive_sizes_and_a_float_type():
    assert checks.net_input((32, 32, 3), "float64") == ((32, 32, 3), np.float64)
    for shape in [(32, 32), (32, 0, 3), (1, 2, 3, 4)]:
        with pytest.raises(ValueError, match="input_shape is \\(H, W, C\\)"):
            checks.net_input(shape, np.float32)
    with pytest.raises(ValueError, match="dtype must be float32 \\(or float64 for gradient checks\\), got float16"):
        checks.net_input((8, 8, 3), np.float16)


def test_channels_must_fill_whole_code_bytes_at_k_bits():
    units = [SimpleNamespace(index=0, bn_channels=12), SimpleNamespace(index=1, bn_channels=6)]
    checks.check_channels(units, 0)  # exact: anything
    checks.check_channels(units, 8)
    checks.check_channels(units, 4)
    with pytest.raises(ValueError, match="unit 1 has 6 channels: at 2 bits the channel count must be a multiple of 4"):
        checks.check_channels(units, 2)


def test_images_are_nhwc_of_the_nets_dtype():
    checks.check_images(np.zeros((2, 8, 8, 3), np.float32), (8, 8, 3), np.float32)
    with pytest.raises(ValueError, match="images must be \\(N, 8, 8, 3\\) NHWC, got \\(2, 3, 8, 8\\)"):
        checks.check_images(np.zeros((2, 3, 8, 8), np.float32), (8, 8, 3), np.float32)
    with pytest.raises(ValueError, match="got list"):
        checks.check_images([[0.0]], (8, 8, 3), np.float32)
    with pytest.raises(ValueError, match="images must be float32 \\(the net's dtype\\), got float64"):
        checks.check_images(np.zeros((2, 8, 8, 3)), (8, 8, 3), np.float32)


def test_labels_are_n_integers_below_the_class_count():
    checks.check_labels(np.array([0, 4, 2]), 3, 5)
    checks.check_labels(np.array([], np.int64), 0, 5)
    with pytest.raises(TypeError, match="labels must be an integer array of shape \\(3,\\), got list"):
        checks.check_labels([0, 1, 2], 3, 5)
    with pytest.raises(ValueError, match="labels must be 3 integers"):
        checks.check_labels(np.array([0.0, 1.0, 2.0]), 3, 5)
    with pytest.raises(ValueError, match="labels must be 3 integers"):
        checks.check_labels(np.array([0, 1]), 3, 5)
    with pytest.raises(ValueError, match="labels must lie in \\[0, 5\\), got values from -1 to 2"):
        checks.check_labels(np.array([0, -1, 2]), 3, 5)
    with pytest.raises(ValueError, match="got values from 0 to 5"):
        checks.check_labels(np.array([0, 5, 2]), 3, 5)
