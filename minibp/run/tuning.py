"""What a fine-tune (or any run on data of its own) may choose beyond the optimizer: which units stay frozen, and how
the training loss weights its classes. Each is an option's text, read here into what the net and optimizer take:

    frozen = frozen_units("0-15,18", units=56, classifier=55)       # (0, 1, ..., 15, 18): optim.SGD(frozen=...)
    frozen_units("all-but-classifier", units=56, classifier=55)     # (0, ..., 54)
    recorded_weights("weights.txt")      # "1.0,2.5,0.5": a file's numbers, as the run records them (it then
                                         #   stands without the file)
    weights = class_weights("balanced", labels, classes=10)     # (10,) float64: Net.compile(class_weights=...)

--freeze UNITS: unit indices (as python3 -m minibp.plan lists them) and ranges A-B, comma-separated, or
all-but-classifier. A frozen unit's parameters and optimizer state stay exactly as loaded (optim.py); its batch
normalisation still follows the data's statistics in training.

--class-weights balanced|FILE|W,W,...: one weight a class, in label order. balanced weights class c by
N / (K n_c), N images in K classes, n_c of class c (a class without images weighs 0), so that every class
carries the loss of an equal share of the data (K: the classes that have training images); the mean over a
batch stays a mean over its images, so the weights of a balanced set are all 1 and change nothing. A FILE holds the numbers, separated by commas, spaces
or lines.
"""
import re
from pathlib import Path

import numpy as np

ALL_BUT_CLASSIFIER = "all-but-classifier"
BALANCED = "balanced"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def freeze_syntax(text):
    """Whether text is --freeze's: all-but-classifier, or comma-separated indices and ranges A-B (A <= B)."""
    if not isinstance(text, str):
        return False
    if text == ALL_BUT_CLASSIFIER:
        return True
    parts = [_RANGE.match(part.strip()) for part in text.split(",")]
    return all(m is not None and (m.group(2) is None or int(m.group(1)) <= int(m.group(2))) for m in parts)


def frozen_units(text, *, units, classifier):
    """The frozen units' indices, sorted, of a net of `units` units whose classifier is unit `classifier`; a one-line
    ValueError for an index beyond the net, or a text that would freeze every unit (nothing would train)."""
    if text is None:
        return ()
    if text == ALL_BUT_CLASSIFIER:
        frozen = set(range(units)) - {classifier}
    else:
        frozen = set()
        for part in text.split(","):
            low, high = _RANGE.match(part.strip()).groups()
            frozen.update(range(int(low), int(high or low) + 1))
    beyond = sorted(i for i in frozen if i >= units)
    if beyond:
        raise ValueError(f"--freeze {text}: the net has {units} units (0-{units - 1}), not unit {beyond[0]} "
                         "(python3 -m minibp.plan lists them)")
    if len(frozen) == units:
        raise ValueError(f"--freeze {text} freezes every unit of the net: nothing would train")
    return tuple(sorted(frozen))


def describe_frozen(frozen, units):
    """'units 0-15, 18 (16 of 56)' for a header."""
    runs = []
    for i in frozen:
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)
    return f"unit{'s' * (len(frozen) > 1)} {text} ({len(frozen)} of {units})"


def _numbers(text):
    """The non-negative finite numbers a text lists (commas, spaces or lines between them), or None if it is not
    such a list."""
    words = [w for w in re.split(r"[,\s]+", text.strip()) if w]
    try:
        values = [float(w) for w in words]
    except ValueError:
        return None
    if not values or not all(np.isfinite(v) and v >= 0 for v in values):
        return None
    return values


def weights_syntax(text):
    """Whether text may be --class-weights' value: balanced, a list of numbers, or a file's path (read later)."""
    return isinstance(text, str) and text.strip() != ""


def recorded_weights(text):
    """--class-weights as a run records it: balanced, or the numbers themselves (a FILE read now, so that the run
    stands without it); a one-line ValueError for a file that cannot be read or holds other than numbers."""
    if text == BALANCED or _numbers(text) is not None:
        return text if text == BALANCED else ",".join(repr(v) for v in _numbers(text))
    path = Path(text)
    if not path.is_file():
        raise ValueError(f"--class-weights {text}: neither balanced, a list of numbers (1,2.5,0.5), nor a file")
    try:
        values = _numbers(path.read_text(encoding="utf-8", errors="strict"))
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--class-weights: cannot read {text} ({getattr(e, 'strerror', None) or e})") from None
    if values is None:
        raise ValueError(f"--class-weights: {text} must hold non-negative numbers, one a class, separated by commas, "
                         "spaces or lines")
    return ",".join(repr(v) for v in values)


def class_weights(text, labels, *, classes):
    """(classes,) float64 weights of a run's --class-weights (recorded_weights' form) on its training labels; None
    for None. A one-line ValueError where the count is not the classes' or every weight is 0."""
    if text is None:
        return None
    if text == BALANCED:
        counts = np.bincount(np.asarray(labels), minlength=classes).astype(np.float64)
        present = int((counts > 0).sum())  # (sklearn's rule too: the classes the labels hold)
        return np.divide(len(labels), present * counts, out=np.zeros(classes), where=counts > 0)
    weights = np.array(_numbers(text), np.float64)
    if len(weights) != classes:
        raise ValueError(f"--class-weights gives {len(weights)} weights; the data has {classes} classes (one a class, "
                         "in label order)")
    if not weights.any():
        raise ValueError("--class-weights are all 0: nothing would train")
    return weights
