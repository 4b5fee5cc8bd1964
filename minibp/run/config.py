"""A training run's configuration as one typed value: RunConfig, a frozen dataclass whose fields are the options
that options.py declares (RunOptions), checked whole when it is made. Everything else is made from the fields:

    RunConfig.new(given)                    a fresh run: the options given, the rest at their defaults
    config.store, config.schedule           the quant.Store and the parsed --lr-schedule, made once
    config.folder()                         the run folder where --out is not given
    config.as_dict()                        what a checkpoint saves; RunConfig.from_checkpoint loads it back
    config.resumed(given, ...)              a resume: the options it may change applied, the others refused

`given` is {field: value} for the options given and no others (options.py). The defaults are the paper's,
ImageNet's setting where data="imagenet" (IMAGENET_DEFAULTS); AdamW's weight decay with optimizer="adamw"; no
augmentation for a data file of your own. Your own net's arguments are recorded as JSON (model_args):
--model FILE.py:FUNCTION --model-arg width=32, each VALUE a Python literal.
"""
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..io import data
from ..io.batches import BUILT_IN, augment_text, parse_augment
from ..quant import BITS, DEFAULT_WINDOW, Store
from . import modelspec
from .options import (ADAMW_DECAY, BUILT_IN_AUGMENT, CHANGEABLE, DATA_SETS, DEFINING, EVERY_RUN, IMAGENET_DEFAULTS,
                      OPTIONS, RunOptions, check_fields, default_of, option, option_fields, python_value, whole)
from .schedule import parse_schedule
from .tuning import recorded_weights, weights_syntax


PATHS = ("data_dir", "data_file", "init_from")  # the options that name a file or folder, recorded absolute
FOLDER_NAME = 48  # the most characters of the data's and the model's names in a default run folder's name


@dataclass(frozen=True)
class RunConfig(RunOptions):
    """A run's configuration, checked whole when it is made (a ValueError in the command line's words)."""
    # made from the fields once, when the configuration is
    store: Store = field(init=False, repr=False, compare=False)  # bits, window, rounding, clip
    schedule: object = field(init=False, repr=False, compare=False)  # lr_schedule for iters: Step/CosineSchedule
    # whether the model spec's file or module must be found now: not for a run whose net a checkpoint keeps as data
    # (a run loaded by evaluate or minibp.load, a resume, a fine-tune of such a run: startup.build_net)
    find_model: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self):
        check_fields(self)
        _check_batch(self.batch, self.sub_batches, ranks=1)
        if self.data_file is None and self.data not in DATA_SETS:
            raise ValueError(f"--data must be one of {', '.join(DATA_SETS)}, got {self.data!r}")
        if self.optimizer == "sgd" and self.momentum >= 1:
            raise ValueError(f"--momentum must be below 1, got {self.momentum}")
        object.__setattr__(self, "store", Store(self.bits, self.window, self.rounding, self.clip))  # its own rules
        modelspec.check_spec(self.model, self.model_args, imagenet=self.imagenet, find=self.find_model)
        object.__setattr__(self, "schedule", parse_schedule(self.lr_schedule, iters=self.iters))
        if self.image_size is not None and not self.imagenet:
            raise ValueError("--image-size applies to --data imagenet only")
        if self.workers is not None and not self.imagenet:  # (an HDF5 file's images are in memory)
            raise ValueError("--workers applies to --data imagenet only: its JPEG-decoding processes")
        if self.imagenet and (self.image_size is None or self.image_size < 32 or self.image_size % 32):
            raise ValueError(f"--image-size must be a multiple of 32 (the net halves it five times), got "
                             f"{self.image_size}")
        transforms = parse_augment(self.augment)
        if self.imagenet and transforms not in ((), BUILT_IN):  # its reader's are one piece
            raise ValueError(f"--augment on imagenet is {BUILT_IN_AUGMENT} (its random crops and flips) or none")
        if self.val_split is not None and self.imagenet:
            raise ValueError("--val-split holds out part of an HDF5 data file; imagenet validates on its val/ folder")

    imagenet = property(lambda self: self.data == "imagenet")
    sub_batch = property(lambda self: self.batch // self.sub_batches)  # the images of one forward and backward pass

    @classmethod
    def new(cls, given, *, ranks=1):
        """A fresh run's configuration: the options `given` ({field: value}; --sub-batches per rank), every other
        at its default (the module docstring). ranks: the processes under mpirun."""
        if "data" in given and "data_file" in given:
            raise ValueError("--data names a prepared data set and --data-file a file of your own: give one")
        if "data_dir" in given and given.get("data_file") is not None:
            raise ValueError("--data-dir is where --data's file is; --data-file names its file itself: give one")
        values = with_defaults(given)  # every field; sub-batches per rank, as given: _recorded counts them over all
        _check_applies(given, optimizer=values["optimizer"], bits=values["bits"], memory=values["memory"])
        if values.get("data_file") is not None:  # the file's own name is the data's, in every message and folder
            values["data"] = data.file_name(values["data_file"])
        values = _recorded(values, ranks=ranks)  # data_dir made absolute: the run resumes from any folder
        _check_batch(values["batch"], values["sub_batches"], ranks=ranks)
        return cls(**values)

    @classmethod
    def from_checkpoint(cls, saved, *, loading=False):
        """The configuration a checkpoint (checkpoint.Checkpoint) saved, each field checked (kind and range)
        and then the whole: a ValueError naming the checkpoint and the field otherwise. A checkpoint that keeps its
        net as data (its structure) needs no model file (the net is built as modelspec.rebuild builds it, or on a
        resume from the file where it is still there); loading: the run is only loaded, and its file is never looked
        for."""
        values = dict(saved.config)
        if "augment" not in values and isinstance(values.get("no_augment"), bool):  # runs from before --augment
            values["augment"] = "none" if values["no_augment"] else BUILT_IN_AUGMENT
        values.pop("no_augment", None)
        if "split" in values and "sub_batches" not in values:  # runs from before --split was named --sub-batches
            values["sub_batches"] = values.pop("split")
        if values.get("data") != "imagenet" and values.get("workers") is not None:  # taken and unused before it
            values["workers"] = None  # was refused: it never meant anything for an HDF5 file
        if values.get("data_file") is None and values.get("data") not in DATA_SETS:
            raise ValueError(f"{saved.path} is damaged: its configuration's data is {values.get('data')!r}, not a "
                             "data set's name, and it has no data_file")
        unknown = sorted(set(values) - set(OPTIONS))
        if unknown:
            raise ValueError(f"{saved.path} is damaged, or of a later minibp: its configuration has "
                             f"{', '.join(unknown)}, which this one does not know")
        for name, opt in option_fields(cls):
            if name not in values:
                if opt.before is EVERY_RUN:
                    raise ValueError(f"{saved.path} is damaged: its configuration lacks {name}")
                values[name] = opt.before
            elif not opt.check(values[name]):
                what = opt.must_be + (" or null" if default_of(name) is None else "")
                raise ValueError(f"{saved.path} is damaged: its configuration's {name} is {values[name]!r}, not "
                                 f"{what}")
        try:
            return cls(**values, find_model=not loading and getattr(saved, "structure", None) is None)
        except ValueError as e:
            raise ValueError(f"{saved.path} holds a configuration that cannot run: {e}") from None

    def resumed(self, given, *, ranks=1, iteration, path):
        """(configuration, changed) of this saved run resumed at `iteration` with the options `given` (as new
        takes them): the changeable ones applied, changed = {field: [saved, new]}; a ValueError listing every
        defining option given another value than the run's. path: the checkpoint, as the messages name it."""
        _check_applies(given, optimizer=self.optimizer, bits=self.bits, memory=self.memory)
        given = _recorded(given, ranks=ranks)
        differ = [f"{option(k)} {given[k]} (the run has {getattr(self, k)})" if k != "sub_batches" or ranks == 1 else
                  f"{ranks} ranks x --sub-batches {given[k] // ranks} (the run has {self.sub_batches} sub-batches a "
                  "step)"
                  for k, opt in option_fields(type(self)) if opt.kind == DEFINING and k in given
                  and given[k] != getattr(self, k)]
        if differ:
            raise ValueError(f"{path} was trained with other options; a resumed run keeps them: " + "; ".join(differ))
        if "data_file" in given and self.data_file is None:
            raise ValueError(f"{path} trained on --data {self.data}: a resume may move its file with --data-dir, "
                             "not change it to a --data-file")
        if "data_dir" in given and self.data_file is not None:
            raise ValueError(f"{path} trains on a --data-file: give a moved file as --data-file, not its folder as "
                             "--data-dir")
        changed = {k: [getattr(self, k), given[k]] for k, opt in option_fields(type(self))
                   if opt.kind == CHANGEABLE and k in given and given[k] != getattr(self, k)}
        if "iters" in changed and "lr_schedule" not in given and self.lr_schedule.startswith("cosine:"):
            old, new = changed["iters"]
            curve = parse_schedule(self.lr_schedule, iters=new)
            raise ValueError(f"--iters {new} would stretch this run's cosine, a curve fixed by its --iters {old}: its "
                             f"rate at iteration {iteration} would jump from {self.schedule.rate(iteration):.3g} to "
                             f"{curve.rate(iteration):.3g}. Keep --iters, or give the rest of the run a "
                             "--lr-schedule of its own")
        return replace(self, **{k: new for k, (_, new) in changed.items()}), changed

    def check_ranks(self, ranks):
        """That `ranks` processes can share this run's sub-batches (config.sub_batches counts them over all ranks)."""
        if self.sub_batches % ranks:
            raise ValueError(f"the run computes a batch in {self.sub_batches} sub-batches, which {ranks} ranks cannot "
                             "share evenly: run it on a number of ranks that divides them")

    def as_dict(self):
        """{field: value}: what a checkpoint saves (as JSON)."""
        return {name: getattr(self, name) for name, _ in option_fields(type(self))}

    def folder(self):
        """The run folder where --out is not given: runs/<data>-<model>-<bits>[-<window>][-stochastic][-clip<S>]-
        seed<seed>, the window, the rounding and the clip named where they are not the defaults."""
        bits = self.bits if self.memory is None else "memory" + self.memory.replace(" ", "")
        store = f"-{self.store.window}" if self.store.has_window and self.store.window != DEFAULT_WINDOW else ""
        store += "-stochastic" if self.store.stochastic else ""
        store += "" if self.clip is None else f"-clip{self.clip:g}"
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.data)  # one folder, whatever it holds
        if len(name) > FOLDER_NAME:  # a name the file system takes (255 bytes), still one of its own
            name = f"{name[:FOLDER_NAME - 9]}-{hashlib.sha256(self.data.encode(errors='replace')).hexdigest()[:8]}"
        model = modelspec.short_name(self.model)
        model = model if len(model) <= FOLDER_NAME else model[:FOLDER_NAME]
        bits = "".join(c if c.isalnum() or c in "-_." else "_" for c in bits)
        return Path(f"runs/{name}-{model}-{bits}{store}-seed{self.seed}")

    def data_path(self):
        """The HDF5 data file the run trains on: its --data-file, or <data-dir>/<data>.h5."""
        return Path(self.data_file) if self.data_file else data.dataset_path(self.data_dir, self.data)


def with_defaults(given):
    """Every run option: those given, the rest at the defaults a fresh run takes (the module docstring: ImageNet's
    setting, AdamW's weight decay, no augmentation for a data file), read without touching the disk."""
    values = dict(given)
    if values.get("data") == "imagenet":
        for key, value in IMAGENET_DEFAULTS.items():
            if key != "weight_decay" or values.get("optimizer") != "adamw":  # the paper's 1e-4 is SGD's
                values.setdefault(key, value)
    if values.get("optimizer") == "adamw":
        values.setdefault("weight_decay", ADAMW_DECAY)
    if values.get("data_file") is not None:
        values.setdefault("augment", "none")
    for name, _ in option_fields(RunOptions):
        values.setdefault(name, default_of(name))
    return values


def _check_applies(given, *, optimizer, bits, memory):
    """A ValueError for an option given that the run's optimizer or store has no use for: refused, not ignored,
    since the run would record it and a resume that changed it would be refused for nothing. --memory chooses the
    bits and the sub-batches itself."""
    if memory is not None:
        if "bits" in given:
            raise ValueError("--memory chooses each unit's bits: leave --bits out (--window, --rounding and --clip "
                             "still apply)")
        if "sub_batches" in given:
            raise ValueError("--memory chooses the sub-batches, the fewest at which the run fits: leave --sub-batches "
                             "out (--max-sub-batches N allows more where they lower the error)")
    elif "max_sub_batches" in given:
        raise ValueError("--max-sub-batches is --memory's: --sub-batches gives a run without a budget its "
                         "sub-batches")
    if optimizer == "adamw" and "momentum" in given:
        raise ValueError("--momentum is SGD's: --optimizer adamw has none (its betas are 0.9, 0.999); leave "
                         "--momentum out")
    if "window" in given and bits in BITS and not Store(bits).has_window:
        raise ValueError(f"--window chooses a k-bit store's window: --bits {bits} codes through none of its choosing; "
                         "leave --window out")


def _check_batch(batch, sub_batches, *, ranks):
    """sub_batches: those of a step over all ranks."""
    if whole(1)(batch) and whole(1)(sub_batches) and batch % sub_batches:
        named = f"{ranks} ranks x --sub-batches {sub_batches // ranks}" if ranks > 1 else "--sub-batches"
        raise ValueError(f"--batch ({batch}) must be a positive multiple of {named} ({sub_batches})")


def absolute_paths(given):
    """The options given with the paths among them (PATHS) absolute: a run resumes from any folder, and ranks
    started in different folders compare the same paths."""
    return dict(given, **{k: str(Path(given[k]).resolve()) for k in PATHS if given.get(k) is not None})


def _recorded(given, *, ranks):
    """The options given, in the form a run records them: paths absolute (a run resumes from any folder), the
    model's spec as modelspec.canonical makes it, its arguments as JSON gives them back, the augmentation in
    AUGMENTS' order, class weights as their numbers (tuning.py), and the sub-batches counted over all ranks."""
    recorded = absolute_paths(given)
    if "model" in recorded:
        recorded["model"] = modelspec.canonical(recorded["model"])
    if "model_args" in recorded:
        recorded["model_args"] = model_args(recorded["model_args"])
    if isinstance(recorded.get("augment"), str):
        recorded["augment"] = augment_text(parse_augment(recorded["augment"]))
    if weights_syntax(recorded.get("class_weights")):  # a file's numbers: the run stands without the file
        recorded["class_weights"] = recorded_weights(recorded["class_weights"])
    if whole(1)(recorded.get("sub_batches")):
        recorded["sub_batches"] = recorded["sub_batches"] * ranks
    return recorded


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
            recorded[name] = json.loads(json.dumps(value, allow_nan=False, default=_numpy_scalar))
        except (TypeError, ValueError):
            raise ValueError(f"model argument {name}={value!r} cannot be recorded in the checkpoint: give numbers, "
                             "strings, True, False, None, or lists and dicts of them") from None
    return recorded


def _numpy_scalar(value):
    """A NumPy scalar (or array of no dimension) as the Python value it means (json.dumps' default); a TypeError
    for anything else."""
    plain = python_value(value)
    if plain is value:
        raise TypeError(f"{type(value).__name__} is not JSON")
    return plain
