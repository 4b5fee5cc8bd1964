"""Files published whole (integrity.py): a rewritten file keeps its mode, a new one gets the umask's, never writable
by others. (A write cut short by a full disk, the temporary files of killed writes, and links where minibp's files
go: tests/run/test_folder.py.)"""
import fcntl
import os
import time

from minibp import integrity, train
from runs import base_args


def test_the_files_keep_their_modes_through_a_resume(tmp_path, data_dir):
    umask = os.umask(0o022)
    try:
        assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
        run = tmp_path / "run"
        modes = lambda: {name: (run / name).stat().st_mode & 0o777 for name in ("metrics.jsonl", "checkpoint.h5")}
        assert modes() == {"metrics.jsonl": 0o644, "checkpoint.h5": 0o644}  # new files: as the umask says
        (run / "metrics.jsonl").chmod(0o664)
        (run / "checkpoint.h5").chmod(0o600)
        assert train.main(["--out", str(run), "--resume", "--iters", "4"]) == 0  # rewrites both
        assert modes() == {"metrics.jsonl": 0o664, "checkpoint.h5": 0o600}
    finally:
        os.umask(umask)


def test_nothing_minibp_makes_in_a_run_folder_is_writable_by_others_whatever_the_umask(tmp_path, data_dir):
    # under umask 000 the run folder and its files came out world-writable: anyone could plant a link in them
    umask = os.umask(0)
    try:
        assert train.main(base_args(tmp_path, out="runs/deeper/run", iters=2, val_every=2)) == 0
        made = [tmp_path / "runs", tmp_path / "runs" / "deeper"] + sorted((tmp_path / "runs" / "deeper").rglob("*"))
        assert {p.name for p in made} >= {"run", "lock", "checkpoint.h5", "best.h5", "metrics.jsonl"}
        assert not [p for p in made if p.stat().st_mode & 0o002], [oct(p.stat().st_mode) for p in made]
    finally:
        os.umask(umask)


def test_a_stale_temporary_file_of_a_killed_write_is_removed_at_the_next_write(tmp_path):
    # A kill (SIGKILL, a power cut) mid-write leaves `<name>.<random>.tmp`, which no later write removed. The next
    # write of that name removes the ones that are minibp's own: its naming, the user's regular file, unchanged for
    # a minute and locked by no writer (HDF5 locks a file it writes)
    target = tmp_path / "model.onnx"
    old, fresh, held, linked, other = (tmp_path / f"model.onnx.{name}.tmp" for name in (
        "k1ll3d_x", "n0wmad3_", "wr1t1ng_", "l1nk3d__", "mine"))  # (other: not of minibp's naming)
    yours = tmp_path / "yours.onnx.k1ll3d_x.tmp"  # another file's
    for path in (old, fresh, held, other, yours):
        path.write_bytes(b"x" * 1000)
    linked.symlink_to(yours)
    an_hour_ago = time.time() - 3600
    for path in (old, held, other, yours):
        os.utime(path, (an_hour_ago, an_hour_ago))
    os.utime(linked, (an_hour_ago, an_hour_ago), follow_symlinks=False)
    with open(held, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # a writer at work on it, however long
        integrity.write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in (target, fresh, held, linked, other, yours))
    assert yours.read_bytes() == b"x" * 1000  # (what the link points to stays)
