"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file written atomically.

    /state/params/<name>     each parameter, by the net's names (net.py's key(): "unit3.w", ...)
    /state/momentum/<name>   its SGD momentum
    /state/running/<unit>    (2, C) that unit's BN running mean and variance
    /data_order  (N,)        the current epoch's order of training images
    /class_names             uint8: the JSON list of the data's class names (ImageNet's folders), or null
    /preprocess/mean         (H, W, C) float32: the training images' mean, which predictions subtract too
    attrs: format, iteration, config (JSON), data_epoch, data_position, data_rng (JSON), and attrs_sha256,
           the SHA-256 of those six and of the optional ones; every array carries the SHA-256 of its bytes as
           its attribute sha256
    optional attrs: data (JSON: the data's name, file checksum, image shape and classes), validation (JSON:
           the split, loss and accuracy of the validation this state scored: best.h5's), started_from (JSON:
           a run begun from another's weights, --init-from: that checkpoint, its iteration, how many arrays
           were taken and the parameters that started fresh), memory (a --memory run's record), structure
           (the net as data), model_file (its file's path and SHA-256), clock (JSON {seconds}: the run's
           training time so far, over all its sessions, which a resume's console goes on from)

The config says how the net was built (its model spec and model_args, modelspec.build), so it is under the
checksum too; a net built again from it must have the parameter table (names and shapes) that
/state/params holds (Checkpoint.check_parameters), or a resume and an evaluation refuse it.

The file is built in memory, written under a temporary name in the same folder, fsync'd and renamed over
the old one (keeping its mode), so an interruption or a full disk at any moment leaves either the previous
checkpoint or the new one. A checkpoint is never written from a net whose state is not all finite, and
loading checks the structure, the ranges, finiteness and the checksums (of the arrays and of the
attributes), so a damaged file is named as such instead of failing later: one HDF5 cannot parse, one that
claims an older format than the fields it holds, and every field a resume reads (data_rng's too, key by
key) checked for type and shape, not only for its checksum. Before any array is read, what each declares is
checked against what the file stores (io/data.py's check: a crafted file of kilobytes may declare gigabytes)
and all of them against the memory available, so every reader (a resume, evaluate, minibp.load, --init-from)
refuses such a file in one line.
"""
import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .. import backend
from ..arena import format_bytes
from ..io.data import stored_problem
from ..io.imagenet import READER
from ..integrity import (HDF5_ERRORS, NotOwnFile, descriptor_path, open_own, sha256_array as sha256, sha256_bytes,
                         stored_outside, write_atomic)
from .folder import BEST, CHECKPOINT

FORMAT = "minibp-checkpoint-3"
UNCHECKED_ATTRS = "minibp-checkpoint-2"  # no class names, attributes not under a checksum: still read
OLD_FORMAT = "minibp-checkpoint-1"  # flat params/velocity/running arrays and no checksums: still read
ATTRS = ("format", "iteration", "config", "data_epoch", "data_position", "data_rng")  # all that a resume reads
OPTIONAL_ATTRS = ("data", "validation", "started_from", "memory",  # JSON, under attrs_sha256 where present (older files
                  "structure", "model_file", "clock")
#                                                           lack them)
# What each later format added, refused in a file that claims an earlier one: a flipped bit in the format
# (3 -> 2 or 1) would otherwise skip the checksums those fields are under.
LATER = {UNCHECKED_ATTRS: ("attrs_sha256", "class_names"), OLD_FORMAT: ("attrs_sha256", "class_names", "state")}


def _count(end):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 <= v < end


_SHA256 = (lambda v: isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v), "a hex SHA-256")
# data_rng, field by field: a resume hands it to the data reader as it is (a wrong field was a KeyError deep in
# numpy). Batches draws from numpy's PCG64; imagenet.Batches.state names its reader, seed and listing.
PCG64_STATE = dict(bit_generator=(lambda v: v == "PCG64", "'PCG64'"),
                   state=dict(state=(_count(2**128), "an integer in [0, 2**128)"),
                              inc=(_count(2**128), "an integer in [0, 2**128)")),
                   has_uint32=(_count(2), "0 or 1"), uinteger=(_count(2**32), "an integer in [0, 2**32)"))
READER_STATE = dict(reader=(lambda v: v == READER, repr(READER)),
                    state=dict(seed=(_count(float("inf")), "a non-negative integer"), listing_sha256=_SHA256))


class NotFinite(ValueError):
    """The net holds NaN or Inf: training diverged, and nothing of it may be saved."""


@dataclass
class Checkpoint:
    iteration: int
    config: dict
    state: dict        # name -> array, as net.state() gives it (an old-format file: "flat/params", ...)
    data_state: dict
    path: str = "the checkpoint"
    class_names: tuple = None  # the data's class names (None: the data has none, or an older file)
    data: dict = None          # {name, sha256, shape, classes} of the data trained on (None: an older file)
    mean: np.ndarray = None    # (H, W, C) float32 the training images' mean (None: ImageNet, or an older file)
    validation: dict = None    # {split, loss, accuracy} of the validation of this state (best.h5), or None
    started_from: dict = None  # {checkpoint, iteration, taken, fresh} of --init-from's run, or None
    memory: dict = None        # a --memory run's record (run/memory.py: its budget, calibration and mix), or None
    structure: dict = None     # the net as data (Net.structure), or None: an older file, or a net not held as data
    model_file: dict = None    # {path, sha256} of the model file the net was built with (your own net's), or None
    clock: dict = None         # {seconds}: the run's training time up to this state, over all its sessions, or None

    def check_classes(self, names, where):
        """A ValueError naming the first difference unless names (the class names of the data at `where`)
        are the run's: a renamed or replaced class folder would shift every label after it."""
        if self.class_names is None or tuple(names) == self.class_names:
            return
        first = next((i for i, (a, b) in enumerate(zip(self.class_names, names)) if a != b),
                     min(len(names), len(self.class_names)))
        saved = self.class_names[first] if first < len(self.class_names) else "nothing"
        found = names[first] if first < len(names) else "nothing"
        raise ValueError(f"{where} does not hold the classes {self.path} was trained on: label {first} is "
                         f"{saved!r} in the run and {found!r} there ({len(self.class_names)} classes against "
                         f"{len(names)})")

    def check_data_checksum(self, sha256, where):
        """A ValueError unless the data file at `where`, of root checksum sha256, is the one the run trained on
        (where both carry the checksum: files and runs before it are not compared)."""
        recorded = (self.data or {}).get("sha256")
        if recorded and sha256 and recorded != sha256:
            raise ValueError(f"{where} is not the data {self.path} was trained on: its checksum is {sha256[:12]}..., "
                             f"the run's {recorded[:12]}... (another file, or one written again with other contents)")

    def check_parameters(self, net, built):
        """A ValueError naming the first difference unless net's parameter table (names and shapes, params.py)
        is the one this checkpoint holds: `built` (how the net was built, for the message) gave another net
        than the run's (an edited file, another version of a package)."""
        if "flat/params" in self.state:  # the oldest format names nothing: restore compares the sizes
            return
        saved, table = _table(self), _table(net)
        differences = [f"the checkpoint's {name} is {saved[name]}, the net's {shape}" if name in saved else
                       f"the net has {name} {shape}, the checkpoint has none" for name, shape in table.items()
                       if saved.get(name) != shape]  # in the table's order
        differences += [f"the checkpoint has {name} {shape}, the net has none" for name, shape in saved.items()
                        if name not in table]
        if differences:
            raise ValueError(f"{self.path} holds another net than {built} builds now: {differences[0]}")

    def check_data(self, net, build, where):
        """A ValueError saying that the data differ unless the data at `where`, for which net was built, have
        the image channels and classes of the run's: otherwise check_parameters would blame the net. The
        run's are read off the saved parameters that follow them, found by building the net for one more
        channel and one more class (build(input_shape, classes) -> a net); a difference those do not explain
        is left to check_parameters."""
        saved = _table(self)
        if saved is None or _table(net) == saved:
            return
        shape, classes = tuple(net.input_shape), net.classes
        try:  # (a net of your own may refuse other data: then nothing is known of the run's)
            channels = _followed(net, build(shape[:-1] + (shape[-1] + 1,), classes), saved, shape[-1])
            run_classes = _followed(net, build(shape, classes + 1), saved, classes)
            fits = (channels, run_classes) != (shape[-1], classes) and _table(
                build(shape[:-1] + (channels,), run_classes)) == saved
        except ValueError:
            return
        if fits:
            raise ValueError(f"the data differ from the run's: {where} holds {'x'.join(map(str, shape))} images "
                             f"(H x W x C) of {classes} classes; {self.path} was trained on {channels}-channel "
                             f"images of {run_classes} classes")


def _table(net_or_checkpoint):
    """{name: shape} of a net's parameters, or of those a checkpoint holds (None: the oldest format's)."""
    if isinstance(net_or_checkpoint, Checkpoint):
        state = net_or_checkpoint.state
        return None if "flat/params" in state else {
            n.removeprefix("params/"): a.shape for n, a in state.items() if n.startswith("params/")}
    return {name: tuple(p.shape) for name, _, p in net_or_checkpoint.parameter_table()}


def _followed(net, probe, saved, value):
    """The saved value of what `probe` (net built for value + 1 of it) has one more of: the sizes the two
    nets' parameters differ in, read off the checkpoint's; `value` when they tell nothing or disagree."""
    base, probe = _table(net), _table(probe)
    found = {saved[name][axis] for name, shape in base.items()
             if len(probe.get(name, ())) == len(saved.get(name, ())) == len(shape)
             for axis, (size, more) in enumerate(zip(shape, probe[name])) if (size, more) == (value, value + 1)}
    return found.pop() if len(found) == 1 else value


def check_finite(arrays):
    """Raise NotFinite naming the arrays that hold NaN or Inf."""
    bad = [name for name, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise NotFinite(f"the net's {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold NaN or Inf")


def attrs_sha256(attrs):
    """The SHA-256 of a checkpoint's ATTRS and those OPTIONAL_ATTRS it has, as their text (an HDF5 integer
    reads back as numpy's); a file without the optional ones sums as it always did."""
    optional = [f"{k}={attrs[k]}" for k in OPTIONAL_ATTRS if k in attrs]
    return sha256_bytes(json.dumps([str(attrs[k]) for k in ATTRS] + optional).encode())


def save(path, net, *, iteration, config, data_state, class_names=None, data=None, mean=None, validation=None,
         started_from=None, memory=None, model_file=None, clock=None):
    """Write net's state, the iteration, the run's config, the data stream's state, the data's class
    names and (optional) facts of the data (a dict), the training images' mean, this state's validation
    and where the run started from (dicts) to path, atomically. Raises NotFinite (writing nothing) if the
    net diverged."""
    state = net.state(copy=False)  # (read while nothing steps: no copy of the state beside the arena)
    check_finite(state)
    arrays = {f"state/{name}": array for name, array in state.items()}
    arrays["data_order"] = np.asarray(data_state["order"], np.int64)
    names = None if class_names is None else list(class_names)
    arrays["class_names"] = np.frombuffer(json.dumps(names).encode(), np.uint8)
    if mean is not None:
        arrays["preprocess/mean"] = np.asarray(mean, np.float32)
    attrs = dict(format=FORMAT, iteration=int(iteration), config=json.dumps(config),
                 data_epoch=int(data_state["epoch"]), data_position=int(data_state["position"]),
                 data_rng=data_state["rng"])
    optional = dict(data=data, validation=validation, started_from=started_from, memory=memory,
                    structure=net.structure(),  # the net as data: a run loads without its model file's code
                    model_file=model_file, clock=clock)
    attrs.update({k: json.dumps(v) for k, v in optional.items() if v is not None})
    image = io.BytesIO()  # built in memory: a failed disk write (a full disk) is then a plain OSError, where
    with h5py.File(image, "w") as f:  # h5py, failing mid-file, can crash the process
        f.attrs.update(attrs, attrs_sha256=attrs_sha256(attrs))
        for name, array in arrays.items():
            f[name] = array
            f[name].attrs["sha256"] = sha256(array)
    write_atomic(path, image.getbuffer())
    return path


def checkpoint_path(run, which=None):
    """The checkpoint file of a run folder (which: "best", "last", or None: best.h5 where there is one), or
    `run` itself when it is a file (which, a choice among a folder's, refused with it: never silently ignored)."""
    run = Path(run)
    if which not in (None, "best", "last"):
        raise ValueError(f"which is 'best', 'last' or None, got {which!r}")
    if run.is_file():
        if which is not None:
            raise ValueError(f"{run} is a checkpoint file: --which {which} (which=) chooses among a run folder's "
                             "best.h5 and checkpoint.h5; give the folder, or the file alone")
        return run
    if not run.is_dir():
        raise FileNotFoundError(f"no run folder or checkpoint at {run}")
    best, last = run / BEST, run / CHECKPOINT
    has_best = os.path.lexists(best)  # (a link there too: load refuses it, never reads through it)
    if which == "best" and not has_best:
        raise FileNotFoundError(f"{run} has no best.h5: it is written at each validation that beats the run's "
                                "best so far (which='last', --which last: its last checkpoint)")
    return best if which == "best" or (which is None and has_best) else last


def load(path):
    """The Checkpoint at path, validated; a ValueError naming the file and the fault otherwise (NotOwnFile for a
    link or anything but a regular file there: never read through)."""
    path = Path(path)
    try:
        fd, _ = open_own(path, os.O_RDONLY)
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint at {path}") from None
    except NotOwnFile:
        raise
    except OSError as e:
        raise ValueError(f"{path} is not a readable minibp checkpoint ({e.strerror})") from None
    try:  # the file opened, whatever its name holds now
        fmt, arrays, attrs = _read(path, descriptor_path(fd, path), size=os.fstat(fd).st_size)
    finally:
        os.close(fd)
    try:
        checkpoint = _validated(arrays, attrs, fmt=fmt)
    except ValueError as e:
        raise ValueError(f"{path} is damaged: {e}") from None
    checkpoint.path = str(path)
    return checkpoint


def _read(path, name, *, size):
    """(format, {name: (array, its sha256 attribute)}, attributes) of the checkpoint file opened at name, its
    structure checked, and what its arrays declare against what it stores and the memory before any is read;
    path: the file's, for messages; size: its bytes."""
    try:
        f = h5py.File(name, "r")
    except OSError as e:  # not HDF5, truncated, or not ours to read
        raise ValueError(f"{path} is not a readable minibp checkpoint ({e})") from None
    except HDF5_ERRORS as e:
        raise ValueError(f"{path} is damaged: HDF5 cannot read it ({e})") from None
    try:
        with f:
            fmt = f.attrs.get("format")
            if not isinstance(fmt, str) or fmt not in (FORMAT, UNCHECKED_ATTRS, OLD_FORMAT):
                raise _Refused(f"is not a minibp checkpoint (format {fmt!r})")
            later = [n for n in LATER.get(fmt, ()) if n in f.attrs or n in f]
            if later:
                raise _Refused(f"is damaged: it says format {fmt} but holds {', '.join(later)}, which only a later "
                               f"format has")
            groups = {FORMAT: ("state", "data_order", "class_names"), UNCHECKED_ATTRS: ("state", "data_order"),
                      OLD_FORMAT: ("params", "velocity", "running", "data_order")}[fmt]
            missing = [n for n in groups if n not in f]
            missing += [n for n in ATTRS + (("attrs_sha256",) if fmt == FORMAT else ()) if n not in f.attrs]
            if missing:
                raise _Refused(f"lacks {', '.join(missing)}")
            datasets = {}
            f.visititems(lambda name, item: datasets.__setitem__(name, item) if isinstance(item, h5py.Dataset)
                         else None)
            outside = [name for name, item in datasets.items() if stored_outside(item)]
            if outside:
                raise _Refused(f"is damaged: {outside[0]} is stored outside the file (HDF5 external or virtual "
                               "storage), which minibp does not read")
            _check_declared(path, datasets, size)
            arrays = {name: (item[...], item.attrs.get("sha256")) for name, item in datasets.items()}
            attrs = {k: f.attrs[k] for k in f.attrs}
    except _Refused as e:
        raise ValueError(f"{path} {e}") from None
    except HDF5_ERRORS as e:  # an open file whose insides HDF5 cannot parse (a zeroed block: RuntimeError)
        raise ValueError(f"{path} is damaged: HDF5 cannot read it ({e})") from None
    return fmt, arrays, attrs


def _check_declared(path, datasets, size):
    """Refuse arrays that declare values the file does not store (never written: they would read as zeros, a
    file of kilobytes declaring gigabytes), or more bytes stored than the file has, or more than the memory
    takes, before any is read."""
    problem = next(filter(None, (stored_problem(f"{name}'s values", item) for name, item in datasets.items())), None)
    if problem:
        raise _Refused(f"is damaged: {problem}")
    stored = sum(item.id.get_storage_size() for item in datasets.values())  # (compressed: what the file holds)
    if stored > size:
        raise _Refused(f"is damaged: its arrays say they store {format_bytes(stored)} in a file of "
                       f"{format_bytes(size)} (cut short)")
    needed, free = sum(item.nbytes for item in datasets.values()), backend.host_memory()
    if free is not None and needed > free:
        raise _Refused(f"holds arrays that take {format_bytes(needed)} in memory, more than the {format_bytes(free)} "
                       "available")


class _Refused(ValueError):
    """What load found wrong in a file it could read (h5py's own ValueErrors are damage it could not)."""


def _validated(arrays, attrs, *, fmt):
    if fmt == FORMAT and str(attrs["attrs_sha256"]) != attrs_sha256(attrs):
        raise ValueError(f"its attributes ({', '.join(ATTRS)}) fail their SHA-256 check")
    if fmt == OLD_FORMAT:
        print("warning: an older checkpoint without checksums: it cannot be verified", file=sys.stderr)
        arrays = {("flat/" + n if n != "data_order" else n): v for n, v in arrays.items()}
    else:
        if fmt == UNCHECKED_ATTRS:
            print("warning: an older checkpoint: its iteration and config are not under a checksum and cannot "
                  "be verified", file=sys.stderr)
        for name, (array, digest) in arrays.items():
            if digest != sha256(array):
                raise ValueError(f"{name} fails its SHA-256 check")
    order = arrays.pop("data_order")[0]
    class_names = _class_names(arrays.pop("class_names")[0]) if "class_names" in arrays else None
    mean = arrays.pop("preprocess/mean")[0] if "preprocess/mean" in arrays else None
    if mean is not None and (mean.dtype != np.float32 or mean.ndim != 3 or not np.isfinite(mean).all()):
        raise ValueError(f"preprocess/mean is {mean.dtype} {mean.shape}, not a finite (H, W, C) float32 image")
    optional = {}
    for key in OPTIONAL_ATTRS:
        try:
            optional[key] = json.loads(str(attrs[key])) if key in attrs else None
        except json.JSONDecodeError:
            raise ValueError(f"its {key} attribute is not valid JSON") from None
        if optional[key] is not None and not isinstance(optional[key], dict):
            raise ValueError(f"its {key} attribute is not a JSON object")
    seconds = (optional["clock"] or {}).get("seconds", 0)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 <= seconds < float("inf"):
        raise ValueError(f"its clock's seconds are {seconds!r}, not a finite non-negative number")
    classes = (optional["data"] or {}).get("classes")
    if class_names is not None and isinstance(classes, int) and len(class_names) != classes:
        raise ValueError(f"it holds {len(class_names)} class names for its data's {classes} classes")
    state = {name.removeprefix("state/"): array for name, (array, _) in arrays.items()}
    bad = [name for name, a in state.items() if a.dtype.kind != "f"]
    if bad:
        raise ValueError(f"{bad[0]} is {state[bad[0]].dtype}, not floating point")
    check_finite(state)
    if any((a[1] < 0).any() for name, a in state.items() if name.startswith("running/") and a.shape[:1] == (2,)):
        raise ValueError("a running variance is negative")  # (other shapes: refused by restore, which names them)
    if fmt == OLD_FORMAT:  # _from_flat slices them as vectors and a (2, C) array
        params, velocity, running = (state[f"flat/{n}"] for n in ("params", "velocity", "running"))
        if params.ndim != 1 or velocity.shape != params.shape or running.ndim != 2 or len(running) != 2:
            raise ValueError(f"its params {params.shape}, velocity {velocity.shape} and running {running.shape} "
                             "are not the flat layout's (N,), (N,) and (2, C)")
    try:
        config = json.loads(attrs["config"])
        rng = json.loads(str(attrs["data_rng"]))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"its config or data_rng is not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ValueError("its config attribute is not a JSON object")
    # an ImageNet run's is its reader's, which names itself (so does a state saved without a config); else numpy's
    reader = config.get("data") == "imagenet" or isinstance(rng, dict) and "reader" in rng
    problem = _structure_problem(rng, READER_STATE if reader else PCG64_STATE, "data_rng")
    if problem:
        raise ValueError(problem)
    counts = ("iteration", "data_epoch", "data_position")
    bad = [k for k in counts if not isinstance(attrs[k], (int, np.integer)) or isinstance(attrs[k], bool)]
    if bad:
        raise ValueError(f"its {bad[0]} is {attrs[bad[0]]!r}, not an integer")
    iteration, epoch, position = (int(attrs[k]) for k in counts)
    if order.ndim != 1 or order.dtype.kind not in "iu" or not np.array_equal(np.sort(order), np.arange(len(order))):
        raise ValueError("data_order is not a permutation of the training images")
    if iteration < 0 or epoch < 0 or not 0 <= position <= len(order):
        raise ValueError(f"iteration {iteration}, data epoch {epoch} or position {position} out of range")
    return Checkpoint(iteration=iteration, config=config, state=state, class_names=class_names,
                      data_state=dict(epoch=epoch, position=position, order=order.astype(np.int64),
                                      rng=str(attrs["data_rng"])), mean=mean, **optional)


def _structure_problem(value, fields, name):
    """What is wrong with a JSON value against fields ({key: (check, what it must be)}, or a dict of those for
    a nested object), named by its path ("data_rng.state.inc"), or None."""
    if not isinstance(value, dict):
        return f"its {name} is {_short(value)}, not a JSON object"
    unknown = [k for k in value if k not in fields]
    if unknown:
        return f"its {name} holds {unknown[0]!r}, which it has no place for"
    for key, field in fields.items():
        if key not in value:
            return f"its {name} lacks {key}"
        problem = (_structure_problem(value[key], field, f"{name}.{key}") if isinstance(field, dict) else
                   None if field[0](value[key]) else f"its {name}.{key} is {_short(value[key])}, not {field[1]}")
        if problem:
            return problem
    return None


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _class_names(array):
    """The class names stored as JSON bytes: a tuple of strings, or None."""
    try:  # (save writes a uint8 vector: anything else is damage)
        names = json.loads(array.tobytes().decode()) if array.dtype == np.uint8 and array.ndim == 1 else False
    except (UnicodeDecodeError, json.JSONDecodeError):
        names = False
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ValueError("class_names is not a list of names")
    return None if names is None else tuple(names)


def restore(net, checkpoint):
    """Copy a checkpoint's parameters, momentum and running statistics into a compiled net."""
    state = checkpoint.state
    try:
        if "flat/params" in state:
            state = _from_flat(net, *(state[f"flat/{n}"] for n in ("params", "velocity", "running")))
        net.load_state(state)
    except ValueError as e:
        raise ValueError(f"{checkpoint.path} does not fit the model: {e}") from None


def _from_flat(net, params, velocity, running):
    """The old format's flat vectors (in the net's parameter order) as named state."""
    state, offset, channel = {}, 0, 0
    for name, array in net.state().items():
        kind, rest = name.split("/", 1)
        if kind == "params":
            state[name] = params[offset:offset + array.size].reshape(array.shape)
            state["momentum/" + rest] = velocity[offset:offset + array.size].reshape(array.shape)
            offset += array.size
        elif kind == "running":
            state[name] = running[:, channel:channel + array.shape[1]]
            channel += array.shape[1]
    if offset != params.size or channel != running.shape[1]:
        raise ValueError("the checkpoint holds another model")
    return state
