"""python3 -m minibp.evaluate on a run: its batch no larger than the split, and data of other channels or classes
than the run's named as such. (What it says of a run, and how it names a damaged checkpoint or data:
tests/test_console.py, test_checkpoint.py, test_config.py, test_imagenet.py.)"""
import json

import pytest

from minibp import evaluate, train
from runs import base_args, make_dataset, one_line_error


def test_evaluate_clamps_its_batch_to_the_split(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--batch", "100000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 64


@pytest.mark.parametrize("other,found", [(dict(shape=(8, 8, 1)), "holds 8x8x1 images (H x W x C) of 4 classes"),
                                         (dict(classes=5), "holds 8x8x3 images (H x W x C) of 5 classes")])
def test_evaluate_names_data_of_other_channels_or_classes_than_the_runs(tmp_path, data_dir, capsys, other, found):
    """Data with other channels or classes build another net: the data are named, not the net blamed."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = make_dataset(tmp_path / "other", **other)
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--data-dir", str(path.parent)]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert line == (f"error: the data differ from the run's: {path} {found}; {tmp_path / 'run' / 'checkpoint.h5'} "
                    "was trained on 3-channel images of 4 classes")
