"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file written atomically.

    /params      (P,)   the flat parameter vector        /velocity   (P,)  SGD momentum
    /running     (2, S) BN running mean and variance of every BN unit, channels concatenated in unit order
    /data_order  (N,)   the current epoch's order of training images
    attrs: format, iteration, config (JSON), data_epoch, data_position, data_rng (JSON), and the SHA-256
           of each array's bytes (params_sha256, ...)

The file is written under a temporary name in the same folder and renamed over the old one, so an
interruption at any moment leaves either the previous checkpoint or the new one. A checkpoint is never
written from a net whose parameters, momentum or running statistics are not all finite, and loading
checks the structure, the shapes, the ranges, finiteness and the checksums, so a damaged file is named
as such instead of failing later.
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

from . import backend

FORMAT = "minibp-checkpoint-2"
OLD_FORMATS = ("minibp-checkpoint-1",)  # readable, but carry no checksums
ARRAYS = ("params", "velocity", "running", "data_order")


class NotFinite(ValueError):
    """The net holds NaN or Inf: training diverged, and nothing of it may be saved."""


@dataclass
class Checkpoint:
    iteration: int
    config: dict
    params: np.ndarray      # (P,)
    velocity: np.ndarray    # (P,)
    running: np.ndarray     # (2, S)
    data_state: dict


def state_arrays(net):
    """{name: host array} of what a checkpoint keeps of a compiled net."""
    return dict(params=backend.to_host(net.params), velocity=backend.to_host(net.arena["velocity"]),
                running=backend.to_host(net.arena["running"]))


def check_finite(arrays):
    """Raise NotFinite naming the arrays that hold NaN or Inf."""
    bad = [name for name, a in arrays.items() if a.dtype.kind == "f" and not np.isfinite(a).all()]
    if bad:
        raise NotFinite(f"the net's {' and '.join(bad)} hold NaN or Inf")


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
    """Write net's parameters, momentum and BN running statistics, the iteration, the run's config and
    the data stream's state to path, atomically. Raises NotFinite (writing nothing) if the net diverged."""
    arrays = state_arrays(net)
    check_finite(arrays)
    arrays["data_order"] = np.asarray(data_state["order"], np.int64)
    with atomic_h5(path) as f:
        f.attrs.update(format=FORMAT, iteration=int(iteration), config=json.dumps(config),
                       data_epoch=int(data_state["epoch"]), data_position=int(data_state["position"]),
                       data_rng=data_state["rng"])
        for name, array in arrays.items():
            f[name] = array
            f.attrs[f"{name}_sha256"] = sha256(array)
    return path


def load(path):
    """The Checkpoint at path, validated; a ValueError naming the file and the fault otherwise."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
            if fmt != FORMAT and fmt not in OLD_FORMATS:
                raise ValueError(f"is not a minibp checkpoint (format {fmt!r})")
            missing = [n for n in ARRAYS if not isinstance(f.get(n), h5py.Dataset)]
            missing += [n for n in ("iteration", "config", "data_epoch", "data_position", "data_rng")
                        if n not in f.attrs]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
            arrays = {n: f[n][...] for n in ARRAYS}
            attrs = {k: f.attrs[k] for k in f.attrs}
    except OSError as e:
        raise ValueError(f"{path} is not a readable minibp checkpoint ({e})") from None
    except ValueError as e:
        raise ValueError(f"{path} {e}") from None
    try:
        return _validated(arrays, attrs, checked=fmt == FORMAT)
    except ValueError as e:
        raise ValueError(f"{path} is damaged: {e}") from None


def _validated(arrays, attrs, *, checked):
    if checked:
        for name, array in arrays.items():
            if attrs.get(f"{name}_sha256") != sha256(array):
                raise ValueError(f"{name} fails its SHA-256 check")
    else:
        print("warning: an older checkpoint without checksums: it cannot be verified", file=sys.stderr)
    params, velocity, running, order = (arrays[n] for n in ARRAYS)
    if params.ndim != 1 or velocity.shape != params.shape or running.ndim != 2 or running.shape[0] != 2:
        raise ValueError(f"array shapes params {params.shape}, velocity {velocity.shape}, running {running.shape} "
                         "do not fit together")
    for name in ("params", "velocity", "running"):
        if arrays[name].dtype.kind != "f":
            raise ValueError(f"{name} is {arrays[name].dtype}, not floating point")
    check_finite(dict(params=params, velocity=velocity, running=running))
    if (running[1] < 0).any():
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
    return Checkpoint(iteration=iteration, config=config, params=params, velocity=velocity, running=running,
                      data_state=dict(epoch=epoch, position=position, order=order.astype(np.int64),
                                      rng=str(attrs["data_rng"])))


def restore(net, checkpoint):
    """Copy a checkpoint's parameters, momentum and running statistics into a compiled net."""
    if checkpoint.params.shape != net.params.shape or checkpoint.running.shape != net.arena["running"].shape:
        raise ValueError(f"the checkpoint has {checkpoint.params.size} parameters and {checkpoint.running.shape[1]} "
                         f"BN channels, the net {net.params.size} and {net.arena['running'].shape[1]}: another model")
    xp = backend.xp
    net.params[...] = xp.asarray(checkpoint.params.astype(net.dtype, copy=False))
    net.arena["velocity"][...] = xp.asarray(checkpoint.velocity.astype(net.dtype, copy=False))
    net.arena["running"][...] = xp.asarray(checkpoint.running.astype(net.dtype, copy=False))
