"""python -m minibp.evaluate on a run: its batch no larger than the split. (What it says of a run, and how it names a
damaged checkpoint or data: tests/test_console.py, test_checkpoint.py, test_runconfig.py, test_imagenet.py.)"""
import json

from minibp import evaluate, train
from runs import base_args


def test_evaluate_clamps_its_batch_to_the_split(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--batch", "100000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 64
