"""Your own work end to end, as a new user does it: a data file of your own under its own name, the
augmentation you choose, a validation split that is not the test split, a best checkpoint beside the last,
and a run loaded in a new process to predict raw images (run/trained.py, predict.py, run/splits.py)."""
import json
import subprocess
import sys

import numpy as np
import pytest

import minibp
from minibp import evaluate, predict, train
from minibp.run import checkpoint
from minibp.io import data
from runs import ROOT, one_line_error, read_metrics

NET = '''
from minibp.net import Net

def build(*, input_shape, classes, width=8):
    net = Net(input_shape)
    net.conv(width, kernel=3)
    net.conv(width, kernel=3, stride=2)
    net.classifier(classes)
    return net
'''


def bars(n, rng):
    """4 classes, a bright bar at the left, right, top or bottom: a flip turns left into right."""
    labels = rng.integers(0, 4, n)
    images = rng.integers(0, 60, (n, 12, 12, 1)).astype(np.uint8)
    for image, c in zip(images, labels):
        where = [np.s_[:, :3], np.s_[:, -3:], np.s_[:3, :], np.s_[-3:, :]][c]
        image[where] += 150
    return images, labels


@pytest.fixture
def own(tmp_path):
    """(data file with a val split, model spec) in tmp_path."""
    rng = np.random.default_rng(0)
    path = data.write(tmp_path / "bars.h5", train=bars(512, rng), test=bars(128, rng), val=bars(128, rng), classes=4,
                      name="bars", class_names=["left", "right", "top", "bottom"])
    (tmp_path / "net.py").write_text(NET)
    return path, f"{tmp_path / 'net.py'}:build"


def args(tmp_path, own, *extra, out="run", iters=30):
    path, spec = own
    return ["--data-file", str(path), "--model", spec, "--iters", str(iters), "--batch", "32", "--lr-schedule",
            "cosine:0.1:warmup=5", "--val-every", "10", "--log-every", "10", "--out", str(tmp_path / out), *extra]


def test_own_data_trains_under_its_own_name_without_augmentation_and_validates_on_its_val_split(tmp_path, own,
                                                                                                capsys):
    assert train.main(args(tmp_path, own)) == 0
    out = capsys.readouterr().out
    assert "on bars (512 training images)" in out
    assert "augment none; validates on the data file's val split" in out
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")
    assert saved.config["data"] == "bars" and saved.config["augment"] == "none"
    assert saved.config["data_file"] == str(own[0])
    assert saved.data["sha256"] == data.load_split(own[0], "val").sha256 and saved.data["classes"] == 4
    assert evaluate.main([str(tmp_path / "run")]) == 0
    assert "on 128 bars images" in capsys.readouterr().out
    assert evaluate.main([str(tmp_path / "run"), "--split", "val"]) == 0
    assert "(the data file's val split)" in capsys.readouterr().out


def test_the_default_folder_is_named_after_the_data_file(tmp_path, own, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = args(tmp_path, own)
    argv = argv[:argv.index("--out")]
    assert train.main(argv) == 0
    assert (tmp_path / "runs" / "bars-net.build-4-seed0" / "checkpoint.h5").exists()


def test_augmentation_is_chosen_and_recorded(tmp_path, own, capsys):
    assert train.main(args(tmp_path, own, "--augment", "flip,crop", iters=10)) == 0
    assert "augment crop,flip;" in capsys.readouterr().out
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["augment"] == "crop,flip"
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--augment", "none"]) == 2
    assert "--augment none (the run has crop,flip)" in one_line_error(capsys.readouterr().err)
    assert train.main(args(tmp_path, own, "--augment", "mirror", out="bad")) == 2
    assert "--augment is none or a comma-separated list of resized-crop, jitter, crop, shift, flip" in \
        one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "bad").exists()


def test_a_built_in_data_set_keeps_the_papers_augmentation_and_says_it_validates_on_test(tmp_path, data_dir, capsys):
    from runs import base_args
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    out = capsys.readouterr().out
    assert "augment crop,flip; validates on the test split: the data has no val split" in out


def test_a_held_out_validation_split_is_recorded_and_kept_on_resume(tmp_path, own, capsys):
    rng = np.random.default_rng(1)
    plain = data.write(tmp_path / "plain.h5", train=bars(200, rng), test=bars(50, rng), classes=4)
    argv = args(tmp_path, (plain, own[1]), "--val-split", "0.25", iters=20)
    assert train.main(argv) == 0
    out = capsys.readouterr().out
    assert "on plain (150 training images)" in out and "validates on 0.25 of the training split (50 images)" in out
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["val_split"] == 0.25
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--val-split", "0.5"]) == 2
    assert "--val-split 0.5 (the run has 0.25)" in one_line_error(capsys.readouterr().err)
    assert evaluate.main([str(tmp_path / "run"), "--split", "val", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 50
    assert train.main(args(tmp_path, (plain, own[1]), "--val-split", "1.5", out="bad")) == 2
    assert "--val-split must be a fraction in (0, 1), got 1.5" in one_line_error(capsys.readouterr().err)


def test_the_best_checkpoint_is_the_best_validation_and_a_resume_continues_the_last(tmp_path, own):
    assert train.main(args(tmp_path, own, iters=20)) == 0
    run = tmp_path / "run"
    vals = [r for r in read_metrics(run) if r["kind"] == "val"]
    best = checkpoint.load(run / "best.h5")
    top = max(vals, key=lambda r: (r["accuracy"], -r["loss"]))  # a tie to the lower loss; max keeps the first
    assert best.iteration == top["iter"] and best.validation["accuracy"] == top["accuracy"]
    assert best.validation["split"] == "val"
    assert train.main(["--out", str(run), "--resume", "--iters", "30", "--lr-schedule", "0:0.01"]) == 0
    assert checkpoint.load(run / "checkpoint.h5").iteration == 30
    vals = [r for r in read_metrics(run) if r["kind"] == "val"]
    top = max(vals, key=lambda r: (r["accuracy"], -r["loss"]))
    assert checkpoint.load(run / "best.h5").iteration == top["iter"]


def test_a_loaded_run_predicts_raw_images_as_the_trained_net_did(tmp_path, own):
    path, spec = own
    (tmp_path / "net.py").write_text(NET)
    trained = minibp.fit(spec, data=str(path), out=tmp_path / "run", iters=20, batch=32,
                         lr_schedule="cosine:0.1:warmup=5", val_every=10)
    test = data.load_split(path, "test")
    mean = data.load_dataset(path)[0].pixel_mean()
    expected = trained.predict(test.images.astype(np.float32) * np.float32(1 / 255) - mean)
    model = minibp.load(tmp_path / "run", which="last", batch=32)
    classes, probabilities = model.predict(test.images)
    assert np.array_equal(model.net.predict(model.preprocess(test.images)), expected)  # bit for bit
    assert np.array_equal(classes, expected.argmax(axis=1))
    assert np.allclose(probabilities.sum(axis=1), 1) and model.class_names == ("left", "right", "top", "bottom")
    with pytest.raises(ValueError, match="raw images as the data file holds them, uint8"):
        model.predict(test.images / 255)  # another preprocessing: refused, never fed on
    with pytest.raises(ValueError, match=r"the run's shape, \(N, 12, 12, 1\)"):
        model.predict(np.zeros((2, 8, 8, 1), np.uint8))
    assert minibp.load(tmp_path / "run").path.name == "best.h5"


@pytest.mark.slow
def test_predict_in_a_new_process_writes_the_predictions(tmp_path, own):
    assert train.main(args(tmp_path, own, iters=20)) == 0
    images = data.load_split(own[0], "test").images[:7]
    np.save(tmp_path / "some.npy", images)
    done = subprocess.run([sys.executable, "-m", "minibp.predict", str(tmp_path / "run"), str(tmp_path / "some.npy"),
                           "--out", str(tmp_path / "p.csv")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "index,class,name,probability" and len(rows) == 8
    expected, _ = minibp.load(tmp_path / "run").predict(images)
    assert [int(r.split(",")[1]) for r in rows[1:]] == expected.tolist()


def test_predict_refuses_bad_input_in_one_line(tmp_path, own, capsys):
    assert train.main(args(tmp_path, own, iters=10)) == 0
    np.save(tmp_path / "floats.npy", np.zeros((2, 12, 12, 1), np.float32))
    capsys.readouterr()
    assert predict.main([str(tmp_path / "run"), str(tmp_path / "floats.npy")]) == 2
    assert "uint8" in one_line_error(capsys.readouterr().err)
    assert predict.main([str(tmp_path / "run"), str(own[0]), "--out", str(tmp_path / "p.txt")]) == 2
    assert "give a .csv or an .npz file" in one_line_error(capsys.readouterr().err)


def test_a_refused_overwrite_leaves_the_disk_byte_identical(tmp_path, own, capsys):
    assert train.main(args(tmp_path, own, iters=10)) == 0
    run = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    # refused after the folder is claimed: a batch larger than the data, a model that cannot be built
    for extra in (["--batch", "100000"], ["--model-arg", "width=8.5"]):
        assert train.main(args(tmp_path, own, "--overwrite", *extra, iters=10)) == 2
        one_line_error(capsys.readouterr().err)
        assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert train.main(args(tmp_path, own, "--overwrite", "--lr-schedule", "0:0.05", iters=6)) == 0  # a start
    assert checkpoint.load(run / "checkpoint.h5").iteration == 6  # that passes replaces the old run


def test_a_data_file_changed_under_a_run_is_refused_on_resume(tmp_path, own, capsys):
    assert train.main(args(tmp_path, own, iters=10)) == 0
    rng = np.random.default_rng(7)  # the same shapes and classes, other images
    data.write(own[0], train=bars(512, rng), test=bars(128, rng), val=bars(128, rng), classes=4, name="bars",
               class_names=["left", "right", "top", "bottom"])
    assert train.main(["--out", str(tmp_path / "run"), "--resume"]) == 2
    assert "is not the data" in one_line_error(capsys.readouterr().err)


def test_a_val_split_that_overrides_the_files_own_is_said_in_the_header_and_a_warning(tmp_path, own, capsys):
    assert train.main(args(tmp_path, own, "--val-split", "0.25", iters=10)) == 0
    captured = capsys.readouterr()
    assert ("validates on 0.25 of the training split (128 images), held out, instead of the data file's own val "
            "split (--val-split overrides it)") in captured.out
    assert f"warning: --val-split 0.25 validates on part of the training split, not on {own[0]}'s own val split" \
        in captured.err


def test_a_long_name_makes_a_folder_that_fits_and_messages_cut_it(tmp_path, own, monkeypatch, capsys):
    # a 5000-character data name made a default --out the file system refused, echoed whole with rc 1
    rng = np.random.default_rng(0)
    long = data.write(tmp_path / "long.h5", train=bars(64, rng), test=bars(16, rng), classes=4, name="n" * 5000)
    monkeypatch.chdir(tmp_path)
    argv = args(tmp_path, (long, own[1]), iters=6)
    assert train.main(argv[:argv.index("--out")]) == 0
    (folder,) = (tmp_path / "runs").iterdir()
    assert len(folder.name) <= 100 and (folder / "checkpoint.h5").exists()
    captured = capsys.readouterr()
    assert max(len(line) for line in (captured.out + captured.err).splitlines()) < 400
    assert train.main(args(tmp_path, own, out="o" * 5000, iters=6)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert len(line) < 400 and " characters) as a run folder (File name too long)" in line
