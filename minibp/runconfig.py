"""A training run's configuration: the options of python -m minibp.train, the paper's settings as their
defaults (ImageNet's when --data imagenet), the checks a configuration passes before anything runs, and
what a resumed run keeps (DEFINING) or may change (CHANGEABLE). A run's configuration is the dict that
new_config makes from the command line and its checkpoint saves; resumed_config applies the changes a
resume gives to the saved one.
"""
import argparse
from pathlib import Path

import numpy as np

from . import data, models
from .quant import BITS, DEFAULT_WINDOW, WINDOWS

REFERENCE_SCHEDULE = "0:0.01,400:0.1,32000:0.01,48000:0.001"  # the paper's recipe, for 64k iterations
# ImageNet: the paper's code's setting (ResNet-152, batch 256, 640k iterations, weight decay 1e-4, the rate
# divided by 10 every 160k iterations); validation about once an epoch (5,004 iterations).
IMAGENET_SCHEDULE = "0:0.1,160000:0.01,320000:0.001,480000:0.0001"
IMAGENET_DEFAULTS = dict(model="resnet152", data_dir="data/imagenet", batch=256, iters=640000, image_size=224,
                         lr_schedule=IMAGENET_SCHEDULE, weight_decay=1e-4, val_every=5000, checkpoint_every=1000)
# Options that define a run: a resumed run must keep them. The others may change on resume.
DEFINING = ("data", "model", "bits", "window", "batch", "split", "seed", "momentum", "weight_decay", "no_augment",
            "image_size")
CHANGEABLE = ("data_dir", "iters", "lr_schedule", "log_every", "val_every", "checkpoint_every", "graph", "workers")


def parse_schedule(text):
    """'0:0.01,400:0.1,...' -> [(0, 0.01), (400, 0.1), ...]: the rate from each iteration on."""
    try:
        steps = sorted((int(it), float(lr)) for it, lr in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise ValueError(f"a learning-rate schedule is ITER:LR[,ITER:LR...], e.g. {REFERENCE_SCHEDULE}; "
                         f"got {text!r}") from None
    if not steps or steps[0][0] != 0 or any(lr < 0 or not np.isfinite(lr) for _, lr in steps):
        raise ValueError(f"the schedule must start at iteration 0 with finite non-negative rates, got {text!r}")
    repeated = sorted({it for (it, _), (nxt, _) in zip(steps, steps[1:]) if it == nxt})
    if repeated:
        raise ValueError(f"the schedule gives iteration {repeated[0]} more than one rate: {text!r}")
    return steps


def learning_rate(schedule, iteration):
    return [lr for start, lr in schedule if start <= iteration][-1]


def build_parser(*, description=None):
    """The command line of python -m minibp.train (its module docstring, the description of --help)."""
    p = argparse.ArgumentParser(prog="python -m minibp.train", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=data.DATASETS + ("imagenet",), default="cifar10",
                   help="imagenet: its folder of JPEGs, with the paper's ImageNet setting as the defaults")
    p.add_argument("--data-dir", default="data", help="where datasets/prepare.py wrote <data>.h5 (default: data); "
                   "for imagenet the folder holding train/<class>/ and val/<class>/ (default: data/imagenet)")
    p.add_argument("--model", default="resnet164", help="resnet<9n+2>: resnet20, resnet164 (default), resnet1001; "
                   "on imagenet resnet50, resnet101, resnet152 (default)")
    p.add_argument("--image-size", type=int, help="imagenet: the side of the training and validation crops "
                   "(default 224)")
    p.add_argument("--workers", type=int, help="imagenet: JPEG-decoding processes (default: the cores less one)")
    p.add_argument("--bits", choices=list(BITS), default="4",
                   help="activation store: exact, 8, 4 (default), 2, or naive (4 bits fed forward: the ablation)")
    p.add_argument("--window", choices=list(WINDOWS), default=DEFAULT_WINDOW,
                   help=f"the k-bit codes' window per channel: range (the batch's range of values), block (each "
                        f"256 pixels' range) or fixed (the paper's, +-3 sigma); default {DEFAULT_WINDOW}")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--split", type=int, default=1, help="sub-batches a batch is computed in (gradients accumulate)")
    p.add_argument("--iters", type=int, default=64000, help="iterations in all (default 64000)")
    p.add_argument("--lr-schedule", default=REFERENCE_SCHEDULE, help=f"ITER:LR,... (default {REFERENCE_SCHEDULE})")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=2e-4)
    p.add_argument("--no-augment", action="store_true", help="no pad-and-crop or flips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="run folder (default: runs/<data>-<model>-<bits>[-<window>]-seed<seed>, "
                   "the window named when it is not the default)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start a new run in an --out that holds one")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--val-every", type=int, default=400)
    p.add_argument("--checkpoint-every", type=int, default=400)
    p.add_argument("--graph", action="store_true",
                   help="replay each training step as one CUDA graph (GPU; on the CPU steps run eagerly)")
    p.add_argument("--rank-timeout", type=float, default=60.0,
                   help="under mpirun: seconds a rank waits for the others before it stops the job (default 60)")
    return p


def given_options(argv):
    """The options present on the command line, {dest: value}, told apart from defaults."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def check_config(config, *, ranks=1):
    """ranks: the processes under mpirun; config["split"] counts the sub-batches of a step over all of them."""
    if config["batch"] < 1 or config["split"] < 1 or config["batch"] % config["split"]:
        split = f"{ranks} ranks x --split {config['split'] // ranks}" if ranks > 1 else "--split"
        raise ValueError(f"--batch ({config['batch']}) must be a positive multiple of {split} ({config['split']})")
    if config["split"] % ranks:
        raise ValueError(f"the run computes a batch in {config['split']} sub-batches, which {ranks} ranks cannot "
                         "share evenly: run it on a number of ranks that divides them")
    if config["iters"] < 1:
        raise ValueError("--iters must be positive")
    for key in ("log_every", "val_every", "checkpoint_every"):
        if config[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be positive")
    models.depth_of(config["model"], imagenet=config["data"] == "imagenet")
    parse_schedule(config["lr_schedule"])
    if config.get("image_size") is not None and config["data"] != "imagenet":
        raise ValueError("--image-size applies to --data imagenet only")
    if config["data"] == "imagenet" and (config["image_size"] < 32 or config["image_size"] % 32):
        raise ValueError(f"--image-size must be a multiple of 32 (the net halves it five times), got "
                         f"{config['image_size']}")
    if config.get("workers") is not None and config["workers"] < 1:
        raise ValueError("--workers must be positive")


def new_config(args, *, ranks=1):
    config = {k: v for k, v in vars(args).items() if k not in ("resume", "overwrite", "out", "rank_timeout")}
    config["data_dir"] = str(Path(args.data_dir).resolve())  # a run resumes from any folder
    # the sub-batches of a step over all ranks: ranks x split defines the run, so that 2 ranks x --split 1
    # and 1 process x --split 2, which compute the same step, resume each other's checkpoints
    config["split"] = args.split * ranks
    return config


def _whole(low):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(low):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= low


_FLAG = (lambda v: isinstance(v, bool), "true or false")
_TEXT = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
# A saved configuration's fields: (check, what it must be); OPTIONAL ones, absent from older runs, take the
# default given there.
FIELDS = dict(data=(lambda v: v in data.DATASETS + ("imagenet",), "a data set's name"), data_dir=_TEXT,
              model=_TEXT, bits=(lambda v: v in BITS, f"one of {', '.join(BITS)}"),
              window=(lambda v: v in WINDOWS, f"one of {', '.join(WINDOWS)}"),
              batch=(_whole(1), "a positive integer"), split=(_whole(1), "a positive integer"),
              iters=(_whole(1), "a positive integer"), seed=(_whole(0), "a non-negative integer"),
              lr_schedule=_TEXT, momentum=(_real(0), "a finite non-negative number"),
              weight_decay=(_real(0), "a finite non-negative number"), no_augment=_FLAG,
              log_every=(_whole(1), "a positive integer"), val_every=(_whole(1), "a positive integer"),
              checkpoint_every=(_whole(1), "a positive integer"), graph=_FLAG,
              image_size=(lambda v: v is None or _whole(1)(v), "a positive integer or null"),
              workers=(lambda v: v is None or _whole(1)(v), "a positive integer or null"))
OPTIONAL = dict(window="fixed",  # runs from before the option coded through the paper's window
                graph=False, image_size=None, workers=None)


def saved_config(saved):
    """A checkpoint's configuration, each field checked (type and range) and the whole by check_config,
    before anything reads it: a ValueError naming the checkpoint and the field otherwise."""
    config = dict(OPTIONAL, **saved.config)
    for name, (check, what) in FIELDS.items():
        if name not in config:
            raise ValueError(f"{saved.path} is damaged: its configuration lacks {name}")
        if not check(config[name]):
            raise ValueError(f"{saved.path} is damaged: its configuration's {name} is {config[name]!r}, not {what}")
    try:
        check_config(config)
    except ValueError as e:
        raise ValueError(f"{saved.path} holds a configuration that cannot run: {e}") from None
    return config


def resumed_config(saved, given, ckpt_path, *, ranks=1):
    """The saved configuration with the changeable options given now applied; a ValueError listing
    any defining option given with another value than the run's. ranks: as new_config."""
    config = saved_config(saved)
    if "split" in given:
        given = dict(given, split=given["split"] * ranks)
    differ = [f"--{k.replace('_', '-')} {given[k]} (the run has {config.get(k)})" if k != "split" or ranks == 1 else
              f"{ranks} ranks x --split {given[k] // ranks} (the run has {config.get(k)} sub-batches a step)"
              for k in DEFINING if k in given and given[k] != config.get(k)]
    if differ:
        raise ValueError(f"{ckpt_path} was trained with other options; a resumed run keeps them: "
                         + "; ".join(differ))
    changed = {k: [config.get(k), given[k]] for k in CHANGEABLE if k in given and given[k] != config.get(k)}
    for key, (_, new) in changed.items():
        config[key] = new
    if "data_dir" in changed:
        config["data_dir"] = str(Path(config["data_dir"]).resolve())
    return config, changed


def apply_data_defaults(args, given):
    """With --data imagenet, the paper's ImageNet setting (IMAGENET_DEFAULTS) for every option the command
    line does not give."""
    if args.data == "imagenet":
        for key, value in IMAGENET_DEFAULTS.items():
            if key not in given:
                setattr(args, key, value)
    return args
