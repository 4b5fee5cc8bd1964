"""python3 -m minibp.evaluate on a run: its batch no larger than the split, data of other channels or classes
than the run's named as such, best.h5 by default (said), and each class's accuracy and the confusion matrix. (What it says of a run, and how it names a damaged checkpoint or data:
tests/test_console.py, test_checkpoint.py, test_config.py, test_imagenet.py.)"""
import json

import numpy as np
import pytest

from minibp import evaluate, train
from minibp.run import checkpoint
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
    assert line == (f"error: the data differ from the run's: {path} {found}; {tmp_path / 'run' / 'best.h5'} "
                    "was trained on 3-channel images of 4 classes")


def test_evaluate_scores_best_h5_by_default_as_load_and_predict_do_and_says_which(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=4, val_every=2, checkpoint_every=2)) == 0
    run = tmp_path / "run"
    capsys.readouterr()
    assert evaluate.main([str(run)]) == 0
    out = capsys.readouterr().out
    best = checkpoint.load(run / "best.h5").iteration
    assert out.startswith(f"{run / 'best.h5'} (the run's best validation, iteration {best}): resnet11")
    assert "note: this run chose best.h5 on the test split, so its test accuracy is not a fair estimate" in out
    assert evaluate.main([str(run), "--which", "last"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{run / 'checkpoint.h5'} (the last checkpoint, iteration 4): resnet11") and "note" not in out


def test_per_class_accuracy_and_the_confusion_matrix_are_printed_and_written(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    run, table = tmp_path / "run", tmp_path / "confusion.csv"
    capsys.readouterr()
    assert evaluate.main([str(run), "--per-class", "--json", "--confusion", str(table)]) == 0
    result = json.loads(capsys.readouterr().out)
    confusion = np.array(result["confusion"])  # (4, 4): rows the true class
    assert confusion.shape == (4, 4) and confusion.sum() == result["images"] == 64
    assert result["per_class"] == pytest.approx([confusion[c, c] / confusion[c].sum() for c in range(4)])
    assert np.trace(confusion) / 64 == pytest.approx(result["accuracy"])
    rows = table.read_text().splitlines()
    assert rows[0] == "true \\ predicted,0,1,2,3"
    assert [list(map(int, row.split(",")[1:])) for row in rows[1:]] == result["confusion"]
    assert evaluate.main([str(run), "--per-class"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("per class: accuracy (images)")
    assert [line.split()[0] for line in out[at + 1:at + 5]] == ["0", "1", "2", "3"]
    assert out[at + 5] == "confusion matrix (rows: the true class, columns: the predicted one):"
    assert [list(map(int, line.split()[1:])) for line in out[at + 7:at + 11]] == result["confusion"]


def test_a_confusion_file_that_is_not_csv_is_refused_before_any_work(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--confusion", str(tmp_path / "m.txt")]) == 2
    assert one_line_error(capsys.readouterr().err) == f"error: --confusion {tmp_path / 'm.txt'}: give a .csv file"
    assert not (tmp_path / "m.txt").exists()
