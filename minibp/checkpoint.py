"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file written atomically.

    /state/params/<name>     each parameter, by the net's names (net.py's key(): "unit3.w", ...)
    /state/momentum/<name>   its SGD momentum
    /state/running/<unit>    (2, C) that unit's BN running mean and variance
    /data_order  (N,)        the current epoch's order of training images
    /class_names             uint8: the JSON list of the data's class names (ImageNet's folders), or null
    attrs: format, iteration, config (JSON), data_epoch, data_position, data_rng (JSON), and attrs_sha256,
           the SHA-256 of those six; every array carries the SHA-256 of its bytes as its attribute sha256

The config says how the net was built (its model spec and model_args, models.build), so it is under the
checksum too; a net built again from it must have the parameter table (names and shapes) that
/state/params holds (Checkpoint.check_parameters), or a resume and an evaluation refuse it.

The file is built in memory, written under a temporary name in the same folder, fsync'd and renamed over
the old one (keeping its mode), so an interruption or a full disk at any moment leaves either the previous
checkpoint or the new one. A checkpoint is never written from a net whose state is not all finite, and
loading checks the structure, the ranges, finiteness and the checksums (of the arrays and of the
attributes), so a damaged file is named as such instead of failing later.
"""
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .integrity import sha256_array as sha256, sha256_bytes, write_atomic

FORMAT = "minibp-checkpoint-3"
UNCHECKED_ATTRS = "minibp-checkpoint-2"  # no class names, attributes not under a checksum: still read
OLD_FORMAT = "minibp-checkpoint-1"  # flat params/velocity/running arrays and no checksums: still read
ATTRS = ("format", "iteration", "config", "data_epoch", "data_position", "data_rng")  # all that a resume reads


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

    def check_parameters(self, net, built):
        """A ValueError naming the first difference unless net's parameter table (names and shapes, params.py)
        is the one this checkpoint holds: `built` (how the net was built, for the message) gave another net
        than the run's (an edited file, another version of a package)."""
        if "flat/params" in self.state:  # the oldest format names nothing: restore compares the sizes
            return
        saved = {n.removeprefix("params/"): a.shape for n, a in self.state.items() if n.startswith("params/")}
        table = {name: tuple(p.shape) for name, _, p in net.parameter_table()}
        differences = [f"the checkpoint's {name} is {saved[name]}, the net's {shape}" if name in saved else
                       f"the net has {name} {shape}, the checkpoint has none" for name, shape in table.items()
                       if saved.get(name) != shape]  # in the table's order
        differences += [f"the checkpoint has {name} {shape}, the net has none" for name, shape in saved.items()
                        if name not in table]
        if differences:
            raise ValueError(f"{self.path} holds another net than {built} builds now: {differences[0]}")


def check_finite(arrays):
    """Raise NotFinite naming the arrays that hold NaN or Inf."""
    bad = [name for name, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise NotFinite(f"the net's {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold NaN or Inf")


def attrs_sha256(attrs):
    """The SHA-256 of a checkpoint's ATTRS, as their text (an HDF5 integer reads back as numpy's)."""
    return sha256_bytes(json.dumps([str(attrs[k]) for k in ATTRS]).encode())


def save(path, net, *, iteration, config, data_state, class_names=None):
    """Write net's state, the iteration, the run's config, the data stream's state and the data's class
    names to path, atomically. Raises NotFinite (writing nothing) if the net diverged."""
    state = net.state()
    check_finite(state)
    arrays = {f"state/{name}": array for name, array in state.items()}
    arrays["data_order"] = np.asarray(data_state["order"], np.int64)
    names = None if class_names is None else list(class_names)
    arrays["class_names"] = np.frombuffer(json.dumps(names).encode(), np.uint8)
    attrs = dict(format=FORMAT, iteration=int(iteration), config=json.dumps(config),
                 data_epoch=int(data_state["epoch"]), data_position=int(data_state["position"]),
                 data_rng=data_state["rng"])
    image = io.BytesIO()  # built in memory: a failed disk write (a full disk) is then a plain OSError, where
    with h5py.File(image, "w") as f:  # h5py, failing mid-file, can crash the process
        f.attrs.update(attrs, attrs_sha256=attrs_sha256(attrs))
        for name, array in arrays.items():
            f[name] = array
            f[name].attrs["sha256"] = sha256(array)
    write_atomic(path, image.getbuffer())
    return path


def load(path):
    """The Checkpoint at path, validated; a ValueError naming the file and the fault otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            if fmt not in (FORMAT, UNCHECKED_ATTRS, OLD_FORMAT):
                raise ValueError(f"is not a minibp checkpoint (format {fmt!r})")
            groups = {FORMAT: ("state", "data_order", "class_names"), UNCHECKED_ATTRS: ("state", "data_order"),
                      OLD_FORMAT: ("params", "velocity", "running", "data_order")}[fmt]
            missing = [n for n in groups if n not in f]
            missing += [n for n in ATTRS + (("attrs_sha256",) if fmt == FORMAT else ()) if n not in f.attrs]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
            arrays = {}
            f.visititems(lambda name, item: arrays.__setitem__(name, (item[...], item.attrs.get("sha256")))
                         if isinstance(item, h5py.Dataset) else None)
            attrs = {k: f.attrs[k] for k in f.attrs}
    except OSError as e:
        raise ValueError(f"{path} is not a readable minibp checkpoint ({e})") from None
    except ValueError as e:
        raise ValueError(f"{path} {e}") from None
    try:
        checkpoint = _validated(arrays, attrs, fmt=fmt)
    except ValueError as e:
        raise ValueError(f"{path} is damaged: {e}") from None
    checkpoint.path = str(path)
    return checkpoint


def _validated(arrays, attrs, *, fmt):
    if fmt == FORMAT and attrs["attrs_sha256"] != attrs_sha256(attrs):
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
    state = {name.removeprefix("state/"): array for name, (array, _) in arrays.items()}
    bad = [name for name, a in state.items() if a.dtype.kind != "f"]
    if bad:
        raise ValueError(f"{bad[0]} is {state[bad[0]].dtype}, not floating point")
    check_finite(state)
    if any((a[1] < 0).any() for name, a in state.items() if name.startswith("running/") and a.ndim == 2):
        raise ValueError("a running variance is negative")
    try:
        config = json.loads(attrs["config"])
        rng = json.loads(str(attrs["data_rng"]))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"its config or data_rng is not valid JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(rng, dict) or "state" not in rng:
        raise ValueError("its config or data_rng attribute has the wrong structure")
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
                                      rng=str(attrs["data_rng"])))


def _class_names(array):
    """The class names stored as JSON bytes: a tuple of strings, or None."""
    try:
        names = json.loads(array.astype(np.uint8).tobytes().decode())
    except (UnicodeDecodeError, json.JSONDecodeError):
        names = False
    if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
        raise ValueError("class_names is not a list of names")
    return None if names is None else tuple(names)


def restore(net, checkpoint):
    """Copy a checkpoint's parameters, momentum and running statistics into a compiled net."""
    state = checkpoint.state
    if "flat/params" in state:
        state = _from_flat(net, *(state[f"flat/{n}"] for n in ("params", "velocity", "running")))
    try:
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
