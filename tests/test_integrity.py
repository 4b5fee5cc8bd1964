"""Files published whole (integrity.py): a rewritten file keeps its mode, a new one gets the umask's, never writable
by others. (A write cut short by a full disk, the temporary files of killed writes, and links where minibp's files
go: tests/test_folder.py.)"""
import os

from minibp import train
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
