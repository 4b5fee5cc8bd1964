"""File integrity: the SHA-256 checksums minibp's files carry, and files published whole.

    sha256_bytes(b"header", data)       # hex SHA-256 of the parts, concatenated
    sha256_array(array)                 # of an array's bytes in C order, its own dtype (checkpoints, data files)
    file_digest(path, "md5")            # of a file, read in blocks
    write_atomic(path, data)            # bytes or text, published whole
    with atomic_file(path) as tmp: ...  # the block writes the file named tmp; published whole when it ends
    fd, made = open_own(path, os.O_RDWR, create=True)   # a file of minibp's own, never through a link

A file is published whole: written under a temporary name beside it (`<name>.<random>.tmp`), fsync'd,
given the mode of the file it replaces (a new file: the one the umask gives, never writable by others) and
renamed over it, so an
interruption or a full disk at any moment leaves either the old file or the new one. A failed write
removes its temporary file; one that a killed writer left behind is found by stale_temporaries, and the next
write of that name removes it (remove_stale_temporaries) where it is minibp's own: of its naming, the user's
regular file, unchanged for STALE_S seconds (a writer at work writes to it) and locked by no writer (HDF5 holds a
lock on a file it writes, which the OS drops however the writer dies). A writer that a removal still caught
fails at its publication, which checks that its temporary file is the one it made. A Ctrl-C during a write
stops its publication even where a library swallowed the KeyboardInterrupt (raised in a __del__ or a callback
of C code while h5py closes a file, Python can only print "Exception ignored"): the block's end raises it again
(noticed_interrupts), so the old file stays.

minibp never reads or writes a file of its own through a symbolic link, nor one that is not a regular file
(a FIFO, a folder) or that has other names (a hard link): another user who can write a shared folder could
plant one to make a trainer run as root write elsewhere. Such a file is refused (NotOwnFile, one line naming
it); a new file is made with O_EXCL, and a temporary one is written through the descriptor that made it
(/proc/self/fd/N), so a name swapped under the writer is never written through.
"""
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

# What h5py raises for a file whose structure HDF5 cannot parse: its error table maps HDF5's errors to these,
# RuntimeError where it has no closer one (NotImplementedError among them). MemoryError and KeyboardInterrupt
# are none of them, and pass.
HDF5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def stored_outside(dataset):
    """Whether an HDF5 dataset's values live in other files (external or virtual storage), which reading it would
    open: whatever file the reader may read, named by the file's writer. minibp reads no such dataset."""
    from h5py import h5d
    plist = dataset.id.get_create_plist()
    return plist.get_layout() == h5d.VIRTUAL or plist.get_external_count() > 0


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


class NotOwnFile(OSError, ValueError):
    """A symbolic link, a file of other names (a hard link) or something other than a regular file (a FIFO, a
    folder) where minibp reads or writes a file of its own: refused, never followed. Its str is one line. An
    OSError (a write that fails on it fails as writes do) and a ValueError (a bad input found before any write:
    the commands' exit status 2)."""

    def __init__(self, path, what):
        super().__init__(errno.ELOOP if what == LINK else errno.EINVAL,
                         f"{shown(path)} is {what}, where minibp keeps a file of its own: it reads and writes no file "
                         f"through a link, another name or anything but a regular file; remove it "
                         f"(rm {shown(_quoted(path))})", str(path))

    def __str__(self):
        return self.strerror


LINK = "a symbolic link"


def shown(path, most=120):
    """A path (or a name) as a message shows it: whole, or where it is longer than `most` characters, its start
    and its end with the count between (a 5000-character name would fill a screen)."""
    text = str(path)
    return text if len(text) <= most else f"{text[:most // 2]}...{text[-(most // 4):]} ({len(text)} characters)"


def _quoted(path):
    text = str(path)
    return text if all(c.isalnum() or c in "/._-+:@%" for c in text) else "'" + text.replace("'", "'\\''") + "'"


def check_own(path, *, written=False):
    """NotOwnFile unless nothing is at path or a regular file (looked at without following a link); written: to
    be written in place, of one name too."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return
    _check_status(path, status, written=written)


def _check_status(path, status, *, written):
    """written: the file is to be written in place, which a second name (a hard link) would see too."""
    if stat.S_ISLNK(status.st_mode):
        raise NotOwnFile(path, LINK)
    if not stat.S_ISREG(status.st_mode):
        raise NotOwnFile(path, "a folder" if stat.S_ISDIR(status.st_mode) else "not a regular file")
    if written and status.st_nlink > 1:
        others = status.st_nlink - 1
        raise NotOwnFile(path, f"a file with {others} other name{'s' * (others > 1)} (a hard link)")


def open_own(path, flags, *, create=False):
    """(descriptor, made) of the regular file at path opened with flags (os.O_RDONLY, os.O_RDWR, ...), never
    through a symbolic link and without waiting on a FIFO; create: a missing file is made (O_EXCL: by this
    call, made=True; its mode new_file_mode's). NotOwnFile for anything but a regular file, or for writing,
    one of other names too."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    made = False
    try:
        if create:
            try:
                fd, made = os.open(path, flags | os.O_CREAT | os.O_EXCL, new_file_mode()), True
            except FileExistsError:  # (a link is there too: O_EXCL never follows one)
                fd = os.open(path, flags)
        else:
            fd = os.open(path, flags)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # a link; a folder; a FIFO without a reader
            check_own(path)
        raise
    try:
        _check_status(path, os.fstat(fd), written=bool(flags & (os.O_WRONLY | os.O_RDWR)))
    except NotOwnFile:
        os.close(fd)
        raise
    return fd, made


def new_file_mode():
    """The mode of a file minibp makes: the umask's, never writable by others (whatever the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask & ~0o002


def descriptor_path(fd, name):
    """A path that opens the very file descriptor fd has open, whatever is at its name now (/proc/self/fd/N); the
    name itself where there is no /proc."""
    return f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(name)


def stale_temporaries(path):
    """Temporary files that interrupted writes of `path` left behind (atomic_file's naming)."""
    path = Path(path)
    return sorted(path.parent.glob(f"{path.name}.*.tmp"))


STALE_S = 60  # seconds a temporary file is left unchanged before a later write may remove it
_RANDOM = re.compile(r"[a-z0-9_]{8}")  # what tempfile.mkstemp puts between its prefix and its suffix


def remove_stale_temporaries(path):
    """Remove the temporary files that killed writes of `path` left behind, those that are minibp's own (the
    module docstring): a file of another naming, another user's, a link or a file of other names, one changed in
    the last STALE_S seconds or one a writer holds locked stays. Returns the paths removed."""
    removed = []
    for tmp in stale_temporaries(path):
        if not _RANDOM.fullmatch(tmp.name[len(Path(path).name) + 1:-len(".tmp")]):
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # a link, or gone meanwhile
            continue
        try:
            status = os.fstat(fd)
            if (not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or status.st_nlink != 1
                    or time.time() - status.st_mtime < STALE_S):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its writer is at work
                continue
            if same_file(tmp, status):  # the name still holds the file looked at
                os.unlink(tmp)
                removed.append(tmp)
        except OSError:  # (not ours to remove after all: the write goes on)
            pass
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def atomic_file(path, *, replace=True):
    """A path for the block to write that opens a new temporary file beside path (in a folder that exists), the
    very file made whatever is at its name meanwhile (descriptor_path); renamed to path when the block ends
    without error, with path's mode (a new file: the one the umask gives), removed otherwise. NotOwnFile where
    path is a link or not a regular file of one name; replace=False: FileExistsError where path is there (the
    publication itself checks it: a file that appears meanwhile is never replaced)."""
    path = Path(path)
    check_own(path)
    remove_stale_temporaries(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")  # O_EXCL, mode 0600
    made = os.fstat(fd)
    try:
        with noticed_interrupts() as interrupted:
            yield descriptor_path(fd, tmp)
            if interrupted():  # a Ctrl-C that the block's code swallowed: never published as if it were whole
                raise KeyboardInterrupt
        os.fsync(fd)  # on disk before the rename, so a crash cannot publish a hole
        try:
            mode = os.lstat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = new_file_mode()
        os.fchmod(fd, mode)  # mkstemp makes the file private
        if not same_file(tmp, made):  # another's file at the temporary name: never published as ours
            raise OSError(errno.ESTALE, "its temporary file was replaced while it was written", tmp)
        check_own(path)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)  # FileExistsError where path is there, whenever it appeared
    finally:
        if same_file(tmp, made):  # only the file made: whatever else is at its name stays
            os.unlink(tmp)
        os.close(fd)


_NOTICING = []  # the records of the noticed_interrupts blocks open (in the main thread), the outermost first


@contextlib.contextmanager
def noticed_interrupts():
    """A function that tells whether a Ctrl-C came during the block, or during a noticed_interrupts block around
    it, swallowed or not: a KeyboardInterrupt that Python could only report (sys.unraisablehook: "Exception
    ignored in ..." of a __del__ or a C callback, which is then not printed) or that SIGINT raised (where its
    handler is Python's own) and code caught. A command that wraps its work in one (prepare) has every write in it
    stop at a Ctrl-C that came before, too. In the main thread only, where Python delivers signals; elsewhere it
    tells False."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    seen, outer = [], list(_NOTICING)
    hook, handler = sys.unraisablehook, signal.getsignal(signal.SIGINT)

    def unraisable(info):
        if issubclass(info.exc_type, KeyboardInterrupt):
            for record in _NOTICING:
                record.append(info.exc_value)
        else:
            hook(info)

    def interrupt(signum, frame):
        for record in _NOTICING:
            record.append(signum)
        raise KeyboardInterrupt
    _NOTICING.append(seen)
    sys.unraisablehook = unraisable
    ours = handler is signal.default_int_handler  # (a command's own handler, the trainer's, is left as it is)
    if ours:
        signal.signal(signal.SIGINT, interrupt)
    try:
        yield lambda: bool(seen) or any(outer)
    finally:
        del _NOTICING[next(i for i, record in enumerate(_NOTICING) if record is seen)]  # (equal lists are many)
        sys.unraisablehook = hook
        if ours:
            signal.signal(signal.SIGINT, handler)


def same_file(name, status):
    """Whether the name holds the file of os.stat_result status (not following a link); False where it holds
    nothing that can be looked at."""
    try:
        now = os.lstat(name)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (status.st_dev, status.st_ino)


def write_atomic(path, data, *, replace=True):
    """Publish data (bytes-like, or text written as UTF-8) at path whole (atomic_file; replace=False: never over a
    file that is there)."""
    with atomic_file(path, replace=replace) as tmp:
        Path(tmp).write_bytes(data.encode() if isinstance(data, str) else data)
