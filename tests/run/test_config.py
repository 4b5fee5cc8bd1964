"""A run's configuration: the learning-rate schedules (steps, and cosine with a linear warm-up), your own net's
keyword arguments, ImageNet's defaults, and on --resume the options a run keeps, those it may change and the
fields of a configuration read back from a checkpoint."""
import argparse
import dataclasses
import json
import math
import re
import types
from pathlib import Path

import h5py
import numpy as np
import pytest

from minibp import evaluate, train
from minibp.run import checkpoint
from minibp.run.config import RunConfig, model_args
from minibp.run.options import OPTIONS, add_option, build_parser, parse_model_arg, read_command_line
from minibp.run.schedule import CosineSchedule, StepSchedule, parse_schedule
from runs import ROOT, base_args, make_dataset, one_line_error, read_metrics, set_attrs, untimed


def test_the_cosine_schedule_warms_up_linearly_then_follows_a_half_cosine():
    schedule = parse_schedule("cosine:0.1:warmup=200", iters=1000)
    assert schedule == CosineSchedule(peak=0.1, warmup=200, iters=1000)
    expected = {0: 0.1 / 200, 99: 0.1 * 100 / 200, 199: 0.1,      # (t + 1) / W of the peak: the first step moves
                200: 0.1, 400: 0.1 * (1 + math.cos(math.pi / 4)) / 2, 600: 0.05,
                999: 0.1 * (1 + math.cos(math.pi * 799 / 800)) / 2}
    for iteration, rate in expected.items():
        assert schedule.rate(iteration) == pytest.approx(rate, rel=1e-12), iteration
    rates = [schedule.rate(t) for t in range(1000)]
    assert all(a < b for a, b in zip(rates[:199], rates[1:200])) and all(a > b for a, b in zip(rates[200:], rates[201:]))
    plain = parse_schedule("cosine:0.1", iters=10)
    assert plain.rate(0) == 0.1 and plain.rate(5) == pytest.approx(0.05) and plain.warmup == 0


def test_a_diverged_run_is_advised_the_same_schedule_at_a_tenth_of_the_rate():
    assert parse_schedule("cosine:0.1:warmup=200", iters=1000).divided(10) == "cosine:0.01:warmup=200"
    assert parse_schedule("cosine:0.1", iters=1000).divided(10) == "cosine:0.01"
    steps = parse_schedule("0:0.05,400:0.1", iters=1000)
    assert steps == StepSchedule(((0, 0.05), (400, 0.1))) and steps.divided(10) == "0:0.005,400:0.01"
    assert [steps.rate(t) for t in (0, 399, 400, 999)] == [0.05, 0.05, 0.1, 0.1]


@pytest.mark.parametrize("text,match", [("cosine:fast", "cosine:PEAK"), ("cosine:0.1:warmup=ten", "cosine:PEAK"),
                                        ("cosine:0.1:cooldown=5", "cosine:PEAK"), ("cosine:-0.1", "non-negative"),
                                        ("cosine:0.1:warmup=100", "must end before the run does"),
                                        ("cosine", "ITER:LR"), ("0:0.1,5", "ITER:LR")])
def test_a_bad_schedule_names_the_syntax(text, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(text, iters=100)


def test_a_cosine_schedule_is_recorded_and_a_longer_resume_refused(tmp_path, capsys):
    make_dataset(tmp_path / "data")
    text = "cosine:0.05:warmup=2"
    assert train.main(base_args(tmp_path, iters=3, log_every=1, val_every=3, lr_schedule=text)) == 0
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["lr_schedule"] == text
    # a resume that moves the end would stretch the decay, its rate jumping back up: refused in one line
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "--iters 6 would stretch this run's cosine" in line and "Keep --iters, or give" in line
    # ... unless the rest of the run is given a schedule of its own
    rest = "0:0.001"
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6", "--lr-schedule", rest]) == 0
    logged = [r for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert [r["lr"] for r in logged] == [parse_schedule(text, iters=3).rate(t) for t in range(3)] + [0.001] * 3
    assert np.isclose(logged[1]["lr"], 0.05)


@pytest.mark.parametrize("text,pair", [("width=32", ("width", 32)), ("pool='max'", ("pool", "max")),
                                       ("widths=[16, 32]", ("widths", [16, 32])), ("dropout=None", ("dropout", None)),
                                       ("scale=-1.5e-3", ("scale", -1.5e-3)), ("deep=True", ("deep", True))])
def test_model_arguments_are_python_literals(text, pair):
    assert parse_model_arg(text) == pair


@pytest.mark.parametrize("text", ["width", "2w=3", "pool=max", "width=32 * 2", "=4"])
def test_a_model_argument_that_is_not_name_equals_literal_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_model_arg(text)


def test_model_arguments_are_recorded_as_json_would_give_them_back():
    assert model_args([("widths", (16, 32)), ("pool", "max")]) == {"widths": [16, 32], "pool": "max"}
    with pytest.raises(ValueError, match="width is given twice"):
        model_args([("width", 8), ("width", 16)])
    with pytest.raises(ValueError, match="cannot be recorded"):
        model_args({"channels": {8, 16}})
    with pytest.raises(ValueError, match="cannot be recorded"):
        model_args({"scale": float("nan")})
    # NumPy's scalars and arrays of no dimension mean what they mean in fit's own options
    assert model_args({"width": np.int64(8), "depth": np.array(3), "drop": np.float32(0.5)}) == \
        {"width": 8, "depth": 3, "drop": 0.5}
    with pytest.raises(ValueError, match="cannot be recorded"):
        model_args({"widths": np.array([16, 32])})


def test_imagenet_defaults_are_the_papers_setting():
    args = RunConfig.new(read_command_line(["--data", "imagenet", "--batch", "32"])[1])
    assert (args.model, args.batch, args.iters, args.lr_schedule, args.weight_decay, args.image_size, args.data_dir) \
        == ("resnet152", 32, 640000, "0:0.1,160000:0.01,320000:0.001,480000:0.0001", 1e-4, 224,
            str(Path("data/imagenet").resolve()))
    cifar = RunConfig.new(read_command_line([])[1])
    assert (cifar.model, cifar.batch, cifar.iters, cifar.image_size) == ("resnet164", 128, 64000, None)
    assert (args.augment, cifar.augment) == ("crop,flip", "crop,flip")


@pytest.mark.parametrize("augment", ["jitter", "resized-crop,crop,flip", "crop,shift,flip"])
def test_imagenet_refuses_in_one_line_the_transforms_its_reader_does_not_have(augment):
    with pytest.raises(ValueError, match=r"^--augment on imagenet is crop,flip \(its random crops and flips\) or "
                                         r"none$"):
        RunConfig.new(read_command_line(["--data", "imagenet", "--augment", augment])[1])


def test_resume_refuses_options_that_define_the_run(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    run = str(tmp_path / "run")
    assert train.main(["--out", run, "--resume", "--bits", "8", "--batch", "8", "--seed", "0"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "--bits 8 (the run has 4)" in line and "--batch 8 (the run has 16)" in line and "--seed" not in line


def test_resume_keeps_the_window_and_runs_from_before_it_resume_with_the_papers(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2, window="fixed")) == 0
    run = str(tmp_path / "run")
    assert train.main(["--out", run, "--resume", "--window", "range"]) == 2
    assert "--window range (the run has fixed)" in one_line_error(capsys.readouterr().err)
    # a checkpoint from before the option has no window in its config: it trained through the fixed one
    with h5py.File(tmp_path / "run" / "checkpoint.h5", "r+") as f:
        config = json.loads(f.attrs["config"])
        del config["window"]
        set_attrs(f, config=json.dumps(config))
    assert train.main(["--out", run, "--resume", "--window", "range"]) == 2
    assert "(the run has fixed)" in one_line_error(capsys.readouterr().err)
    assert train.main(["--out", run, "--resume", "--iters", "3"]) == 0
    assert "(fixed window)" in capsys.readouterr().out


def test_resume_applies_and_records_options_that_may_change(tmp_path, data_dir, monkeypatch):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    monkeypatch.chdir(moved)  # the data folder was stored absolute: resuming from anywhere works
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4", "--lr-schedule", "0:0.01",
                       "--log-every", "1"]) == 0
    records = read_metrics(tmp_path / "run")
    resume = [untimed(r) for r in records if r["kind"] == "resume"]
    assert resume == [dict(kind="resume", iter=2, changed=dict(iters=[2, 4], lr_schedule=["0:0.05", "0:0.01"],
                                                               log_every=[2, 1]))]
    assert [r["lr"] for r in records if r["kind"] == "train" and r["iter"] > 2] == [0.01, 0.01]


def test_duplicate_schedule_iterations_are_refused(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, lr_schedule="0:0.1,0:0.5")) == 2
    assert "iteration 0 more than one rate" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("edit,match", [
    (dict(batch="sixteen"), "configuration's batch is 'sixteen', not a positive integer"),
    (dict(model=None), "configuration lacks model"),
    (dict(momentum=float("nan")), "configuration's momentum is nan, not a finite non-negative number"),
    (dict(augment="mirror"), "configuration's augment is 'mirror', not none or a comma-separated list of "
                             "resized-crop, jitter, crop, shift, flip"),
    (dict(model="resnet12"), "holds a configuration that cannot run"),
])
def test_a_hand_made_config_is_checked_field_by_field(tmp_path, data_dir, capsys, edit, match):
    """The checksum rewritten too, as a hand-made checkpoint's would be: each field is still checked."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["config"])
        config.update(edit)
        set_attrs(f, config=json.dumps({k: v for k, v in config.items() if v is not None}))
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and match in line
    assert evaluate.main([str(tmp_path / "run"), "--which", "last"]) == 2
    assert match in one_line_error(capsys.readouterr().err)


def test_the_command_line_and_python_build_the_same_typed_configuration():
    """RunConfig is one value: the parser generated from its fields and fit's Python values (Option.from_python,
    as the command line reads their text) give equal configurations, holding the store and schedule made once."""
    argv = ["--data", "fashion-mnist", "--model", "resnet20", "--bits", "2", "--rounding", "stochastic",
            "--iters", "300", "--lr-schedule", "cosine:0.1:warmup=20", "--momentum", "0.8", "--sub-batches", "2",
            "--augment", "flip,crop", "--out", "runs/x", "--overwrite"]
    invocation, given = read_command_line(argv)
    assert (invocation.out, invocation.overwrite, invocation.resume) == ("runs/x", True, False)
    assert "out" not in given and "momentum" in given and "batch" not in given  # what was given, no defaults
    python = dict(data="fashion-mnist", model="resnet20", bits=2, rounding="stochastic", iters="300",
                  lr_schedule="cosine:0.1:warmup=20", momentum=0.8, sub_batches=2, augment="flip,crop")
    from_python = {k: OPTIONS[k].from_python(k, v) for k, v in python.items()}
    config = RunConfig.new(given, ranks=2)
    assert config == RunConfig.new(from_python, ranks=2)
    assert (config.sub_batches, config.sub_batch, config.augment) == (4, 32, "crop,flip")  # counted over 2 ranks
    assert str(config.store) == "bits 2 (block window, stochastic rounding)"
    assert config.schedule == CosineSchedule(peak=0.1, warmup=20, iters=300)
    assert config.folder() == Path("runs/fashion-mnist-resnet20-2-stochastic-seed0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.bits = "4"


def test_every_option_is_declared_once_with_a_kind_a_check_and_its_help():
    parser_flags = {a.dest: a.option_strings for a in build_parser()._actions
                    if a.dest != "help" and not a.dest.startswith("old_")}  # (old spellings: RENAMED)
    assert set(parser_flags) == set(OPTIONS)
    for name, opt in OPTIONS.items():
        assert opt.help and opt.kind in ("defining", "changeable", "invocation"), name
        assert opt.check is not None or opt.type is bool, name  # a saved or Python value is checked
    saved = [f.name for f in dataclasses.fields(RunConfig) if "option" in f.metadata]
    assert list(RunConfig().as_dict()) == saved  # what a checkpoint holds: the run's options and no others


def test_a_saved_configuration_loads_back_through_the_type_and_an_unknown_field_is_refused(tmp_path):
    config = RunConfig.new(dict(data="fashion-mnist", model="resnet20", bits="8", window="range", iters=50,
                                lr_schedule="cosine:0.05:warmup=5", clip_norm=1.0))
    saved = types.SimpleNamespace(config=json.loads(json.dumps(config.as_dict())), path=tmp_path / "c.h5")
    assert RunConfig.from_checkpoint(saved) == config
    saved.config["dropout"] = 0.5  # a later minibp's option: refused, not dropped from the resumed run
    with pytest.raises(ValueError, match="of a later minibp: its configuration has dropout"):
        RunConfig.from_checkpoint(saved)


@pytest.mark.parametrize("name,value,error,match", [
    ("graph", 1, TypeError, "graph is True or False, got 1"),
    ("iters", True, TypeError, "iters takes --iters's value, not True"),
    ("iters", "ten", ValueError, "--iters: invalid int value: 'ten'"),
    ("window", "wide", ValueError, "invalid choice: 'wide'"),
])
def test_a_python_value_is_read_as_the_command_line_reads_its_text(name, value, error, match):
    with pytest.raises(error, match=match):
        OPTIONS[name].from_python(name, value)
    assert OPTIONS["momentum"].from_python("momentum", 1) == 1.0 and OPTIONS["bits"].from_python("bits", 4) == "4"


def test_graph_is_forced_on_forced_off_or_left_to_the_device():
    """--graph and --no-graph force the CUDA graph or eager steps; neither leaves the choice to the device (None),
    as fit(graph=None) does; a run saved before the option ran eagerly."""
    assert [read_command_line(argv)[1].get("graph", "absent") for argv in ([], ["--graph"], ["--no-graph"])] == \
        ["absent", True, False]
    assert RunConfig.new({}).graph is None
    assert RunConfig.new({"graph": OPTIONS["graph"].from_python("graph", False)}).graph is False
    assert OPTIONS["graph"].before is False


def test_a_resume_may_force_the_graph_off_and_the_change_is_recorded(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4", "--no-graph"]) == 0
    resume = [untimed(r) for r in read_metrics(tmp_path / "run") if r["kind"] == "resume"]
    assert resume == [dict(kind="resume", iter=2, changed=dict(iters=[2, 4], graph=[None, False]))]


def test_the_old_spelling_of_sub_batches_still_works_for_a_release_with_a_notice(tmp_path, data_dir, capsys):
    """--split meant the sub-batches of a step before it was named --sub-batches (evaluate's and predict's
    --split is a data split): the old flag, fit's old keyword and a checkpoint saved under the old name all
    still work, the first two with a one-line notice."""
    _, given = read_command_line(["--split", "2"])
    assert given == dict(sub_batches=2)
    assert capsys.readouterr().err == "note: --split is now --sub-batches; --split goes in a later release\n"
    with pytest.warns(DeprecationWarning, match="split is now sub_batches"):
        train.fit("resnet11", data="cifar10", data_dir=str(data_dir), out=tmp_path / "run", batch=16, split=2,
                   iters=2, lr_schedule="0:0.05", val_every=2)
    path = tmp_path / "run" / "checkpoint.h5"
    assert checkpoint.load(path).config["sub_batches"] == 2
    with h5py.File(path, "r+") as f:  # as a run from before the rename saved it
        config = json.loads(f.attrs["config"])
        config["split"] = config.pop("sub_batches")
        set_attrs(f, config=json.dumps(config))
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3", "--lr-schedule", "0:0.05"]) == 0
    assert "(2 x 8)" in capsys.readouterr().out


def test_the_old_and_new_spelling_of_sub_batches_together_are_refused(tmp_path, data_dir, capsys):
    """--split 2 --sub-batches 3 ran with one of them and never said so."""
    for argv in (["--split", "2", "--sub-batches", "3"], ["--sub-batches=3", "--split=2"]):
        with pytest.raises(ValueError, match="--split is --sub-batches's old name: give --sub-batches alone"):
            read_command_line(argv)
    assert train.main(base_args(tmp_path, split=2, sub_batches=4)) == 2
    assert "--split is --sub-batches's old name" in capsys.readouterr().err
    with pytest.raises(TypeError, match="split is sub_batches' old name"):
        train.fit("resnet11", data="cifar10", data_dir=str(data_dir), out=tmp_path / "fit", split=2, sub_batches=2)
    assert not (tmp_path / "run").exists() and not (tmp_path / "fit").exists()


def test_docs_training_md_lists_every_option_fit_takes():
    """fit's options are documented in one table of docs/training.md, which may not miss one."""
    text = (ROOT / "docs" / "training.md").read_text()
    table = text.split("## `fit`'s options", 1)[1].split("\n## ", 1)[0]
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    own = {"data", "data_file", "out", "resume", "overwrite", "model"}  # fit's own arguments
    assert listed == set(OPTIONS) - own


NUMPY_INTEGERS = (np.int64, np.int32, np.uint8)


@pytest.mark.parametrize("name", [n for n, o in OPTIONS.items() if o.type in (int, float, bool) or n == "bits"])
def test_fit_takes_numpy_scalars_for_every_option_as_their_python_values(name):
    # fit(batch=np.int64(16)) said "--batch must be a positive integer, got np.int64(16)"; momentum=np.float64 passed
    kind = OPTIONS[name].type
    pairs = ([(t(4), "4") for t in NUMPY_INTEGERS] if name == "bits" else
             [(np.bool_(True), True), (np.bool_(False), False)] if kind is bool else
             [(t(3), 3) for t in NUMPY_INTEGERS] if kind is int else
             [(np.float64(0.5), 0.5), (np.float32(0.25), 0.25), (np.int64(2), 2.0)])
    for given, meant in pairs:
        value = OPTIONS[name].from_python(name, given)
        assert value == meant and type(value) is type(meant), (given, value)
    bad = np.float64(2.5) if kind in (int, bool) or name == "bits" else np.str_("x")
    try:  # what the command line would refuse, NumPy's or not: here, or by the option's check
        value = OPTIONS[name].from_python(name, bad)
    except (TypeError, ValueError):
        return
    assert not OPTIONS[name].check(value)


def test_fit_trains_with_numpy_scalars_and_records_plain_values(tmp_path, data_dir):
    net = train.fit("resnet11", data="cifar10", data_dir=str(data_dir), out=tmp_path / "run", batch=np.int64(16),
                    iters=np.int32(2), seed=np.int64(1), momentum=np.float64(0.8), val_every=np.int64(2),
                    weight_decay=np.float32(0.0), graph=np.bool_(False), resume=np.bool_(False))
    config = checkpoint.load(tmp_path / "run" / "checkpoint.h5").config
    assert (config["batch"], config["iters"], config["seed"], config["momentum"]) == (16, 2, 1, 0.8) and net.classes == 4
    assert model_args(dict(width=np.int64(16), scale=np.float64(0.5), pool=np.str_("max"), flags=[np.bool_(True)])) \
        == dict(width=16, scale=0.5, pool="max", flags=[True])


@pytest.mark.parametrize("where", ["new", "command line", "fit", "resume"])
def test_momentum_with_adamw_is_refused_not_ignored(tmp_path, data_dir, capsys, where):
    # --momentum was ignored in silence under --optimizer adamw, yet a resume that changed it was refused
    message = r"--momentum is SGD's: --optimizer adamw has none \(its betas are 0.9, 0.999\); leave --momentum out"
    if where == "new":
        with pytest.raises(ValueError, match=message):
            RunConfig.new(dict(optimizer="adamw", momentum=0.9))
        assert RunConfig.new(dict(optimizer="sgd", momentum=0.5)).momentum == 0.5
        return
    if where == "fit":
        with pytest.raises(ValueError, match=message):
            train.fit("resnet11", data="cifar10", data_dir=str(data_dir), out=tmp_path / "run", optimizer="adamw",
                      momentum=np.float64(0.5), batch=16, iters=2, val_every=2)
        assert not (tmp_path / "run").exists()
        return
    if where == "resume":
        assert train.main(base_args(tmp_path, iters=2, val_every=2, optimizer="adamw", lr_schedule="0:0.001")) == 0
        argv = ["--out", str(tmp_path / "run"), "--resume", "--iters", "4", "--momentum", "0.5"]
    else:
        argv = base_args(tmp_path, iters=2, optimizer="adamw", momentum=0.5)
    capsys.readouterr()
    assert train.main(argv) == 2
    assert re.search(message, one_line_error(capsys.readouterr().err))
    assert where == "resume" or not (tmp_path / "run").exists()


def test_workers_apply_to_imagenet_alone(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, workers=2)) == 2
    assert "--workers applies to --data imagenet only" in one_line_error(capsys.readouterr().err)


def test_data_dir_beside_data_file_is_refused_not_ignored(tmp_path, data_dir, capsys):
    path = data_dir / "cifar10.h5"
    argv = base_args(tmp_path, iters=2, val_every=2)
    argv[argv.index("--data"):argv.index("--data") + 2] = ["--data-file", str(path)]
    assert train.main(argv) == 2  # (base_args gives --data-dir)
    assert "--data-dir is where --data's file is; --data-file names its file itself: give one" in \
        one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
    argv = [a for i, a in enumerate(argv) if "--data-dir" not in argv[max(i - 1, 0):i + 1]]
    assert train.main(argv) == 0
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3", "--data-dir", str(tmp_path)]) == 2
    assert "trains on a --data-file: give a moved file as --data-file" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("value, text", [(["crop"], "crop"), (("crop", "flip"), "crop,flip"), (["flip", "crop"], "crop,flip"),
                                         ([], "none"), (np.array(["flip"]), "flip")])
def test_fit_takes_augment_as_a_list_of_transforms(value, text):
    # fit(augment=['crop']) was refused as "must be none or a list of crop, flip ..., got ['crop']"
    given = {"augment": OPTIONS["augment"].from_python("augment", value)}
    assert RunConfig.new(given).augment == text


@pytest.mark.parametrize("value, error, match", [
    (["mirror"], ValueError, "got 'mirror'"),
    ([1], TypeError, r"a list of transforms \(resized-crop, jitter, crop, shift, flip\), got \[1\]")])
def test_fit_refuses_a_list_of_what_is_not_a_transform_in_its_own_words(value, error, match):
    with pytest.raises(error, match=match):
        RunConfig.new({"augment": OPTIONS["augment"].from_python("augment", value)})


def test_fit_takes_a_numpy_array_of_no_dimension_as_its_value():
    assert OPTIONS["batch"].from_python("batch", np.array(16)) == 16
    assert OPTIONS["momentum"].from_python("momentum", np.array(0.5, np.float32)) == 0.5
    assert OPTIONS["augment"].from_python("augment", np.array("crop")) == "crop"


@pytest.mark.parametrize("bits", ["exact", "naive"])
def test_a_window_for_a_store_without_one_is_refused_not_ignored(bits):
    with pytest.raises(ValueError, match=f"--window chooses a k-bit store's window: --bits {bits} codes through none "
                                         "of its choosing"):
        RunConfig.new(dict(bits=bits, window="range"))
    assert RunConfig.new(dict(bits="4", window="range")).window == "range"


def test_another_command_may_give_a_switch_its_own_help():
    """add_option(parser, "overwrite", help=...) gave argparse help twice (a TypeError): lr_find worked around it."""
    parser = argparse.ArgumentParser()
    add_option(parser, "overwrite", help="replace --plot's file")
    assert parser.parse_args(["--overwrite"]).overwrite is True
    assert "replace --plot's file" in parser.format_help()
