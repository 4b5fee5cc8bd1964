"""A run folder: one trainer at a time, and a metrics log that holds each iteration once.

    OUT/lock            flock'd by the trainer that owns the folder; holds its pid (the OS drops the
                        lock when that process dies, however it dies; a process forked from it, by
                        the model's function say, lets go of its copy at once)
    OUT/checkpoint.h5   written atomically by checkpoint.save: the last state, which a resume continues
    OUT/best.h5         the same, of the validation with the best accuracy so far (minibp.load's default)
    OUT/metrics.jsonl   one JSON object a line, appended and flushed a record at a time, each with
                        "time", the wall-clock time it was written (Unix seconds)

    run = RunDir.claim("runs/x", fresh=True, overwrite=False)   # refuses a folder that holds a run
    run.clear_overwritten()   # overwrite=True: the old run goes only now, once every check of the start passed
    log = MetricsLog(run.metrics_path, keep_through=1200, check=run.check)  # a resumed run: drop records past 1200
    run.check()         # before each write: FolderLost if OUT/lock is no longer the file this process locked
    run.release()       # a start that wrote nothing takes back the folders and the lock it made

flock locks the lock file's inode, not the folder: a lock file deleted (or the whole folder) lets another
trainer lock a new one. So the owner checks, before every write, that OUT/lock is still the file it
locked, and stops writing when it is not; where OUT is relative and the working folder changed meanwhile (an
os.chdir of the user's code: modelspec takes a model's back), it says so.

A run folder may be shared (a lab's box, root training beside other users): every file here is opened without
following a link, the lock and the metrics, written in place, made with O_EXCL where they are new, and a link,
a FIFO or a hard link where one of them goes is refused in one line (integrity.open_own), at the start for all
of them and at each write for the one written.
"""
import contextlib
import fcntl
import json
import os
import sys
import time
import weakref
from pathlib import Path

from ..integrity import NotOwnFile, check_own, open_own, same_file, shown, stale_temporaries, write_atomic

LOCK, CHECKPOINT, BEST, METRICS = "lock", "checkpoint.h5", "best.h5", "metrics.jsonl"
HOLDER_BYTES = 1 << 16  # what is read of a lock file: a pid and a newline (anything longer is not a trainer's)


class FolderLost(Exception):
    """The run folder or its lock file was removed or replaced while this trainer held it."""


_HELD = weakref.WeakSet()  # the RunDirs whose lock this process holds


def _let_go_in_child():
    """In a process forked from a trainer (the model function's os.fork, a fork-started pool): drop its copy of
    every lock's descriptor, which would hold the flock after the trainer ended. The trainer keeps its own."""
    for run in list(_HELD):
        run._let_go()


os.register_at_fork(after_in_child=_let_go_in_child)


class RunDir:
    def __init__(self, path, lock_file, *, made_folders=(), made_lock=False, old_lock=None):
        """made_folders (deepest first) and made_lock: what claim created, for release to take back; old_lock:
        the lock file's bytes before claim wrote its pid, which a start that wrote nothing puts back."""
        self.path, self._lock_file = Path(path), lock_file
        self._made_folders, self._made_lock, self._old_lock = list(made_folders), made_lock, old_lock
        self._overwrite, self._wrote, self._forked = False, False, False
        self._working = None if self.path.is_absolute() else _working_folder()  # where a relative path is
        if lock_file is not None:
            _HELD.add(self)
        self.checkpoint_path, self.best_path, self.metrics_path = self.path / CHECKPOINT, self.path / BEST, \
            self.path / METRICS

    @classmethod
    def claim(cls, path, *, fresh, overwrite=False):
        """Lock the folder for this process. fresh: a new run, refused where a run already is unless
        overwrite (which removes its checkpoint and metrics). Stale temporary files of writers that died
        are removed: under the lock no writer of this folder is alive. A link or another file where one of
        the run's files goes is refused (ValueError)."""
        path = Path(path)
        made_folders = [p for p in (path, *path.parents) if not os.path.lexists(p)]  # deepest first
        try:
            for folder in reversed(made_folders):
                os.mkdir(folder, 0o775)  # (the umask applies too): never writable by others
            lock_fd, made_lock = open_own(path / LOCK, os.O_RDWR, create=True)
        except NotOwnFile:
            raise
        except OSError as e:
            raise ValueError(f"cannot use {shown(path)} as a run folder ({e.strerror})") from None
        lock_file = open(lock_fd, "r+b", buffering=0)
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(lock_fd, HOLDER_BYTES, 0).decode(errors="replace").strip()
            lock_file.close()
            raise ValueError(f"{shown(path)} is in use by another trainer ({_holder(holder)}); wait for it or choose "
                             "another --out") from None
        old_lock = None if made_lock else os.pread(lock_fd, HOLDER_BYTES, 0)
        run = cls(path, lock_file, made_folders=made_folders, made_lock=made_lock, old_lock=old_lock)
        try:
            os.ftruncate(lock_fd, 0)  # unbuffered: a failed write leaves nothing for close to fail on
            os.pwrite(lock_fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # a full disk at the start: nothing of a run was written yet
            run.release()
            raise OSError(e.errno, f"cannot write {shown(path / LOCK)} ({e.strerror})") from None
        try:
            for name in (CHECKPOINT, BEST, METRICS):
                check_own(path / name, written=name == METRICS)
        except NotOwnFile:
            run.release()
            raise
        for tmp in [t for own in (CHECKPOINT, BEST, METRICS) for t in stale_temporaries(path / own)]:
            tmp.unlink()
        others = sorted(p.name for p in path.iterdir() if p.name != LOCK)
        if fresh and others:
            if not overwrite:
                run.release()
                lost = [name for name in (CHECKPOINT, BEST, METRICS) if name in others]
                raise ValueError(f"{shown(path)} already holds a run ({', '.join(shown(n, 60) for n in others[:8])}"
                                 f"{', ...' if len(others) > 8 else ''}): pass --resume to continue it, another --out, "
                                 f"or --overwrite to start it again, which deletes {', '.join(lost) or 'none of it'}")
            run._overwrite = True  # removed by clear_overwritten, after the start's checks: a refused one keeps it
        return run

    def clear_overwritten(self):
        """--overwrite: remove the old run's checkpoint, best checkpoint and metrics, now that the new run's
        start has passed every check. From here on the start counts as a write (release keeps the lock)."""
        self.check()
        self._wrote = True
        if self._overwrite:
            for path in (self.checkpoint_path, self.best_path, self.metrics_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()  # (a link itself, never what it points to)
            self._overwrite = False

    def _let_go(self):
        """This process is a fork of the one that holds the lock: close its copy of the descriptor (the flock
        stays the holder's) and never write to the folder."""
        self._lock_file.close()
        self._lock_file, self._forked = None, True
        _HELD.discard(self)

    def check(self):
        """Raise FolderLost unless OUT/lock is still the file this process locked: once it was removed or
        replaced (the folder deleted, or only the lock), another trainer may hold the folder; or where this
        process is a fork of the trainer, which holds the folder alone."""
        if self._forked:
            raise FolderLost(f"this process (pid {os.getpid()}) is a fork of the trainer that holds {self.path}: it "
                             "writes nothing to it")
        if not same_file(self.path / LOCK, os.fstat(self._lock_file.fileno())):
            now = _working_folder()
            if self._working is not None and now != self._working:  # the path names another folder now
                raise FolderLost(f"the working folder changed to {shown(now or 'a folder since removed')} (from "
                                 f"{shown(self._working)}, which holds the run folder {shown(self.path)}) while this "
                                 "trainer held it: an os.chdir in your code? It stops without writing to the run "
                                 "folder")
            raise FolderLost(f"{self.path / LOCK} was removed or replaced while this trainer held it (the folder "
                             f"or its lock deleted): another trainer may use {self.path} now, so this one stops "
                             "without writing to it")

    def release(self):
        """Drop the lock; a start refused before it wrote anything also removes the lock file and the
        folders that claim made, or puts back the lock file's old bytes, leaving the disk as it found it."""
        if self._forked:  # a fork's: nothing of the folder is its to touch
            return
        _HELD.discard(self)
        try:
            self.check()
            if self._wrote:  # a run that started keeps its folder and lock
                pass
            elif self._made_lock:
                (self.path / LOCK).unlink()
                for folder in self._made_folders:
                    folder.rmdir()  # refuses a folder that is not empty
            elif self._old_lock is not None:
                os.ftruncate(self._lock_file.fileno(), 0)
                os.pwrite(self._lock_file.fileno(), self._old_lock, 0)
        except (FolderLost, OSError):  # not ours any more, or no longer empty: left as it is
            pass
        self._lock_file.close()  # closing drops the flock


def _working_folder():
    try:
        return os.getcwd()
    except OSError:  # (removed)
        return None


def _holder(text):
    """The lock's holder as a refusal names it: the pid the lock file holds, and where that process is gone,
    that a process it started holds the lock still."""
    if not text.isdigit() or len(text) > 10:
        return f"pid {text[:20] or 'unknown'}"
    try:
        os.kill(int(text), 0)
    except ProcessLookupError:
        return f"pid {text}, which has exited: a process it started holds the lock still"
    except OSError:  # another user's process: it is there
        pass
    return f"pid {text}"


class MetricsLog:
    """OUT/metrics.jsonl: a record a line, each appended by one unbuffered write, so a crash loses nothing
    written and a failed write (a full disk) leaves nothing buffered for a later write or close to fail on."""

    def __init__(self, path, *, keep_through=None, check=None):
        """keep_through: a resumed run's checkpoint iteration; the records after it are dropped (the
        resumed run writes them again), by an atomic rewrite. check: called before each write (RunDir.check)."""
        self.path, self._check = Path(path), check or (lambda: None)
        if keep_through is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("iter", 0) <= keep_through]
            self._check()
            write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self._watched = self.path != Path(os.devnull)  # (the ranks but rank 0 write there)
        self.file = open(open_own(self.path, os.O_WRONLY | os.O_APPEND, create=True)[0] if self._watched
                         else os.devnull, "ab", buffering=0)

    def write(self, **record):
        """Append a record, stamped with the wall-clock time (Unix seconds) as its field "time". An OSError
        when the file was removed or replaced since it was opened: its later records would be lost unseen."""
        self._check()
        if self._watched and not same_file(self.path, os.fstat(self.file.fileno())):
            raise OSError("removed or replaced while the run appended to it")
        line = memoryview((json.dumps(dict(record, time=round(time.time(), 3))) + "\n").encode())
        while line:  # a raw write may take part of the line
            line = line[self.file.write(line):]

    def close(self):
        self.file.close()


MAX_LINE = 1 << 20  # bytes: a metrics record is a few hundred; a longer line is damage, not a record


def read_metrics(path):
    """The records of a metrics file (numbered_records, less the line numbers)."""
    return [record for _, record in numbered_records(path)]


def numbered_records(path):
    """(line number, record) of each record of a metrics file, read a line at a time (a file of any size is
    read in bounded memory; NotOwnFile for a link, a FIFO or a device). A torn last line (a crash or a full
    disk mid-write) is dropped with a warning; damage anywhere else, or a line longer than MAX_LINE bytes, is a ValueError
    naming the file and the line."""
    path = Path(path)
    records, torn = [], None  # torn: the number of a line that did not parse, kept until a later line shows
    with open(open_own(path, os.O_RDONLY)[0], "rb") as f:  # it was not the last
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE + 1), b""), 1):
            if len(line) > MAX_LINE:
                raise ValueError(f"{path}:{number} is longer than {MAX_LINE} bytes: the metrics file is damaged")
            if not line.strip():
                continue
            if torn is not None:
                raise ValueError(f"{path}:{torn} is not a JSON record: the metrics file is damaged")
            try:
                record = json.loads(line.decode(errors="replace"))
                if not isinstance(record, dict):
                    raise ValueError("not an object")
            except ValueError:
                torn = number
                continue
            it = record.get("iter", 0)
            if not isinstance(it, int) or isinstance(it, bool) or it < 0:  # whole JSON, wrong content: not a tear
                raise ValueError(f"{path}:{number} has iter {it!r}, not an iteration number: the metrics file is "
                                 "damaged")
            records.append((number, record))
    if torn is not None:
        print(f"warning: {path}:{torn}: dropping a torn last line", file=sys.stderr)
    return records
