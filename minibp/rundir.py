"""A run folder: one trainer at a time, and a metrics log that holds each iteration once.

    OUT/lock            flock'd by the trainer that owns the folder; holds its pid (the OS drops the
                        lock when that process dies, however it dies)
    OUT/checkpoint.h5   written atomically by checkpoint.save
    OUT/metrics.jsonl   one JSON object a line, appended and flushed a record at a time

    run = RunDir.claim("runs/x", fresh=True, overwrite=False)   # refuses a folder that holds a run
    log = MetricsLog(run.metrics_path, keep_through=1200)       # a resumed run: drop records past 1200
"""
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path

from .checkpoint import stale_temporaries

LOCK, CHECKPOINT, METRICS = "lock", "checkpoint.h5", "metrics.jsonl"


class RunDir:
    def __init__(self, path, lock_file):
        self.path, self._lock_file = Path(path), lock_file
        self.checkpoint_path, self.metrics_path = self.path / CHECKPOINT, self.path / METRICS

    @classmethod
    def claim(cls, path, *, fresh, overwrite=False):
        """Lock the folder for this process. fresh: a new run, refused where a run already is unless
        overwrite (which removes its checkpoint and metrics). Stale temporary checkpoints of writers that
        died are removed: under the lock no writer of this folder is alive."""
        path = Path(path)
        try:
            path.mkdir(parents=True, exist_ok=True)
            lock_file = open(path / LOCK, "a+")
        except OSError as e:
            raise ValueError(f"cannot use {path} as a run folder ({e.strerror})") from None
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "unknown"
            lock_file.close()
            raise ValueError(f"{path} is in use by another trainer (pid {holder}); wait for it or choose "
                             "another --out") from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(f"{os.getpid()}\n")
        lock_file.flush()
        run = cls(path, lock_file)
        for tmp in stale_temporaries(run.checkpoint_path):
            tmp.unlink()
        others = sorted(p.name for p in path.iterdir() if p.name != LOCK)
        if fresh and others:
            if not overwrite:
                run.release()
                raise ValueError(f"{path} already holds a run ({', '.join(others)}): pass --resume to continue it, "
                                 "--overwrite to start it again, or another --out")
            for name in (CHECKPOINT, METRICS):
                if (path / name).exists():
                    (path / name).unlink()
        return run

    def release(self):
        self._lock_file.close()  # closing drops the flock


class MetricsLog:
    """OUT/metrics.jsonl: appended a line at a time and flushed, so a crash loses nothing written."""

    def __init__(self, path, *, keep_through=None):
        """keep_through: a resumed run's checkpoint iteration; the records after it are dropped (the
        resumed run writes them again), by an atomic rewrite."""
        self.path = Path(path)
        if keep_through is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("iter", 0) <= keep_through]
            _atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.file = open(self.path, "a")

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


def read_metrics(path):
    """The records of a metrics file. A torn last line (a crash or a full disk mid-write) is dropped
    with a warning; damage anywhere else is a ValueError naming the file and the line."""
    path = Path(path)
    lines = path.read_text(errors="replace").split("\n")
    last = max([i for i, line in enumerate(lines, 1) if line.strip()], default=0)
    records = []
    for number, line in enumerate(lines[:last], 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not an object")
        except ValueError:
            if number == last:
                print(f"warning: {path}:{number}: dropping a torn last line", file=sys.stderr)
                break
            raise ValueError(f"{path}:{number} is not a JSON record: the metrics file is damaged") from None
        records.append(record)
    return records


def _atomic_write_text(path, text):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
