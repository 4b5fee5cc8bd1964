"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file written atomically.

    /state/params/<name>     each parameter, by the net's names (net.py's key(): "unit3.w", ...)
    /state/momentum/<name>   its SGD momentum
    /state/running/<unit>    (2, C) that unit's BN running mean and variance
    /data_order  (N,)        the current epoch's order of training images
    attrs: format, iteration, config (JSON), data_epoch, data_position, data_rng (JSON); every array
           carries the SHA-256 of its bytes as its attribute sha256

The file is written under a temporary name in the same folder, fsync'd and renamed over the old one,
so an interruption at any moment leaves either the previous checkpoint or the new one. A checkpoint
is never written from a net whose state is not all finite, and loading checks the structure, the
ranges, finiteness and the checksums, so a damaged file is named as such instead of failing later.
"""
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np


FORMAT = "minibp-checkpoint-2"
OLD_FORMAT = "minibp-checkpoint-1"  # flat params/velocity/running arrays and no checksums: still read


class NotFinite(ValueError):
    """The net holds NaN or Inf: training diverged, and nothing of it may be saved."""


@dataclass
class Checkpoint:
    iteration: int
    config: dict
    state: dict        # name -> array, as net.state() gives it (an old-format file: "flat/params", ...)
    data_state: dict
    path: str = "the checkpoint"


def check_finite(arrays):
    """Raise NotFinite naming the arrays that hold NaN or Inf."""
    bad = [name for name, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise NotFinite(f"the net's {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} hold NaN or Inf")


def sha256(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def stale_temporaries(path):
    """Temporary files that interrupted writes of `path` left behind (atomic_h5's naming)."""
    path = Path(path)
    return sorted(path.parent.glob(f"{path.name}.*.tmp"))


@contextlib.contextmanager
def atomic_h5(path):
    """An HDF5 file open for writing under a temporary name beside path, renamed to path when the block
    ends without error (with the permissions a new file would get); removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        with h5py.File(tmp, "w") as f:
            yield f
        with open(tmp, "rb") as written:  # on disk before the rename, so a crash cannot publish a hole
            os.fsync(written.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save(path, net, *, iteration, config, data_state):
    """Write net's state, the iteration, the run's config and the data stream's state to path,
    atomically. Raises NotFinite (writing nothing) if the net diverged."""
    state = net.state()
    check_finite(state)
    arrays = {f"state/{name}": array for name, array in state.items()}
    arrays["data_order"] = np.asarray(data_state["order"], np.int64)
    with atomic_h5(path) as f:
        f.attrs.update(format=FORMAT, iteration=int(iteration), config=json.dumps(config),
                       data_epoch=int(data_state["epoch"]), data_position=int(data_state["position"]),
                       data_rng=data_state["rng"])
        for name, array in arrays.items():
            f[name] = array
            f[name].attrs["sha256"] = sha256(array)
    return path


def load(path):
    """The Checkpoint at path, validated; a ValueError naming the file and the fault otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            if fmt not in (FORMAT, OLD_FORMAT):
                raise ValueError(f"is not a minibp checkpoint (format {fmt!r})")
            groups = ("state", "data_order") if fmt == FORMAT else ("params", "velocity", "running", "data_order")
            missing = [n for n in groups if n not in f]
            missing += [n for n in ("iteration", "config", "data_epoch", "data_position", "data_rng")
                        if n not in f.attrs]
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
        checkpoint = _validated(arrays, attrs, checked=fmt == FORMAT)
    except ValueError as e:
        raise ValueError(f"{path} is damaged: {e}") from None
    checkpoint.path = str(path)
    return checkpoint


def _validated(arrays, attrs, *, checked):
    if checked:
        for name, (array, digest) in arrays.items():
            if digest != sha256(array):
                raise ValueError(f"{name} fails its SHA-256 check")
    else:
        print("warning: an older checkpoint without checksums: it cannot be verified", file=sys.stderr)
        arrays = {("flat/" + n if n != "data_order" else n): v for n, v in arrays.items()}
    order = arrays.pop("data_order")[0]
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
    iteration, epoch, position = (int(attrs[k]) for k in ("iteration", "data_epoch", "data_position"))
    if order.ndim != 1 or order.dtype.kind not in "iu" or not np.array_equal(np.sort(order), np.arange(len(order))):
        raise ValueError("data_order is not a permutation of the training images")
    if iteration < 0 or epoch < 0 or not 0 <= position <= len(order):
        raise ValueError(f"iteration {iteration}, data epoch {epoch} or position {position} out of range")
    return Checkpoint(iteration=iteration, config=config, state=state,
                      data_state=dict(epoch=epoch, position=position, order=order.astype(np.int64),
                                      rng=str(attrs["data_rng"])))


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
