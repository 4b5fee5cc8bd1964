"""File integrity: the SHA-256 checksums minibp's files carry, and files published whole.

    sha256_bytes(b"header", data)       # hex SHA-256 of the parts, concatenated
    sha256_array(array)                 # of an array's bytes in C order, its own dtype (checkpoints, data files)
    file_digest(path, "md5")            # of a file, read in blocks
    write_atomic(path, data)            # bytes or text, published whole
    with atomic_file(path) as tmp: ...  # the block writes the file named tmp; published whole when it ends

A file is published whole: written under a temporary name beside it (`<name>.<random>.tmp`), fsync'd,
given the mode of the file it replaces (a new file: the one the umask gives) and renamed over it, so an
interruption or a full disk at any moment leaves either the old file or the new one. A failed write
removes its temporary file; one that a killed writer left behind is found by stale_temporaries.
"""
import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

# What h5py raises for a file whose structure HDF5 cannot parse: its error table maps HDF5's errors to these,
# RuntimeError where it has no closer one (NotImplementedError among them). MemoryError and KeyboardInterrupt
# are none of them, and pass.
HDF5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def sha256_bytes(*parts):
    """The hex SHA-256 of the bytes-like parts, one after the other."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return digest.hexdigest()


def sha256_array(array):
    """The hex SHA-256 of an array's bytes, in C order and its own dtype."""
    return sha256_bytes(np.ascontiguousarray(array).data)


def file_digest(path, algorithm="sha256"):
    """The hex digest (hashlib's algorithm name) of the file at path."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stale_temporaries(path):
    """Temporary files that interrupted writes of `path` left behind (atomic_file's naming)."""
    path = Path(path)
    return sorted(path.parent.glob(f"{path.name}.*.tmp"))


@contextlib.contextmanager
def atomic_file(path):
    """The name of a temporary file beside path (in a folder that exists) for the block to write; renamed
    to path when the block ends without error, with path's mode (a new file: the one the umask gives),
    removed otherwise."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb") as written:  # on disk before the rename, so a crash cannot publish a hole
            os.fsync(written.fileno())
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # mkstemp makes the file private
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path, data):
    """Publish data (bytes-like, or text written as UTF-8) at path whole (atomic_file)."""
    with atomic_file(path) as tmp:
        Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data)
