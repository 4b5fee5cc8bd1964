"""Shared by the research benchmarks: nets of one architecture in several modes, sharing weights, and
their parameter gradients on a batch.

A mode names a store as the trainer's options do: "exact", "naive", or k bits and a window, "4:range",
"4:fixed" ("4" alone: the default window), rounded at random ("2:block:stochastic"), through another clip
than the default ("2:block:stochastic:clip=4", in standard deviations: the trainer's --clip)."""
import tempfile
from pathlib import Path

import numpy as np

from minibp import backend, models
from minibp.io import data
from minibp.io.batches import Batches
from minibp.plot import store_style
from minibp.quant import DEFAULT_ROUNDING, DEFAULT_WINDOW, check_rounding, check_window, parse_bits


def store_options(mode):
    """'4:range' -> dict(bits='4', window='range', rounding='nearest'); '2:block:stochastic' rounds at random;
    '2:block:stochastic:clip=4' adds clip=4.0 (quant.Store's); exact and naive have no window of their choosing.
    'memory=323MiB' -> dict(memory='323MiB'): the trainer's --memory, which chooses each unit's bits itself."""
    if str(mode).startswith("memory="):
        return dict(memory=str(mode)[len("memory="):])
    parts = str(mode).split(":")
    clip = None
    if len(parts) == 4 and parts[3].startswith("clip="):
        clip = float(parts.pop()[len("clip="):])
    bits, window, rounding = (parts + ["", ""])[:3]
    if len(parts) > 3:
        raise ValueError(f"a mode is BITS[:WINDOW[:ROUNDING[:clip=SIGMA]]], got {mode!r}")
    parse_bits(bits)
    options = dict(bits=bits, window=check_window(window or DEFAULT_WINDOW),
                   rounding=check_rounding(rounding or DEFAULT_ROUNDING))
    return options if clip is None else dict(options, clip=clip)


def label(mode):
    """A mode as tables print it: 'exact', 'naive', '4 range', '2 block sr' (stochastic rounding)."""
    options = store_options(mode)
    if "memory" in options:
        return f"memory {options['memory']}"
    if options["bits"] in ("exact", "naive"):
        return options["bits"]
    return (f"{options['bits']} {options['window']}" + (" sr" if options["rounding"] == "stochastic" else "")
            + (f" clip {options['clip']:g}" if "clip" in options else ""))


def line_style(mode):
    """Plot style of a mode: a colour per store precision, a line style per window, dots for stochastic rounding."""
    options = store_options(mode)
    style = store_style(options["bits"], options["window"])
    return style | (dict(marker="o", markersize=3, markevery=4) if options["rounding"] == "stochastic" else {})


def sample_batch(data_name, data_dir, *, quick, batch, seed=0):
    """(images float32 (N, H, W, C) normalised, labels (N,), classes): a random batch of a real training
    split, or random 8x8 data when quick (so the smoke run needs no data set)."""
    rng = np.random.default_rng(seed)
    if quick:
        return rng.standard_normal((batch, 8, 8, 1)).astype(np.float32), rng.integers(0, 10, batch), 10
    split = data.load_split(data.dataset_path(data_dir, data_name), "train")
    order = rng.permutation(len(split.labels))[:batch]
    images = split.images[order].astype(np.float32) * np.float32(1 / 255) - split.pixel_mean()
    return images, split.labels[order], split.classes


def compile_modes(model, modes, *, input_shape, classes, batch, seed=0):
    """{mode: compiled net}, all with the same initial weights (same seed)."""
    return {m: models.by_name(model, input_shape=input_shape, classes=classes).compile(pass_images=batch, seed=seed,
                                                                                      **store_options(m))
            for m in modes}


def copy_weights(source, target):
    target.params[...] = source.params


def weight_gradients(net, images, labels):
    """{unit index: dL/dw of its conv (host float64)} on one batch, batch statistics in BN."""
    net.zero_grad()
    net.forward(images, labels)
    net.backward()
    return {u.index: backend.to_host(u.g["w"]).astype(np.float64).ravel() for u in net.units}


def relative_error(approximate, exact):
    return float(np.linalg.norm(approximate - exact) / max(np.linalg.norm(exact), 1e-30))


def pyplot_or_none():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        print("(no plot: pip install 'minibp[plot]' for matplotlib)")
        return None


def out_path(path, *, default, parser, args):
    """Where to write a result: the path given (its folder made), else the committed default, but only for
    the run that made it, with every option at its default (--data-dir aside). Any other run (--quick,
    other modes, points, depths, clips...) writes to a temporary folder: it never overwrites a committed
    result with one that its command beside it in the README would not give."""
    if path is None:
        made_it = all(getattr(args, name) == parser.get_default(name) for name in vars(args)
                      if name not in ("plot", "out", "data_dir"))
        path = default if made_it else Path(tempfile.mkdtemp(prefix="minibp-bench-")) / Path(default).name
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return str(path)


def flat_gradient(net, images, labels):
    """The whole parameter gradient (host float64, flat) of one batch, batch statistics in BN."""
    net.forward(images, labels, draw=0)
    net.backward(accumulate=False)
    return backend.to_host(net.grads).astype(np.float64)


def probe_batches(split, mean, batch, count, *, seed, augment=False):
    """count batches of a data.Split (images on the device, labels), drawn as a run draws them."""
    batches = Batches(split, batch=batch, mean=mean, augment=("crop", "flip") if augment else (), seed=seed)
    return [batches.next() for _ in range(count)]


def cifar_shaped(split):
    """A 28x28 grey data.Split as the paper's CIFAR shape: padded to 32x32 (with zeros) and in three channels, so
    that a CIFAR net's plans are the paper's and its gradients come from real images."""
    images = np.repeat(np.pad(split.images, ((0, 0), (2, 2), (2, 2), (0, 0))), 3, axis=3)
    return data.Split(images, split.labels, split.classes, f"{split.name}-32x32x3")
