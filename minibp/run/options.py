"""The trainer's options, declared once: each a dataclass field whose metadata is its Option (its default, its
help, its kind and the check of a value on its own). RunOptions declares a run's options, Invocation those of
one command; the command line is generated from the fields:

    build_parser()                          python3 -m minibp.train's argparse parser
    read_command_line(argv)                 (Invocation, given): given = {field: value} of the options given
    add_option(parser, "bits")              one option on another command's parser (plan, plot)
    OPTIONS["bits"], option("bits")         an option's declaration, its flag "--bits"

`given` is {field: value} for the options given and no others, from the command line or from Python (fit,
through Option.from_python). Kinds: a DEFINING option defines the run, and a resume must keep it; a CHANGEABLE
one may change when the run resumes (and the metrics record the change). The options of one command
(Invocation: --out, --resume, --overwrite, --rank-timeout) are not the run's, and are never saved. What a value
must be together with the others (a batch the sub-batches divide, a schedule for the iterations) is checked
where the whole is made: config.py's RunConfig.
"""
import argparse
import ast
import sys
from dataclasses import MISSING, dataclass, field, fields

import numpy as np

from ..io import data
from ..io.batches import AUGMENTS, augment_text, parse_augment
from ..optim import OPTIMIZERS
from ..quant import BITS, DEFAULT_ROUNDING, DEFAULT_WINDOW, ROUNDINGS, WINDOWS
from .schedule import COSINE_SYNTAX, REFERENCE_SCHEDULE, STEPS_SYNTAX
from .sizing import parse_memory
from .tuning import ALL_BUT_CLASSIFIER, freeze_syntax, weights_syntax

# ImageNet: the paper's code's setting (ResNet-152, batch 256, 640k iterations, weight decay 1e-4, the rate
# divided by 10 every 160k iterations); validation about once an epoch (5,004 iterations).
IMAGENET_SCHEDULE = "0:0.1,160000:0.01,320000:0.001,480000:0.0001"
IMAGENET_DEFAULTS = dict(model="resnet152", data_dir="data/imagenet", batch=256, iters=640000, image_size=224,
                         lr_schedule=IMAGENET_SCHEDULE, weight_decay=1e-4, val_every=5000, checkpoint_every=1000)
SGD_DECAY, ADAMW_DECAY = 2e-4, 0.05  # --weight-decay's defaults (the paper's for SGD; AdamW's usual)
BUILT_IN_AUGMENT = "crop,flip"  # the paper's, for the data sets minibp.prepare writes (and ImageNet's reader)

DEFINING, CHANGEABLE, INVOCATION = "defining", "changeable", "invocation"  # an Option's kinds
GROUPS = ("model and data", "activation store and step", "schedule", "run folder", "several processes (mpirun)",
          "ImageNet (--data imagenet)")  # --help's headings, in order


EVERY_RUN = object()  # Option.before for the options every checkpoint holds


@dataclass(frozen=True)
class Option:
    """One option of the trainer: how the command line reads it and what a value of it must be."""
    kind: str                 # DEFINING, CHANGEABLE or INVOCATION
    group: str                # its heading in --help (GROUPS)
    help: str
    check: object = None      # value -> whether it may be the option's value (its type included) ...
    must_be: str = ""         # ... and that rule in words: "--batch must be <must_be>, got 0"
    type: type = str          # what the command line's text becomes; bool: a switch, present or not
    choices: tuple = None
    metavar: str = None
    flag: str = None          # the command line's name, where it is not --<name with dashes>
    words_are: str = None     # ... and the words it takes, for a message
    negatable: bool = False   # a switch with a --no-<name> form too: on, off, or the default where neither is given
    before: object = EVERY_RUN  # the value of a run saved before the option existed (absent from its checkpoint);
    #                           EVERY_RUN: the option is as old as the checkpoints, and one without it is damaged
    words: str = None         # a list of words from Python is the option's text, these words joined (augment's
    #                           transforms): what an empty list means

    def argparse(self, **changes):
        """argparse's keywords for the option (`changes`: another command's reading of it)."""
        if self.type is bool:
            action = argparse.BooleanOptionalAction if self.negatable else "store_true"
            return {**dict(action=action, help=self.help), **changes}  # (another command's help replaces it)
        keywords = dict(type=self.type, choices=self.choices, metavar=self.metavar, help=self.help)
        return {k: v for k, v in dict(keywords, **changes).items() if v is not None or k in changes}

    def from_python(self, name, value):
        """A value given from Python (fit's keyword `name`) as the command line would read its text: a TypeError
        for a value of another kind, a ValueError for one the choices lack."""
        flag = option(name)
        value = python_value(value)
        if self.words is not None and isinstance(value, (list, tuple, np.ndarray)):  # ["crop", "flip"]
            words = list(np.ravel(value)) if isinstance(value, np.ndarray) else list(value)
            if not all(isinstance(w, str) for w in words):
                raise TypeError(f"fit()'s {name} takes {flag}'s value or a list of {self.metavar.lower()} "
                                f"({self.words_are}), got {value!r}")
            value = ",".join(words) or self.words
        if self.type is bool:  # bool("False") is True: a switch takes True or False alone
            if not isinstance(value, bool):
                raise TypeError(f"fit()'s {name} is True or False, got {value!r}")
            return value
        if isinstance(value, bool):  # str(True) would pass as a word, e.g. a schedule's text
            raise TypeError(f"fit()'s {name} takes {flag}'s value, not {value!r}")
        if self.type is not str and isinstance(value, str):
            try:
                value = self.type(value)
            except ValueError:
                raise ValueError(f"{flag}: invalid {self.type.__name__} value: {value!r}") from None
        elif self.type is str and isinstance(value, (int, float)):  # bits=4 names the store "4"
            value = str(value)
        elif self.type is float and isinstance(value, int):
            value = float(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"argument {flag}: invalid choice: {value!r} (choose from "
                             f"{', '.join(map(repr, self.choices))})")
        return value


def python_value(value):
    """NumPy's scalars and arrays of no dimension as the Python values they mean; anything else as it is."""
    if isinstance(value, (np.bool_, np.number, np.str_)) or isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    return value


def _option(default, **option):
    """A dataclass field whose metadata is its Option."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=dict(option=Option(**option)))
    return field(default=default, metadata=dict(option=Option(**option)))


def whole(low):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(low):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and bool(np.isfinite(v)) and v >= low


def _optional(check):
    return lambda v: v is None or check(v)


def _text(v):
    return isinstance(v, str) and v != ""


def _memory(v):
    try:
        return isinstance(v, str) and (parse_memory(v) or 0) >= 0
    except ValueError:
        return False


def _augment(v):
    try:
        return isinstance(v, str) and augment_text(parse_augment(v)) == v
    except ValueError:
        return False


POSITIVE, NON_NEGATIVE = "a positive integer", "a non-negative integer"
# (named here: inside RunOptions' body its field `data` hides the module)
DATA_SETS, TRANSFORMS = data.DATASETS + ("imagenet",), ", ".join(AUGMENTS)
FINITE = "a finite non-negative number"
MODEL, STORE, SCHEDULE, FOLDER, PROCESSES, IMAGENET = GROUPS


@dataclass(frozen=True)
class Invocation:
    """The options of one python3 -m minibp.train command that are not the run's: never saved."""
    out: str = _option(None, kind=INVOCATION, group=FOLDER, metavar="DIR", check=_optional(_text), must_be="a path",
                       help="run folder (default runs/<data>-<model>-<bits>[-<window>][-stochastic][-clip<S>]-"
                            "seed<seed>, <data> a --data-file's own name, the window named when it is not the default)")
    resume: bool = _option(False, kind=INVOCATION, group=FOLDER, type=bool,
                           help="continue the run in --out from its checkpoint (default off)")
    overwrite: bool = _option(False, kind=INVOCATION, group=FOLDER, type=bool,
                              help="start a new run in an --out that holds one (default off: refused)")
    rank_timeout: float = _option(60.0, kind=INVOCATION, group=PROCESSES, type=float, metavar="SECONDS",
                                  check=lambda v: _real(0)(v) and v > 0, must_be="a finite positive number",
                                  help="seconds a rank waits for the others before it stops the job (default 60)")

    def __post_init__(self):
        check_fields(self)


@dataclass(frozen=True)
class RunOptions:
    """A run's options as declared, each checked on its own (RunConfig, config.py, checks the whole)."""
    # model and data
    data: str = _option("cifar10", kind=DEFINING, group=MODEL, choices=DATA_SETS, check=_text,
                        must_be="a non-empty string",
                        help="the data set (default cifar10); imagenet: its folder of JPEGs, with the paper's "
                             "ImageNet setting as the defaults")
    data_dir: str = _option("data", kind=CHANGEABLE, group=MODEL, metavar="DIR", check=_text,
                            must_be="a non-empty string",
                            help="the folder of the prepared <data>.h5 (default data); for imagenet the folder "
                                 "holding train/<class>/ and val/<class>/ (default data/imagenet)")
    data_file: str = _option(None, kind=CHANGEABLE, group=MODEL, metavar="PATH", check=_optional(_text),
                             must_be="a path", before=None,  # runs from before your own data files
                             help="train on this file that minibp.io.data.write made, under the file's own name "
                                  "(instead of --data; default none)")
    augment: str = _option(BUILT_IN_AUGMENT, kind=DEFINING, group=MODEL, metavar="TRANSFORMS", check=_augment,
                           words="none", words_are=TRANSFORMS,
                           must_be=f"none or a comma-separated list of {TRANSFORMS}",
                           help=f"the training images' transforms: none, or a comma-separated list of "
                                f"{TRANSFORMS}, applied in that order (resized-crop: a random 35-100%% of the area "
                                f"at width/height 3/4 to 4/3, resized back; jitter: brightness, contrast and, for "
                                f"RGB, saturation each by a random 0.8-1.2; crop: zero-pad 4 pixels, a random "
                                f"window; shift: a random move of up to a tenth of each side, zero-filled; flip: "
                                f"horizontal, half the time); default {BUILT_IN_AUGMENT} for --data (the paper's; "
                                f"imagenet takes it or none), none for --data-file")
    val_split: float = _option(None, kind=DEFINING, group=MODEL, type=float, metavar="FRACTION", before=None,
                               check=_optional(lambda v: _real(0)(v) and 0 < v < 1), must_be="a fraction in (0, 1)",
                               help="validate on this fraction of the training split, held out from training (the "
                                    "same images every time); default: the data file's val split where it has "
                                    "one, else the test split")
    model: str = _option("resnet164", kind=DEFINING, group=MODEL, metavar="SPEC", check=_text,
                         must_be="a non-empty string",
                         help="resnet<9n+2> (resnet20, resnet164, resnet1001; default resnet164), on imagenet "
                              "resnet50, resnet101 or resnet152 (default); or your own net: FILE.py:FUNCTION or "
                              "package.module:FUNCTION, called with input_shape=, classes= and the --model-arg "
                              "values, returning an uncompiled minibp.net.Net")
    model_args: dict = _option({}, kind=DEFINING, group=MODEL, flag="--model-arg", metavar="NAME=VALUE",
                               check=lambda v: isinstance(v, dict), must_be="a JSON object",
                               before={},  # runs from before your own nets: ResNets, which take none
                               help="a keyword argument for your own net's function, VALUE a Python literal "
                                    "(--model-arg width=32 --model-arg pool=\"'max'\"); repeat it (default none)")
    init_from: str = _option(None, kind=DEFINING, group=MODEL, metavar="RUN", before=None, check=_optional(_text),
                             must_be="a path",
                             help="start from another run's weights (fine-tuning): RUN is a run folder (its best.h5 "
                                  "where it has one, else its checkpoint.h5) or a checkpoint file; the arrays whose "
                                  "names and shapes match this net's are taken, the others (a classifier of another "
                                  "class count) start fresh; --model defaults to RUN's (default: none, all fresh)")
    freeze: str = _option(None, kind=DEFINING, group=MODEL, metavar="UNITS", before=None,
                          check=_optional(freeze_syntax),
                          must_be=f"unit indices and ranges such as 0-15,18, or {ALL_BUT_CLASSIFIER}",
                          help=f"leave these units' parameters exactly as they start (a fine-tune's): indices and "
                               f"ranges A-B, comma-separated, as python3 -m minibp.plan numbers the units, or "
                               f"{ALL_BUT_CLASSIFIER} (default: none; their batch norm still follows the data)")
    class_weights: str = _option(None, kind=DEFINING, group=MODEL, metavar="WEIGHTS", before=None,
                                 check=_optional(weights_syntax), must_be="balanced, a file, or numbers W,W,...",
                                 help="weight each class's loss for unbalanced data: balanced (N / (classes x the "
                                      "class's images)), a FILE of one number a class, or the numbers W,W,... in "
                                      "label order; a file is read when the run starts and its numbers recorded "
                                      "(default: none, every image alike)")
    seed: int = _option(0, kind=DEFINING, group=MODEL, type=int, metavar="N", check=whole(0), must_be=NON_NEGATIVE,
                        help="seeds the weights and the data order (default 0)")
    # activation store and step
    bits: str = _option("4", kind=DEFINING, group=STORE, choices=tuple(BITS), check=lambda v: v in BITS,
                        must_be=f"one of {', '.join(BITS)}",
                        help="activation store: exact, 8, 4 (default), 2, or naive (4 bits fed forward: the "
                             "ablation)")
    window: str = _option(DEFAULT_WINDOW, kind=DEFINING, group=STORE, choices=WINDOWS, check=lambda v: v in WINDOWS,
                          must_be=f"one of {', '.join(WINDOWS)}",
                          before="fixed",  # runs from before the option coded through the paper's window
                          help=f"the k-bit codes' window per channel: range (the batch's range of values), block "
                               f"(each 256 pixels' range) or fixed (the paper's, +-3 sigma); default {DEFAULT_WINDOW}")
    rounding: str = _option(DEFAULT_ROUNDING, kind=DEFINING, group=STORE, choices=ROUNDINGS,
                            check=lambda v: v in ROUNDINGS, must_be=f"one of {', '.join(ROUNDINGS)}",
                            before="nearest",  # runs from before stochastic rounding
                            help="how a k-bit code rounds a value: nearest (its bin's midpoint; default) or "
                                 "stochastic (to one of the two levels around it, the levels being the bins' edges, "
                                 "at random: unbiased inside the window)")
    clip: float = _option(None, kind=DEFINING, group=STORE, type=float, metavar="SIGMA", before=None,
                          check=_optional(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0),
                          must_be="a positive number of standard deviations",
                          help="the range or block window's clip, in standard deviations, inf for none (default: "
                               "the one chosen for the window and bits, quant.py's RANGE_CLIP and BLOCK_CLIP; an "
                               "experiment's option)")
    batch: int = _option(128, kind=DEFINING, group=STORE, type=int, metavar="N", check=whole(1), must_be=POSITIVE,
                         help="images a step (default 128; 256 on imagenet)")
    # the sub-batches of a step over all ranks: ranks x --sub-batches defines the run, so that 2 ranks x
    # --sub-batches 1 and 1 process x --sub-batches 2, which compute the same step, resume each other's checkpoints
    sub_batches: int = _option(1, kind=DEFINING, group=STORE, type=int, metavar="K", check=whole(1),
                               must_be=POSITIVE, help="sub-batches a batch is computed in, the gradients accumulated "
                                                      "(default 1)")
    memory: str = _option(None, kind=DEFINING, group=STORE, metavar="SIZE", before=None, check=_optional(_memory),
                          must_be="auto or a size such as 1.25GiB",
                          help="fit the whole run in this much memory (a size such as 1.25GiB, or auto: what is "
                               "available now, less a margin): each batch-norm unit's store (exact, 8, 4 or 2 bits) "
                               "and the fewest sub-batches are chosen for it, the batch kept; on a GPU it bounds "
                               "the device's pool (default: off, --bits chooses one store for every unit)")
    max_sub_batches: int = _option(None, kind=DEFINING, group=STORE, type=int, metavar="N", before=None,
                                   check=_optional(whole(1)), must_be=POSITIVE,
                                   help="with --memory: up to N sub-batches where more lower the predicted "
                                        "gradient error (default: the fewest at which the run fits)")
    graph: bool = _option(None, kind=CHANGEABLE, group=STORE, type=bool, negatable=True, before=False,
                          check=lambda v: v is None or isinstance(v, bool), must_be="true, false or null",
                          help="--graph replays each training step, recorded once (one CUDA graph on a GPU; on the "
                               "CPU its stand-in, the same results), --no-graph runs it eagerly; default: the "
                               "device's choice (the graph on a GPU that can capture one, eagerly elsewhere)")
    # schedule
    iters: int = _option(64000, kind=CHANGEABLE, group=SCHEDULE, type=int, metavar="N", check=whole(1),
                         must_be=POSITIVE, help="iterations in all (default 64000; 640000 on imagenet)")
    lr_schedule: str = _option(REFERENCE_SCHEDULE, kind=CHANGEABLE, group=SCHEDULE, metavar="SCHEDULE", check=_text,
                               must_be="a non-empty string",
                               help=f"{STEPS_SYNTAX.split(', e.g.')[0]} (the rate from each ITER on), or "
                                    f"{COSINE_SYNTAX} (a linear warm-up, then a half cosine to 0 at --iters); "
                                    f"default {REFERENCE_SCHEDULE} (on imagenet {IMAGENET_SCHEDULE})")
    optimizer: str = _option("sgd", kind=DEFINING, group=SCHEDULE, choices=OPTIMIZERS, check=lambda v: v in OPTIMIZERS,
                             must_be=f"one of {', '.join(OPTIMIZERS)}", before="sgd",  # runs from before AdamW
                             help="sgd (with momentum; default) or adamw (betas 0.9, 0.999, eps 1e-8; decoupled "
                                  "weight decay; its rates are about 1e-3, not SGD's 0.1)")
    momentum: float = _option(0.9, kind=DEFINING, group=SCHEDULE, type=float, metavar="M", check=_real(0),
                              must_be=FINITE, help="SGD momentum (default 0.9; refused with adamw, which has none)")
    weight_decay: float = _option(SGD_DECAY, kind=DEFINING, group=SCHEDULE, type=float, metavar="WD", check=_real(0),
                                  must_be=FINITE, help=f"on the conv and FC weights (default {SGD_DECAY:g}, 1e-4 on "
                                                       f"imagenet; adamw {ADAMW_DECAY:g})")
    clip_norm: float = _option(None, kind=DEFINING, group=SCHEDULE, type=float, metavar="NORM", before=None,
                               check=_optional(lambda v: _real(0)(v) and v > 0), must_be="a finite positive number",
                               help="scale each step's gradient down to this global L2 norm where it is larger "
                                    "(default off)")
    label_smoothing: float = _option(0.0, kind=DEFINING, group=SCHEDULE, type=float, metavar="EPS", before=0.0,
                                     check=lambda v: _real(0)(v) and v < 1, must_be="a number in [0, 1)",
                                     help="train toward (1 - EPS) on the label and EPS / classes on every class "
                                          "(default 0: the labels as they are)")
    patience: int = _option(None, kind=CHANGEABLE, group=SCHEDULE, type=int, metavar="N", before=None,
                            check=_optional(whole(1)), must_be=POSITIVE,
                            help="stop early after N validations in a row without a better one than the run's best "
                                 "(default: off, train to --iters)")
    # run folder
    log_every: int = _option(20, kind=CHANGEABLE, group=FOLDER, type=int, metavar="N", check=whole(1),
                             must_be=POSITIVE, help="iterations a console line and a metrics record, loss and "
                                                    "accuracy averaged over them (default 20)")
    val_every: int = _option(400, kind=CHANGEABLE, group=FOLDER, type=int, metavar="N", check=whole(1),
                             must_be=POSITIVE, help="iterations between validations (default 400; 5000 on imagenet); "
                                                    "each writes OUT/best.h5 when its accuracy is the run's best")
    checkpoint_every: int = _option(400, kind=CHANGEABLE, group=FOLDER, type=int, metavar="N", check=whole(1),
                                    must_be=POSITIVE, help="iterations between checkpoints, also written at the end "
                                                           "and on Ctrl-C (default 400; 1000 on imagenet)")
    # ImageNet
    image_size: int = _option(None, kind=DEFINING, group=IMAGENET, type=int, metavar="PIXELS", before=None,
                              check=_optional(whole(1)), must_be=POSITIVE,
                              help="the side of the training and validation crops (default 224)")
    workers: int = _option(None, kind=CHANGEABLE, group=IMAGENET, type=int, metavar="N", before=None,
                           check=_optional(whole(1)), must_be=POSITIVE,
                           help="JPEG-decoding processes, for --data imagenet alone (default: the cores less one)")


def option_fields(cls):
    """(name, Option) of a dataclass's option fields, in their order."""
    return [(f.name, f.metadata["option"]) for f in fields(cls) if "option" in f.metadata]


OPTIONS = dict(option_fields(Invocation) + option_fields(RunOptions))  # every option of the trainer, by field name


def default_of(name):
    """An option field's default (not ImageNet's): what a command takes where the option is not given."""
    f = {f.name: f for f in fields(RunOptions) + fields(Invocation)}[name]
    return f.default_factory() if f.default is MISSING else f.default


def check_fields(value):
    """Each option field's own check, in the command line's words."""
    for name, opt in option_fields(type(value)):
        if opt.check is not None and not opt.check(getattr(value, name)):
            raise ValueError(f"{option(name)} must be {opt.must_be}, got {getattr(value, name)!r}")


def option(key):
    """A field's command-line option: "lr_schedule" -> "--lr-schedule", "model_args" -> "--model-arg"."""
    flag = OPTIONS[key].flag if key in OPTIONS else None
    return flag or f"--{key.replace('_', '-')}"


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


def build_parser(*, description=None):
    """The command line of python3 -m minibp.train (its module docstring, the description of --help),
    generated from the option fields. No option has a default here: what parse_args returns is what was
    given (read_command_line), and RunConfig.new and Invocation give the rest theirs."""
    p = argparse.ArgumentParser(prog="python3 -m minibp.train", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    groups = {title: p.add_argument_group(title) for title in GROUPS}
    for name, opt in OPTIONS.items():
        if name == "model_args":  # repeated, NAME=VALUE each
            keywords = dict(type=parse_model_arg, action="append", metavar=opt.metavar, help=opt.help)
        else:
            keywords = opt.argparse()
        groups[opt.group].add_argument(option(name), dest=name, **keywords)
    for old, name in RENAMED.items():  # an old spelling, kept for a release: not in --help (read_command_line
        #                                 moves its value to the option's, and refuses both given)
        p.add_argument(old, dest=f"old_{name}", type=OPTIONS[name].type, action=_Renamed, help=argparse.SUPPRESS)
    return p


RENAMED = {"--split": "sub_batches"}  # the trainer's old flags, read for a release with a notice: old -> field


class _Renamed(argparse.Action):
    """An option's old flag: one line on stderr names the new one, and the value goes to it."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is now {option(self.dest.removeprefix('old_'))}; {option_string} goes in a "
              "later release", file=sys.stderr)
        setattr(namespace, self.dest, values)


def read_command_line(argv, *, description=None):
    """(Invocation, given) of a trainer's command line: given = {field: value} of the run's options on it."""
    given = vars(build_parser(description=description).parse_args(argv))
    for old, name in RENAMED.items():
        if f"old_{name}" in given:
            if name in given:  # one would silently win over the other
                raise ValueError(f"{old} is {option(name)}'s old name: give {option(name)} alone")
            given[name] = given.pop(f"old_{name}")
    invocation = {name: given.pop(name) for name, _ in option_fields(Invocation) if name in given}
    return Invocation(**invocation), given


def add_option(parser, name, **changes):
    """Add the trainer's option `name` (a RunConfig field) to another command's parser or argument group, its
    declaration with `changes` (another help, default, metavar or choices: that command's reading of it)."""
    keywords = OPTIONS[name].argparse(**{"default": default_of(name), **changes})
    return parser.add_argument(option(name), dest=name, **keywords)
