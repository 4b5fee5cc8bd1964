"""Checkpoints: everything a run needs to continue bit for bit, in one HDF5 file written atomically.

    /params      (P,)  the flat parameter vector        /velocity   (P,)  SGD momentum
    /running     (2, S) BN running mean and variance of every BN unit, channels concatenated in unit order
    /data_order  (N,)  the current epoch's order of training images
    attrs: iteration, config (JSON), mode, data_epoch, data_position, data_rng (JSON), format

The file is written under a temporary name in the same folder and renamed over the old one, so an
interruption at any moment leaves either the previous checkpoint or the new one.
"""
import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from . import backend

FORMAT = "minibp-checkpoint-1"


@dataclass
class Checkpoint:
    iteration: int
    config: dict
    params: np.ndarray
    velocity: np.ndarray
    running: np.ndarray
    data_state: dict


def _running_stats(net):
    units = [u for u in net.units if u.batchnorm]
    if not units:
        return np.zeros((2, 0), net.dtype)
    return np.concatenate([backend.to_host(net.arena[f"running{u.index}"]) for u in units], axis=1)


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
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes the file private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save(path, net, *, iteration, config, data_state):
    """Write net's parameters, momentum and BN running statistics, the iteration, the run's config and
    the data stream's state to path, atomically."""
    with atomic_h5(path) as f:
        f.attrs.update(format=FORMAT, iteration=int(iteration), config=json.dumps(config), mode=net.mode,
                       data_epoch=int(data_state["epoch"]), data_position=int(data_state["position"]),
                       data_rng=data_state["rng"])
        f["params"] = backend.to_host(net.params)
        f["velocity"] = backend.to_host(net.arena["velocity"])
        f["running"] = _running_stats(net)
        f["data_order"] = np.asarray(data_state["order"], np.int64)
    return path


def load(path):
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise ValueError(f"{path} is not a minibp checkpoint (format {f.attrs.get('format')!r})")
            a = f.attrs
            return Checkpoint(
                iteration=int(a["iteration"]), config=json.loads(a["config"]), params=f["params"][...],
                velocity=f["velocity"][...], running=f["running"][...],
                data_state=dict(epoch=int(a["data_epoch"]), position=int(a["data_position"]),
                                order=f["data_order"][...], rng=str(a["data_rng"])))
    except (OSError, KeyError) as e:
        raise ValueError(f"{path} is not a readable minibp checkpoint ({e})") from None


def restore(net, checkpoint):
    """Copy a checkpoint's parameters, momentum and running statistics into a compiled net."""
    if checkpoint.params.shape != net.params.shape:
        raise ValueError(f"the checkpoint has {checkpoint.params.size} parameters, the net {net.params.size}: "
                         "another model")
    xp = backend.xp
    net.params[...] = xp.asarray(checkpoint.params.astype(net.dtype, copy=False))
    net.arena["velocity"][...] = xp.asarray(checkpoint.velocity.astype(net.dtype, copy=False))
    offset = 0
    for u in net.units:
        if u.batchnorm:
            C = u.in_shape[2]
            net.arena[f"running{u.index}"][...] = xp.asarray(checkpoint.running[:, offset:offset + C])
            offset += C
