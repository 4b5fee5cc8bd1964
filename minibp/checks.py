"""Checks of what a caller hands the net and the training step, each a ValueError or TypeError that says
what was expected, raised before anything runs."""
import numpy as np


def positive_int(value, what):
    """value as an int if it is a positive whole number (not a bool, not 2.7), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, np.floating)) \
            or not float(value).is_integer() or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def index(value, what):
    """value as an int if it is a whole number >= 0 (not a bool), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{what} must be a whole number >= 0, got {value!r}")
    return int(value)


def net_input(input_shape, dtype):
    """(input_shape, dtype) of a Net, checked: (H, W, C) of positive ints, float32 or float64."""
    if len(input_shape) != 3 or min(input_shape) < 1:
        raise ValueError(f"input_shape is (H, W, C), got {input_shape}")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 (or float64 for gradient checks), got {dtype}")
    return tuple(int(s) for s in input_shape), dtype


def check_channels(units, bits):
    """At k bits a batch-norm unit's channel count must be a multiple of 8 / k (a code byte holds 8 / k channels of
    one row); bits: every unit's k (0: exact), or a list of each unit's."""
    for u, k in zip(units, [bits] * len(units) if isinstance(bits, int) else bits):
        if k and u.bn_channels % (8 // k):
            raise ValueError(f"unit {u.index} has {u.bn_channels} channels: at {k} bits the channel count "
                             f"must be a multiple of {8 // k}")


def check_images(images, shape, dtype):
    """Images must be an (N,) + shape NHWC array of dtype."""
    if not hasattr(images, "shape") or images.ndim != 4 or tuple(images.shape[1:]) != shape:
        raise ValueError(f"images must be (N, {', '.join(map(str, shape))}) NHWC, got "
                         f"{getattr(images, 'shape', type(images).__name__)}")
    if images.dtype != dtype:
        raise ValueError(f"images must be {np.dtype(dtype)} (the net's dtype), got {images.dtype}")


def check_labels(labels, n, classes):
    """Labels must be an array of n integers in [0, classes)."""
    if not hasattr(labels, "dtype") or not hasattr(labels, "shape"):
        raise TypeError(f"labels must be an integer array of shape ({n},), got {type(labels).__name__}")
    if labels.shape != (n,) or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be {n} integers (shape ({n},)), got {labels.dtype} of shape {labels.shape}")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"labels must lie in [0, {classes}), got values from {int(labels.min())} to "
                         f"{int(labels.max())}")
