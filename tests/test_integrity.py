"""Files published whole (integrity.py): a rewritten file keeps its mode, a new one gets the umask's. (A write
cut short by a full disk, and the temporary files of killed writes: tests/test_folder.py.)"""
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
