"""A training run's configuration: the options of python3 -m minibp.train, the paper's settings as their
defaults (ImageNet's when --data imagenet), the checks a configuration passes before anything runs, and
what a resumed run keeps (DEFINING) or may change (CHANGEABLE). A run's configuration is the dict that
new_config makes from the command line and its checkpoint saves; resumed_config applies the changes a
resume gives to the saved one.

    --lr-schedule 0:0.01,400:0.1,32000:0.01       StepSchedule: the rate from each iteration on
    --lr-schedule cosine:0.1:warmup=200           CosineSchedule: linear warm-up, then a half cosine to 0
    --model FILE.py:FUNCTION --model-arg width=32 your own net (modelspec.build), its arguments Python literals

A schedule is recorded as its text (lr_schedule, which a resume may change) and parsed for the run's
iterations (parse_schedule); your own net's arguments as JSON (model_args, which a resume must keep).
"""
import argparse
import ast
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import data
from ..optim import OPTIMIZERS
from ..quant import BITS, DEFAULT_ROUNDING, DEFAULT_WINDOW, ROUNDINGS, WINDOWS, Store
from . import modelspec

REFERENCE_SCHEDULE = "0:0.01,400:0.1,32000:0.01,48000:0.001"  # the paper's recipe, for 64k iterations
# ImageNet: the paper's code's setting (ResNet-152, batch 256, 640k iterations, weight decay 1e-4, the rate
# divided by 10 every 160k iterations); validation about once an epoch (5,004 iterations).
IMAGENET_SCHEDULE = "0:0.1,160000:0.01,320000:0.001,480000:0.0001"
IMAGENET_DEFAULTS = dict(model="resnet152", data_dir="data/imagenet", batch=256, iters=640000, image_size=224,
                         lr_schedule=IMAGENET_SCHEDULE, weight_decay=1e-4, val_every=5000, checkpoint_every=1000)
# Options that define a run: a resumed run must keep them. The others may change on resume.
DEFINING = ("data", "model", "model_args", "bits", "window", "rounding", "batch", "split", "seed", "optimizer",
            "momentum", "weight_decay", "clip_norm", "augment", "val_split", "image_size")
CHANGEABLE = ("data_dir", "data_file", "iters", "lr_schedule", "log_every", "val_every", "checkpoint_every", "graph",
              "workers")
SGD_DECAY, ADAMW_DECAY = 2e-4, 0.05  # --weight-decay's defaults (the paper's for SGD; AdamW's usual)
BUILT_IN_AUGMENT = "crop,flip"  # the paper's, for the data sets minibp.prepare writes (and ImageNet's reader)


STEPS_SYNTAX = f"ITER:LR[,ITER:LR...], e.g. {REFERENCE_SCHEDULE}"
COSINE_SYNTAX = "cosine:PEAK[:warmup=ITERS], e.g. cosine:0.1:warmup=200"


@dataclass(frozen=True)
class StepSchedule:
    """'0:0.01,400:0.1,...': the rate from each iteration on (the paper's)."""
    steps: tuple  # ((iteration, rate), ...) from iteration 0, sorted

    def rate(self, iteration):
        return [lr for start, lr in self.steps if start <= iteration][-1]

    def divided(self, by):
        """The schedule's text with every rate divided by `by` (a diverged run's advice)."""
        return ",".join(f"{it}:{lr / by:g}" for it, lr in self.steps)


@dataclass(frozen=True)
class CosineSchedule:
    """'cosine:PEAK[:warmup=W]': a linear warm-up to PEAK over the first W iterations, PEAK * (t + 1) / W at
    iteration t (the first step already moves), then a half cosine from PEAK down towards 0 at the run's
    end, PEAK * (1 + cos(pi * (t - W) / (iters - W))) / 2. It stretches with --iters when a resume changes it."""
    peak: float
    warmup: int
    iters: int

    def rate(self, iteration):
        if iteration < self.warmup:
            return self.peak * (iteration + 1) / self.warmup
        return self.peak * (1 + math.cos(math.pi * (iteration - self.warmup) / (self.iters - self.warmup))) / 2

    def divided(self, by):
        return f"cosine:{self.peak / by:g}" + (f":warmup={self.warmup}" if self.warmup else "")


def parse_schedule(text, *, iters):
    """A schedule's text (--lr-schedule) -> StepSchedule or CosineSchedule (for a run of `iters` iterations,
    which a cosine needs), or a ValueError that gives the syntax."""
    if text.startswith("cosine:"):
        return _cosine(text, iters)
    try:
        steps = sorted((int(it), float(lr)) for it, lr in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise ValueError(f"a learning-rate schedule is {STEPS_SYNTAX}, or {COSINE_SYNTAX}; got {text!r}") from None
    if not steps or steps[0][0] != 0 or any(lr < 0 or not np.isfinite(lr) for _, lr in steps):
        raise ValueError(f"the schedule must start at iteration 0 with finite non-negative rates, got {text!r}")
    repeated = sorted({it for (it, _), (nxt, _) in zip(steps, steps[1:]) if it == nxt})
    if repeated:
        raise ValueError(f"the schedule gives iteration {repeated[0]} more than one rate: {text!r}")
    return StepSchedule(tuple(steps))


def _cosine(text, iters):
    parts = text.split(":")
    try:
        peak = float(parts[1])
        options = dict(part.split("=") for part in parts[2:])
        warmup = int(options.pop("warmup", 0))
    except ValueError:
        raise ValueError(f"a cosine schedule is {COSINE_SYNTAX}; got {text!r}") from None
    if len(parts) > 3 or options or not np.isfinite(peak) or peak < 0 or warmup < 0:
        raise ValueError(f"a cosine schedule is {COSINE_SYNTAX}, a finite non-negative PEAK; got {text!r}")
    if warmup >= iters:
        raise ValueError(f"the schedule's warm-up ({warmup} iterations) must end before the run does "
                         f"(--iters {iters}): {text!r}")
    return CosineSchedule(peak, warmup, iters)


def parse_model_arg(text):
    """--model-arg NAME=VALUE -> (NAME, VALUE), VALUE a Python literal (ast.literal_eval)."""
    name, equals, value = text.partition("=")
    if not equals or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise argparse.ArgumentTypeError(f"{text!r}: VALUE must be a Python literal, e.g. 32, 0.5, "
                                         "\"'max'\" (quoted), True, None or [64, 128]") from None


def model_args(pairs):
    """The keyword arguments of your own net's function as a run records them (JSON: a tuple becomes a list, so
    the function gets the same value when a resume or python3 -m minibp.evaluate builds the net again); pairs:
    [(name, value)] or a dict. A ValueError for a name given twice or a value JSON cannot hold."""
    pairs = list(pairs.items()) if isinstance(pairs, dict) else list(pairs)
    recorded = {}
    for name, value in pairs:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"a model argument's name must be an identifier, got {name!r}")
        if name in recorded:
            raise ValueError(f"model argument {name} is given twice")
        try:
            recorded[name] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            raise ValueError(f"model argument {name}={value!r} cannot be recorded in the checkpoint: give numbers, "
                             "strings, True, False, None, or lists and dicts of them") from None
    return recorded


def store_of(config):
    """The activation store (quant.Store) a checked configuration names; str() of it is the store in the words
    of every message: "bits 4 (block window)", "bits exact"."""
    return Store(config["bits"], config["window"], config.get("rounding", DEFAULT_ROUNDING))


# The options another command shares with the trainer (python3 -m minibp.plan), declared once: argparse's
# keywords for each. build_parser adds them as they are, another command through add_option, with its changes.
SHARED_OPTIONS = dict(
    data=dict(choices=data.DATASETS + ("imagenet",), default="cifar10",
              help="the data set (default cifar10); imagenet: its folder of JPEGs, with the paper's ImageNet "
                   "setting as the defaults"),
    model=dict(metavar="SPEC", default="resnet164",
               help="resnet<9n+2> (resnet20, resnet164, resnet1001; default resnet164), on imagenet resnet50, "
                    "resnet101 or resnet152 (default); or your own net: FILE.py:FUNCTION or package.module:FUNCTION, "
                    "called with input_shape=, classes= and the --model-arg values, returning an uncompiled "
                    "minibp.net.Net"),
    batch=dict(metavar="N", type=int, default=128, help="images a step (default 128; 256 on imagenet)"),
    bits=dict(choices=list(BITS), default="4",
              help="activation store: exact, 8, 4 (default), 2, or naive (4 bits fed forward: the ablation)"),
    window=dict(choices=list(WINDOWS), default=DEFAULT_WINDOW,
                help=f"the k-bit codes' window per channel: range (the batch's range of values), block (each 256 "
                     f"pixels' range) or fixed (the paper's, +-3 sigma); default {DEFAULT_WINDOW}"),
)


def add_option(parser, name, **changes):
    """Add the trainer's option `name` (a key of SHARED_OPTIONS) to a parser or argument group, its declaration
    with `changes` (another help, default, metavar or choices: a command's own reading of the option)."""
    return parser.add_argument(option(name), **dict(SHARED_OPTIONS[name], **changes))


def build_parser(*, description=None, exit_on_error=True):
    """The command line of python3 -m minibp.train (its module docstring, the description of --help).
    exit_on_error=False: a bad value is an argparse.ArgumentError (train.fit), not an exit."""
    p = argparse.ArgumentParser(prog="python3 -m minibp.train", description=description, exit_on_error=exit_on_error,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("model and data")
    add_option(g, "data")
    g.add_argument("--data-dir", metavar="DIR", default="data",
                   help="the folder of the prepared <data>.h5 (default data); for imagenet the folder holding "
                        "train/<class>/ and val/<class>/ (default data/imagenet)")
    g.add_argument("--data-file", metavar="PATH",
                   help="train on this file that minibp.io.data.write made, under the file's own name (instead of "
                        "--data; default none)")
    g.add_argument("--augment", metavar="LIST",
                   help=f"the training images' transforms: none, or a comma-separated list of "
                        f"{', '.join(data.AUGMENTS)} (crop: zero-pad 4 pixels, a random window; flip: horizontal, "
                        f"half the time); default {BUILT_IN_AUGMENT} for --data (the paper's), none for --data-file")
    g.add_argument("--val-split", metavar="FRACTION", type=float,
                   help="validate on this fraction of the training split, held out from training (the same images "
                        "every time); default: the data file's val split where it has one, else the test split")
    add_option(g, "model")
    g.add_argument("--model-arg", dest="model_args", metavar="NAME=VALUE", type=parse_model_arg, action="append",
                   default=[], help="a keyword argument for your own net's function, VALUE a Python literal "
                                    "(--model-arg width=32 --model-arg pool=\"'max'\"); repeat it (default none)")
    g.add_argument("--seed", metavar="N", type=int, default=0, help="seeds the weights and the data order (default 0)")
    g = p.add_argument_group("activation store and step")
    add_option(g, "bits")
    add_option(g, "window")
    g.add_argument("--rounding", choices=list(ROUNDINGS), default=DEFAULT_ROUNDING,
                   help="how a k-bit code rounds a value: nearest (its bin's midpoint; default) or stochastic (to "
                        "one of the two levels around it, the levels being the bins' edges, at random: unbiased "
                        "inside the window)")
    add_option(g, "batch")
    g.add_argument("--split", metavar="K", type=int, default=1,
                   help="sub-batches a batch is computed in, the gradients accumulated (default 1)")
    g.add_argument("--graph", action="store_true",
                   help="replay each training step as one CUDA graph (GPU; default off; on the CPU steps run eagerly)")
    g = p.add_argument_group("schedule")
    g.add_argument("--iters", metavar="N", type=int, default=64000,
                   help="iterations in all (default 64000; 640000 on imagenet)")
    g.add_argument("--lr-schedule", metavar="SCHEDULE", default=REFERENCE_SCHEDULE,
                   help=f"{STEPS_SYNTAX.split(', e.g.')[0]} (the rate from each ITER on), or {COSINE_SYNTAX} "
                        f"(a linear warm-up, then a half cosine to 0 at --iters); default {REFERENCE_SCHEDULE} "
                        f"(on imagenet {IMAGENET_SCHEDULE})")
    g.add_argument("--optimizer", choices=list(OPTIMIZERS), default="sgd",
                   help="sgd (with momentum; default) or adamw (betas 0.9, 0.999, eps 1e-8; decoupled weight "
                        "decay; its rates are about 1e-3, not SGD's 0.1)")
    g.add_argument("--momentum", metavar="M", type=float, default=0.9, help="SGD momentum (default 0.9)")
    g.add_argument("--weight-decay", metavar="WD", type=float,
                   help=f"on the conv and FC weights (default {SGD_DECAY:g}, 1e-4 on imagenet; adamw {ADAMW_DECAY:g})")
    g.add_argument("--clip-norm", metavar="NORM", type=float,
                   help="scale each step's gradient down to this global L2 norm where it is larger (default off)")
    g = p.add_argument_group("run folder")
    g.add_argument("--out", metavar="DIR",
                   help="run folder (default runs/<data>-<model>-<bits>[-<window>][-stochastic]-seed<seed>, <data> "
                        "a --data-file's own name, the window named when it is not the default)")
    g.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint (default off)")
    g.add_argument("--overwrite", action="store_true",
                   help="start a new run in an --out that holds one (default off: refused)")
    g.add_argument("--log-every", metavar="N", type=int, default=20,
                   help="iterations a console line and a metrics record, loss and accuracy averaged over them "
                        "(default 20)")
    g.add_argument("--val-every", metavar="N", type=int, default=400,
                   help="iterations between validations (default 400; 5000 on imagenet); each writes OUT/best.h5 "
                        "when its accuracy is the run's best")
    g.add_argument("--checkpoint-every", metavar="N", type=int, default=400,
                   help="iterations between checkpoints, also written at the end and on Ctrl-C (default 400; "
                        "1000 on imagenet)")
    g = p.add_argument_group("several processes (mpirun)")
    g.add_argument("--rank-timeout", metavar="SECONDS", type=float, default=60.0,
                   help="seconds a rank waits for the others before it stops the job (default 60)")
    g = p.add_argument_group("ImageNet (--data imagenet)")
    g.add_argument("--image-size", metavar="PIXELS", type=int,
                   help="the side of the training and validation crops (default 224)")
    g.add_argument("--workers", metavar="N", type=int, help="JPEG-decoding processes (default: the cores less one)")
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
    if config["seed"] < 0:  # (numpy's own words would not name the option)
        raise ValueError(f"--seed must be a non-negative integer, got {config['seed']}")
    for key in ("momentum", "weight_decay"):
        if not (np.isfinite(config[key]) and config[key] >= 0):
            raise ValueError(f"{option(key)} must be a finite non-negative number, got {config[key]}")
    if config.get("optimizer", "sgd") == "sgd" and config["momentum"] >= 1:
        raise ValueError(f"--momentum must be below 1, got {config['momentum']}")
    if config.get("clip_norm") is not None and not (np.isfinite(config["clip_norm"]) and config["clip_norm"] > 0):
        raise ValueError(f"--clip-norm must be a finite positive number, got {config['clip_norm']}")
    store_of(config)  # the store's own rules (quant.Store): stochastic rounding needs a k-bit store
    for key in ("log_every", "val_every", "checkpoint_every"):
        if config[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be positive")
    modelspec.check_spec(config["model"], config["model_args"], imagenet=config["data"] == "imagenet")
    parse_schedule(config["lr_schedule"], iters=config["iters"])
    if config.get("image_size") is not None and config["data"] != "imagenet":
        raise ValueError("--image-size applies to --data imagenet only")
    if config["data"] == "imagenet" and (config["image_size"] < 32 or config["image_size"] % 32):
        raise ValueError(f"--image-size must be a multiple of 32 (the net halves it five times), got "
                         f"{config['image_size']}")
    if config.get("workers") is not None and config["workers"] < 1:
        raise ValueError("--workers must be positive")
    transforms = data.parse_augment(config["augment"])
    if config["data"] == "imagenet" and transforms not in ((), data.AUGMENTS):  # its reader's are one piece
        raise ValueError(f"--augment on imagenet is {BUILT_IN_AUGMENT} (its random crops and flips) or none")
    if config.get("val_split") is not None:
        if config["data"] == "imagenet":
            raise ValueError("--val-split holds out part of an HDF5 data file; imagenet validates on its val/ folder")
        if not (np.isfinite(config["val_split"]) and 0 < config["val_split"] < 1):
            raise ValueError(f"--val-split is a fraction in (0, 1), got {config['val_split']}")


def data_path(config):
    """The HDF5 data file a configuration trains on: its --data-file, or <data-dir>/<data>.h5."""
    return Path(config["data_file"]) if config.get("data_file") else data.dataset_path(config["data_dir"],
                                                                                        config["data"])


def new_config(args, *, ranks=1):
    config = {k: v for k, v in vars(args).items() if k not in ("resume", "overwrite", "out", "rank_timeout")}
    config["data_dir"] = str(Path(args.data_dir).resolve())  # a run resumes from any folder
    if args.data_file is not None:  # the file's own name is the data's, in every message and folder name
        config["data_file"] = str(Path(args.data_file).resolve())
        config["data"] = data.file_name(config["data_file"])
    if args.weight_decay is None:  # (imagenet's default is set by apply_data_defaults)
        config["weight_decay"] = ADAMW_DECAY if args.optimizer == "adamw" else SGD_DECAY
    if args.augment is None:
        config["augment"] = "none" if args.data_file is not None else BUILT_IN_AUGMENT
    else:
        config["augment"] = data.augment_text(data.parse_augment(args.augment))
    config["model"], config["model_args"] = modelspec.canonical(args.model), model_args(args.model_args)
    # the sub-batches of a step over all ranks: ranks x split defines the run, so that 2 ranks x --split 1
    # and 1 process x --split 2, which compute the same step, resume each other's checkpoints
    config["split"] = args.split * ranks
    return config


def option(key):
    """A configuration key's command-line option: "lr_schedule" -> "--lr-schedule"."""
    return "--model-arg" if key == "model_args" else f"--{key.replace('_', '-')}"


def _whole(low):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(low):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= low


def _augment(v):
    try:
        return isinstance(v, str) and data.augment_text(data.parse_augment(v)) == v
    except ValueError:
        return False


_FLAG = (lambda v: isinstance(v, bool), "true or false")
_TEXT = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
# A saved configuration's fields: (check, what it must be); OPTIONAL ones, absent from older runs, take the
# default given there.
FIELDS = dict(data=_TEXT, data_dir=_TEXT, data_file=(lambda v: v is None or _TEXT[0](v), "a path or null"),
              model=_TEXT, model_args=(lambda v: isinstance(v, dict), "a JSON object"),
              bits=(lambda v: v in BITS, f"one of {', '.join(BITS)}"),
              window=(lambda v: v in WINDOWS, f"one of {', '.join(WINDOWS)}"),
              rounding=(lambda v: v in ROUNDINGS, f"one of {', '.join(ROUNDINGS)}"),
              batch=(_whole(1), "a positive integer"), split=(_whole(1), "a positive integer"),
              iters=(_whole(1), "a positive integer"), seed=(_whole(0), "a non-negative integer"),
              lr_schedule=_TEXT, momentum=(_real(0), "a finite non-negative number"),
              weight_decay=(_real(0), "a finite non-negative number"),
              augment=(_augment, f"none or a list of {', '.join(data.AUGMENTS)} in that order"),
              optimizer=(lambda v: v in OPTIMIZERS, f"one of {', '.join(OPTIMIZERS)}"),
              clip_norm=(lambda v: v is None or _real(0)(v) and v > 0, "a positive number or null"),
              val_split=(lambda v: v is None or _real(0)(v) and 0 < v < 1, "a fraction in (0, 1) or null"),
              log_every=(_whole(1), "a positive integer"), val_every=(_whole(1), "a positive integer"),
              checkpoint_every=(_whole(1), "a positive integer"), graph=_FLAG,
              image_size=(lambda v: v is None or _whole(1)(v), "a positive integer or null"),
              workers=(lambda v: v is None or _whole(1)(v), "a positive integer or null"))
OPTIONAL = dict(window="fixed",  # runs from before the option coded through the paper's window
                rounding="nearest",  # runs from before stochastic rounding
                model_args={},  # runs from before your own nets: ResNets, which take none
                graph=False, image_size=None, workers=None,
                data_file=None, val_split=None,  # runs from before your own data files and held-out validation
                optimizer="sgd", clip_norm=None)  # runs from before AdamW and clipping


def saved_config(saved):
    """A checkpoint's configuration, each field checked (type and range) and the whole by check_config,
    before anything reads it: a ValueError naming the checkpoint and the field otherwise."""
    config = dict(OPTIONAL, **saved.config)
    if "augment" not in config and isinstance(config.get("no_augment"), bool):  # runs from before --augment
        config["augment"] = "none" if config["no_augment"] else BUILT_IN_AUGMENT
    config.pop("no_augment", None)
    if config.get("data_file") is None and config.get("data") not in data.DATASETS + ("imagenet",):
        raise ValueError(f"{saved.path} is damaged: its configuration's data is {config.get('data')!r}, not a "
                         "data set's name, and it has no data_file")
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
    if "model" in given:  # as new_config records them
        given = dict(given, model=modelspec.canonical(given["model"]))
    if "model_args" in given:
        given = dict(given, model_args=model_args(given["model_args"]))
    differ = [f"{option(k)} {given[k]} (the run has {config.get(k)})" if k != "split" or ranks == 1 else
              f"{ranks} ranks x --split {given[k] // ranks} (the run has {config.get(k)} sub-batches a step)"
              for k in DEFINING if k in given and given[k] != config.get(k)]
    if differ:
        raise ValueError(f"{ckpt_path} was trained with other options; a resumed run keeps them: "
                         + "; ".join(differ))
    if "data_file" in given:
        given = dict(given, data_file=str(Path(given["data_file"]).resolve()))
        if config.get("data_file") is None:
            raise ValueError(f"{ckpt_path} trained on --data {config['data']}: a resume may move its file with "
                             "--data-dir, not change it to a --data-file")
    changed = {k: [config.get(k), given[k]] for k in CHANGEABLE if k in given and given[k] != config.get(k)}
    if "iters" in changed and "lr_schedule" not in given and config["lr_schedule"].startswith("cosine:"):
        old, new = changed["iters"]
        curve = parse_schedule(config["lr_schedule"], iters=old), parse_schedule(config["lr_schedule"], iters=new)
        at = saved.iteration
        raise ValueError(f"--iters {new} would stretch this run's cosine, a curve fixed by its --iters {old}: its rate "
                         f"at iteration {at} would jump from {curve[0].rate(at):.3g} to {curve[1].rate(at):.3g}. "
                         "Keep --iters, or give the rest of the run a --lr-schedule of its own")
    for key, (_, new) in changed.items():
        config[key] = new
    if "data_dir" in changed:
        config["data_dir"] = str(Path(config["data_dir"]).resolve())
    return config, changed


def apply_data_defaults(args, given):
    """With --data imagenet, the paper's ImageNet setting (IMAGENET_DEFAULTS) for every option the command
    line does not give. --data and --data-file name the data two ways: one of them."""
    if "data" in given and "data_file" in given:
        raise ValueError("--data names a prepared data set and --data-file a file of your own: give one")
    if args.data == "imagenet":
        for key, value in IMAGENET_DEFAULTS.items():
            if key == "weight_decay" and args.optimizer == "adamw":
                continue  # the paper's 1e-4 is SGD's; AdamW keeps its own (new_config)
            if key not in given:
                setattr(args, key, value)
    return args
