"""python3 -m minibp.evaluate on a run: its batch no larger than the split, data of other channels or classes
than the run's named as such, best.h5 by default (said), each class's recall (its accuracy), precision and F1,
their macro means, the confusion matrix, and the top-k accuracy (top-5 from 10 classes on). (What it says of a
run, and how it names a damaged checkpoint or data: tests/test_console.py, run/test_checkpoint.py, run/test_config.py,
io/test_imagenet.py.)"""
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
    at = next(i for i, line in enumerate(out) if line.startswith("per class: recall (the class's accuracy)"))
    assert out[at + 1].split() == ["recall", "precision", "F1", "images"]
    rows = [line.split() for line in out[at + 2:at + 6]]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert [int(row[4]) for row in rows] == confusion.sum(1).tolist()
    shown = lambda values: ["-" if v is None else f"{v:.4f}" for v in values]  # noqa: E731
    columns = [shown(result[k]) for k in ("recall", "precision", "f1")]
    assert [row[1:4] for row in rows] == [list(r) for r in zip(*columns)]
    assert out[at + 6].split() == ["macro"] + shown(result["macro"][k] for k in ("recall", "precision", "f1"))
    at = out.index("confusion matrix (rows: the true class, columns: the predicted one):")
    assert [list(map(int, line.split()[1:])) for line in out[at + 2:at + 6]] == result["confusion"]


def test_per_class_precision_recall_and_f1_are_the_confusion_matrix_s_and_written_to_a_csv(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    run, table = tmp_path / "run", tmp_path / "classes.csv"
    capsys.readouterr()
    assert evaluate.main([str(run), "--json", "--metrics", str(table)]) == 0
    result = json.loads(capsys.readouterr().out)
    confusion = np.array(result["confusion"])
    hits, predicted, images = np.diag(confusion), confusion.sum(0), confusion.sum(1)
    assert result["precision"] == [h / p if p else None for h, p in zip(hits, predicted)]  # null: never predicted
    assert result["recall"] == result["per_class"] == [h / n if n else None for h, n in zip(hits, images)]
    assert result["images_per_class"] == images.tolist()
    for k in ("precision", "recall", "f1"):
        values = [v for v in result[k] if v is not None]
        assert result["macro"][k] == pytest.approx(np.mean(values)) and result["macro_classes"][k] == len(values)
    rows = [row.split(",") for row in table.read_text().splitlines()]
    assert rows[0] == ["class", "precision", "recall", "f1", "images"]
    assert [r[0] for r in rows[1:]] == list("0123") + ["macro"]
    cell = lambda v: "" if v is None else repr(v)  # noqa: E731  (an undefined figure: an empty cell)
    assert rows[1:5] == [[c, cell(p), cell(r), cell(f), str(n)] for c, p, r, f, n in
                         zip("0123", result["precision"], result["recall"], result["f1"], images)]
    assert rows[5] == ["macro"] + [cell(result["macro"][k]) for k in ("precision", "recall", "f1")] + ["64"]


def test_top_k_is_off_below_ten_classes_top_5_from_ten_on_and_any_k_below_the_classes(tmp_path, capsys):
    make_dataset(tmp_path / "four"), make_dataset(tmp_path / "twelve", classes=12)
    for data, out in (("four", "run4"), ("twelve", "run12")):
        assert train.main(base_args(tmp_path, out=out, data_dir=str(tmp_path / data), iters=2, val_every=2)) == 0
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run4"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["top_k"] is None and result["top_k_accuracy"] is None
    assert evaluate.main([str(tmp_path / "run12"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["top_k"] == 5 and result["accuracy"] <= result["top_k_accuracy"] <= 1
    assert evaluate.main([str(tmp_path / "run4"), "--top-k", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["top_k"] == 1 and result["top_k_accuracy"] == result["accuracy"]
    assert evaluate.main([str(tmp_path / "run4"), "--top-k", "3"]) == 0
    assert ", top-3 " in capsys.readouterr().out.splitlines()[0]
    for k, why in (("4", "--top-k must be below the data's 4 classes (top-4 is every image), got 4"),
                   ("0", "--top-k must be a positive integer, got 0")):
        assert evaluate.main([str(tmp_path / "run4"), "--top-k", k]) == 2
        assert one_line_error(capsys.readouterr().err) == f"error: {why}"


def test_a_confusion_file_that_is_not_csv_is_refused_before_any_work(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    capsys.readouterr()
    for option in ("--confusion", "--metrics"):
        assert evaluate.main([str(tmp_path / "run"), option, str(tmp_path / "m.txt")]) == 2
        assert one_line_error(capsys.readouterr().err) == f"error: {option} {tmp_path / 'm.txt'}: give a .csv file"
        assert not (tmp_path / "m.txt").exists()
