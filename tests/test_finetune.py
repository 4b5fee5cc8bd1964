"""Fine-tuning (--init-from RUN, fit(init_from=...)): a new run starts from another run's weights, on other data;
the arrays whose names and shapes match are taken, a classifier of another class count starts fresh, the header
and the checkpoint say where the run started from and what is fresh, and the run is one like any other: it
resumes bit for bit, and minibp.load and predict take it."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import minibp
from minibp import models, predict, train
from minibp.optim import SGD
from minibp.run import checkpoint, startup
from runs import ROOT, base_args, make_dataset, one_line_error


@pytest.fixture
def source(tmp_path, data_dir):
    """A resnet11 run on 4 classes, and a data file of 5 classes (other images) beside it."""
    assert train.main(base_args(tmp_path, out="source", iters=4, val_every=2)) == 0
    make_dataset(tmp_path / "five", classes=5, seed=1)
    return tmp_path / "source"


def tuned_args(tmp_path, out="tuned", **overrides):
    """The fine-tuned run's options: no --model (it comes from the source run), the 5-class data."""
    argv = base_args(tmp_path, out=out, data_dir=str(tmp_path / "five"), init_from=str(tmp_path / "source"),
                     **overrides)
    at = argv.index("--model")
    return argv[:at] + argv[at + 2:]


def test_a_run_starts_from_the_arrays_that_fit_and_a_new_classifier_starts_fresh(source, tmp_path, capsys):
    capsys.readouterr()
    assert train.main(tuned_args(tmp_path)) == 0
    out = capsys.readouterr().out
    best = source / "best.h5"
    assert out.startswith("resnet11 (11 units")  # the source run's model, not the default's
    assert (f"started from {best} (iteration {checkpoint.load(best).iteration}): took 40 arrays (parameters and "
            "running statistics); fresh: unit10.w (5, 1, 1, 256), the run's (4, 1, 1, 256); unit10.bias (5,), the "
            "run's (4,)") in out
    saved = checkpoint.load(tmp_path / "tuned" / "checkpoint.h5")
    assert saved.config["init_from"] == str(source)
    assert saved.started_from == dict(checkpoint=str(best), iteration=checkpoint.load(best).iteration, taken=40,
                                      fresh=["unit10.w", "unit10.bias"])
    assert minibp.load(tmp_path / "tuned").net.classes == 5  # a run like any other
    images = np.random.default_rng(0).integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    assert predict.main([str(tmp_path / "tuned"), str(tmp_path / "images.npy")]) == 0
    assert "3 images; predicted" in capsys.readouterr().out


def test_the_weights_taken_are_the_runs_and_the_rest_keeps_its_initialisation(source, tmp_path):
    net = models.by_name("resnet11", input_shape=(8, 8, 3), classes=5).compile(pass_images=4, bits="4", seed=3)
    SGD(net, momentum=0.9)
    fresh = net.state()
    started_from, why = startup.take_weights(net, source / "checkpoint.h5")
    theirs, now = checkpoint.load(source / "checkpoint.h5").state, net.state()
    assert started_from["fresh"] == ["unit10.w", "unit10.bias"] and set(why) == set(started_from["fresh"])
    for name, array in now.items():
        if name.startswith(("params/", "running/")) and name.removeprefix("params/") not in started_from["fresh"]:
            assert np.array_equal(array, theirs[name]), name
        else:  # the new classifier, and the optimizer's state: as compiled
            assert np.array_equal(array, fresh[name]), name


def test_a_fine_tuned_run_resumes_bit_for_bit_and_keeps_where_it_started(source, tmp_path):
    assert train.main(tuned_args(tmp_path, out="whole", iters=4)) == 0
    assert train.main(tuned_args(tmp_path, out="parts", iters=2)) == 0
    assert train.main(["--out", str(tmp_path / "parts"), "--resume", "--iters", "4"]) == 0
    whole, parts = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("whole", "parts"))
    assert all(np.array_equal(whole.state[k], parts.state[k]) for k in whole.state)
    assert parts.started_from == whole.started_from is not None


def test_fit_takes_init_from_too(source, tmp_path):
    net = minibp.fit(data=str(tmp_path / "five" / "cifar10.h5"), out=tmp_path / "fit", init_from=str(source),
                     batch=16, iters=2, lr_schedule="0:0.05", val_every=2)
    assert net.classes == 5
    assert checkpoint.load(tmp_path / "fit" / "checkpoint.h5").started_from["fresh"] == ["unit10.w", "unit10.bias"]


def test_a_run_to_start_from_that_is_missing_or_fits_nothing_is_refused_in_one_line(source, tmp_path, capsys):
    missing = tmp_path / "nothing"
    assert train.main(tuned_args(tmp_path) + ["--init-from", str(missing)]) == 2
    assert one_line_error(capsys.readouterr().err) == f"error: --init-from: no run folder or checkpoint at {missing}"
    own = ["--model", f"{ROOT / 'docs' / 'vgg_example.py'}:build", "--model-arg", "width=12", "--model-arg",
           "stages=1"]  # channels 12 where resnet11's are 16, 32, 64 ...
    assert train.main(tuned_args(tmp_path) + own) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"--init-from {source}: {source / 'best.h5'} holds no parameter of this net's names and shapes" in line
    assert not (tmp_path / "tuned").exists()


def test_ctrl_c_on_a_fine_tuned_run_with_patience_loses_nothing(source, tmp_path):
    """SIGINT mid-run: a checkpoint is saved (exit 130); the resume keeps --init-from's record and the patience,
    and ends with the weights of a run never interrupted."""
    argv = tuned_args(tmp_path, out="cut", iters=100000, log_every=1, val_every=100000, checkpoint_every=100000,
                      patience=1000)
    process = subprocess.Popen([sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    metrics, deadline = tmp_path / "cut" / "metrics.jsonl", time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    stopped = checkpoint.load(tmp_path / "cut" / "checkpoint.h5")
    end = stopped.iteration + 2
    assert train.main(["--out", str(tmp_path / "cut"), "--resume", "--iters", str(end)]) == 0
    assert train.main(tuned_args(tmp_path, out="whole", iters=end, log_every=1, val_every=100000,
                                 checkpoint_every=100000, patience=1000)) == 0
    cut, whole = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("cut", "whole"))
    assert cut.iteration == whole.iteration == end and cut.config["patience"] == 1000
    assert cut.started_from == whole.started_from == stopped.started_from
    assert all(np.array_equal(cut.state[k], whole.state[k]) for k in whole.state)


def test_frozen_units_stay_as_loaded_while_the_rest_trains(source, tmp_path, capsys):
    """--freeze all-but-classifier: every unit but the new classifier keeps the source's parameters bit for bit
    (momentum and weight decay included), the classifier trains, the header says so, and a resume keeps it."""
    capsys.readouterr()
    assert train.main(tuned_args(tmp_path, freeze="all-but-classifier", momentum=0.9)) == 0
    assert "frozen: units 0-9 (10 of 11)" in capsys.readouterr().out
    theirs = checkpoint.load(source / "best.h5").state
    tuned = checkpoint.load(tmp_path / "tuned" / "checkpoint.h5")
    assert tuned.config["freeze"] == "all-but-classifier"
    for name, array in tuned.state.items():
        if "/unit10." in name:  # the classifier (its batch norm's gamma and beta too), which trains
            continue
        if name.startswith("params/"):
            assert np.array_equal(array, theirs[name]), name
        elif name.startswith("momentum/"):
            assert not array.any(), name
    fresh = models.by_name("resnet11", input_shape=(8, 8, 3), classes=5).compile(pass_images=4, bits="4", seed=0)
    assert not np.array_equal(tuned.state["params/unit10.w"], fresh.state()["params/unit10.w"])
    assert train.main(["--out", str(tmp_path / "tuned"), "--resume", "--freeze", "0-3"]) == 2
    assert "--freeze 0-3 (the run has all-but-classifier)" in one_line_error(capsys.readouterr().err)


def test_class_weights_from_a_file_are_recorded_and_bad_tuning_options_refused(source, tmp_path, capsys):
    weights = tmp_path / "weights.txt"
    weights.write_text("1\n2\n0.5\n1\n1\n")
    assert train.main(tuned_args(tmp_path, class_weights=str(weights), label_smoothing=0.1)) == 0
    out = capsys.readouterr().out
    assert "loss: label smoothing 0.1, class weights 1.0,2.0,0.5,1.0,1.0" in out
    weights.unlink()  # the run stands without its file: the numbers are recorded
    config = checkpoint.load(tmp_path / "tuned" / "checkpoint.h5").config
    assert config["class_weights"] == "1.0,2.0,0.5,1.0,1.0" and config["label_smoothing"] == 0.1
    assert train.main(["--out", str(tmp_path / "tuned"), "--resume", "--iters", "8"]) == 0
    for options, message in [(dict(freeze="0-99"), "--freeze 0-99: the net has 11 units (0-10), not unit 11"),
                             (dict(freeze="0-10"), "--freeze 0-10 freezes every unit of the net: nothing would train"),
                             (dict(freeze="3-1"), "--freeze must be unit indices and ranges such as 0-15,18"),
                             (dict(class_weights="1,2"), "--class-weights gives 2 weights; the data has 5 classes"),
                             (dict(class_weights=str(weights)), "neither balanced, a list of numbers"),
                             (dict(label_smoothing=1), r"--label-smoothing must be a number in [0, 1)")]:
        assert train.main(tuned_args(tmp_path, out="refused", **options)) == 2
        assert message in one_line_error(capsys.readouterr().err)
        assert not (tmp_path / "refused" / "checkpoint.h5").exists()


def test_balanced_class_weights_give_each_class_an_equal_share():
    from minibp.run.tuning import class_weights, frozen_units
    labels = np.array([0, 0, 0, 1, 2, 2])
    weights = class_weights("balanced", labels, classes=4)
    assert weights.tolist() == [6 / 9, 6 / 3, 6 / 6, 0.0]  # N / (K n_c); a class without images weighs 0
    assert np.bincount(labels, weights=weights[labels], minlength=4)[:3].tolist() == [2.0, 2.0, 2.0]
    assert frozen_units("0-2, 5,2", units=8, classifier=7) == (0, 1, 2, 5)
    assert frozen_units("all-but-classifier", units=4, classifier=3) == (0, 1, 2)
