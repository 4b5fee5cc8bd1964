"""Your own net under the trainer's guarantees: --model FILE.py:FUNCTION or package.module:FUNCTION with
--model-arg, the Python entry point minibp.fit, and the checks that a resume and an evaluation build
the run's net again."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minibp
from minibp import evaluate, export, predict, train
from minibp.run import checkpoint, modelspec
from runs import ROOT, base_args, one_line_error, read_metrics

VGG = str(ROOT / "docs" / "vgg_example.py")


def same_weights(a, b):
    a, b = (checkpoint.load(p) for p in (a, b))
    return a.state.keys() == b.state.keys() and all(np.array_equal(a.state[n], b.state[n]) for n in a.state)


def write_model(folder, body, name="mynet.py"):
    """A model file of your own in folder; its path."""
    path = folder / name
    path.write_text("from minibp.net import Net\n\n" + textwrap.dedent(body))
    return path


def test_the_vgg_example_trains_resumes_and_evaluates_through_the_command_line(tmp_path, data_dir, monkeypatch,
                                                                                capsys):
    own = dict(model=f"{VGG}:build", model_arg="width=8", lr_schedule="0:0.05", val_every=2, checkpoint_every=2)
    assert train.main(base_args(tmp_path, out="straight", iters=4, **own)) == 0
    assert train.main(base_args(tmp_path, out="resumed", iters=2, **own)) == 0
    saved = checkpoint.load(tmp_path / "resumed" / "checkpoint.h5")
    assert saved.config["model"] == f"{VGG}:build" and saved.config["model_args"] == {"width": 8}
    assert any(name.endswith(".w") and array.shape == (32, 3, 3, 16) for name, array in saved.state.items())
    monkeypatch.chdir(tmp_path)  # the file was recorded by its absolute path: the run resumes from anywhere
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--iters", "4"]) == 0
    assert same_weights(tmp_path / "straight" / "checkpoint.h5", tmp_path / "resumed" / "checkpoint.h5")
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "resumed"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    last_validation = [r for r in read_metrics(tmp_path / "resumed") if r["kind"] == "val"][-1]
    assert result["iteration"] == 4 and result["accuracy"] == last_validation["accuracy"]
    assert result["model_args"] == {"width": 8}


def test_a_function_of_an_installed_module_is_a_model_with_its_arguments(tmp_path, data_dir, capsys):
    """package.module:FUNCTION: here the ResNet builder itself, given its depth as a keyword argument."""
    argv = base_args(tmp_path, model="minibp.models:preact_resnet", model_arg="depth=11", iters=2, val_every=2)
    assert train.main(argv) == 0
    assert "minibp.models:preact_resnet(depth=11) (11 units, 83,220 parameters)" in capsys.readouterr().out
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").config["model"] == "minibp.models:preact_resnet"


BAD_MODELS = {
    "no file": (None, "nothing.py:build", "no file"),
    "no module": (None, "no_such_package.nets:build", "no module no_such_package.nets"),
    "not a spec": (None, "nets/x.txt:build", "give FILE.py:FUNCTION"),
    "syntax error": ("def build(*, input_shape, classes:\n", "mynet.py:build", "cannot import"),
    "import fails": ("import no_such_module\n", "mynet.py:build", "ModuleNotFoundError"),
    "no function": ("def other(**_):\n    pass\n", "mynet.py:build", "has no function build"),
    "raises": ("def build(*, input_shape, classes):\n    raise RuntimeError('out of ideas')\n", "mynet.py:build",
               "raised RuntimeError: out of ideas"),
    "wrong keywords": ("def build(*, input_shape):\n    pass\n", "mynet.py:build", "unexpected keyword argument"),
    "not a Net": ("def build(*, input_shape, classes):\n    return [input_shape]\n", "mynet.py:build",
                  "returned list, not a minibp.net.Net"),
    "no classifier": ("def build(*, input_shape, classes):\n    net = Net(input_shape)\n    net.conv(8)\n"
                      "    return net\n", "mynet.py:build", "without a classifier"),
    "compiled": ("def build(*, input_shape, classes):\n    net = Net(input_shape)\n    net.conv(8)\n"
                 "    net.classifier(classes)\n    return net.compile(pass_images=2)\n", "mynet.py:build",
                 "returned a compiled net"),
    "other classes": ("def build(*, input_shape, classes):\n    net = Net(input_shape)\n    net.conv(8)\n"
                      "    net.classifier(classes + 1)\n    return net\n", "mynet.py:build",
                      "a net for 5 classes; the data has 4"),
}


@pytest.mark.parametrize("case", BAD_MODELS)
def test_a_model_that_cannot_be_built_is_one_line_and_writes_nothing(tmp_path, data_dir, monkeypatch, capsys, case):
    source, spec, match = BAD_MODELS[case]
    monkeypatch.chdir(tmp_path)
    if source is not None:
        write_model(tmp_path, source)
    assert train.main(base_args(tmp_path, out="runs/own", model=spec, iters=2)) == 2
    assert match in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()  # refused before anything was written, or taken back


def test_model_arguments_are_for_your_own_net_and_must_be_literals(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, model_arg="width=8")) == 2  # resnet11
    assert "--model-arg is for your own net" in one_line_error(capsys.readouterr().err)
    with pytest.raises(SystemExit) as stopped:
        train.main(base_args(tmp_path, model=f"{VGG}:build", model_arg="pool=max"))
    assert stopped.value.code == 2 and "VALUE must be a Python literal" in capsys.readouterr().err


def test_a_resume_refuses_a_net_built_otherwise_naming_the_first_difference(tmp_path, data_dir, capsys):
    """A resume builds the net with the run's file as it is now, and refuses an edited one; an evaluation builds the
    net the checkpoint keeps as data, whatever the file says now."""
    source = "def build(*, input_shape, classes, width=8):\n    net = Net(input_shape)\n    net.conv(width)\n" \
             "    net.conv(2 * width, pool='max')\n    net.classifier(classes)\n    return net\n"
    path = write_model(tmp_path, source)
    assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2, val_every=2)) == 0
    run = str(tmp_path / "run")
    assert train.main(["--out", run, "--resume", "--iters", "3", "--model-arg", "width=4"]) == 2
    assert "--model-arg {'width': 4} (the run has {})" in one_line_error(capsys.readouterr().err)
    path.write_text(path.read_text().replace("width=8", "width=4"))  # the file edited after the run
    assert train.main(["--out", run, "--resume", "--iters", "3"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert line == (f"error: {run}/checkpoint.h5 holds another net than mynet.py:build() builds now: the "
                    "checkpoint's unit0.w is (8, 3, 3, 3), the net's (4, 3, 3, 3)")
    assert evaluate.main([run, "--which", "last"]) == 0  # the net as trained: the file is not read
    path.write_text(path.read_text().replace("    net.conv(2 * width, pool='max')\n", ""))
    assert train.main(["--out", run, "--resume", "--iters", "3"]) == 2
    assert "the net's (4, 3, 3, 3)" in one_line_error(capsys.readouterr().err)
    write_model(tmp_path, source)
    assert train.main(["--out", run, "--resume", "--iters", "3"]) == 0


@pytest.mark.slow
def test_two_ranks_train_your_own_net_as_one_process_with_split_2(tmp_path, data_dir):
    pytest.importorskip("mpi4py", reason="several ranks need mpi4py and mpich: pip install -e '.[dist]'")
    from test_dist import train as run_trainer  # (test_dist skips itself without mpi4py)
    own = dict(model=f"{VGG}:build", model_arg="width=8", iters=4, val_every=4)
    two = run_trainer(base_args(tmp_path, out="two", **own), ranks=2)
    assert two.returncode == 0, two.stderr
    assert run_trainer(base_args(tmp_path, out="one", sub_batches=2, **own)).returncode == 0
    assert same_weights(tmp_path / "one" / "checkpoint.h5", tmp_path / "two" / "checkpoint.h5")


def test_fit_runs_the_command_lines_loop(tmp_path, data_dir, capsys):
    """fit() with a function trains exactly as --model FILE.py:FUNCTION does, records the function's file,
    and its run resumes from the command line."""
    options = dict(data_dir=str(data_dir), batch=16, lr_schedule="0:0.05", log_every=2, val_every=3,
                   checkpoint_every=3)
    function = modelspec.load_function(f"{VGG}:build")
    net = minibp.fit(function, data="cifar10", out=tmp_path / "fit", model_args=dict(width=8), iters=3, **options)
    assert net.classes == 4 and net.predict(np.zeros((2, 8, 8, 3), np.float32)).shape == (2, 4)
    assert checkpoint.load(tmp_path / "fit" / "checkpoint.h5").config["model"] == f"{VGG}:build"
    assert train.main(base_args(tmp_path, out="cli", iters=6, model=f"{VGG}:build", model_arg="width=8")) == 0
    assert train.main(["--out", str(tmp_path / "fit"), "--resume", "--iters", "6"]) == 0
    assert same_weights(tmp_path / "fit" / "checkpoint.h5", tmp_path / "cli" / "checkpoint.h5")
    with pytest.raises(ValueError, match="--model-arg {'width': 16} \\(the run has {'width': 8}\\)"):
        minibp.fit(function, data="cifar10", out=tmp_path / "fit", model_args=dict(width=16), resume=True, iters=7,
                   **options)
    # the resume of fit's docstring and docs/training.md: no model (the run's), more iterations at a new rate
    net = minibp.fit(data="cifar10", out=tmp_path / "fit", iters=8, lr_schedule="0:0.001", resume=True,
                     data_dir=str(data_dir))
    assert checkpoint.load(tmp_path / "fit" / "checkpoint.h5").iteration == 8 and net.classes == 4


def test_fit_refuses_what_it_cannot_record_in_plain_exceptions(tmp_path, data_dir):
    with pytest.raises(TypeError, match="unknown options itres"):
        minibp.fit("resnet11", data="cifar10", out=tmp_path / "x", itres=3)
    with pytest.raises(ValueError, match="module-level function"):
        minibp.fit(lambda **_: None, data="cifar10", out=tmp_path / "x")
    with pytest.raises(ValueError, match="invalid choice: '3'"):
        minibp.fit("resnet11", data="cifar10", out=tmp_path / "x", bits=3)
    with pytest.raises(ValueError, match="multiple of --sub-batches"):
        minibp.fit("resnet11", data="cifar10", data_dir=str(data_dir), out=tmp_path / "x", batch=10, sub_batches=3)
    assert not (tmp_path / "x").exists()


def test_a_width_that_is_not_whole_is_refused_in_one_line(tmp_path, data_dir, capsys):
    argv = base_args(tmp_path, model=f"{VGG}:build") + ["--model-arg", "width=8.5"]
    assert train.main(argv) == 2
    assert "a conv's channels must be a positive integer, got 8.5" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_fit_checks_its_own_arguments_as_the_command_line_does(tmp_path, data_dir):
    with pytest.raises(TypeError, match="a function defined in a .py file.*got <built-in function len>"):
        minibp.fit(len, data="cifar10", out=tmp_path / "x")
    with pytest.raises(TypeError, match="out is a run folder path, got None"):  # it trained into ./None
        minibp.fit("resnet11", data="cifar10", out=None)
    with pytest.raises(TypeError, match="graph is True or False, got 'False'"):  # bool("False") is True
        minibp.fit("resnet11", data="cifar10", out=tmp_path / "x", graph="False")
    with pytest.raises(TypeError, match="resume is True or False, got 1"):
        minibp.fit("resnet11", data="cifar10", out=tmp_path / "x", resume=1)
    with pytest.raises(TypeError, match="lr_schedule takes --lr-schedule's value, not True"):
        minibp.fit("resnet11", data="cifar10", out=tmp_path / "x", lr_schedule=True)
    assert not (tmp_path / "x").exists() and not (ROOT / "None").exists()


def test_a_negative_seed_is_named(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, seed=-1)) == 2
    assert "--seed must be a non-negative integer, got -1" in one_line_error(capsys.readouterr().err)


def test_a_model_file_that_exits_as_it_imports_is_one_line(tmp_path, data_dir, capsys):
    model = tmp_path / "exits.py"
    model.write_text("import sys\nsys.exit(3)\n")
    assert train.main(base_args(tmp_path, model=f"{model}:build")) == 2
    assert f"cannot import {model} (it called sys.exit(3))" in one_line_error(capsys.readouterr().err)


SCRIPT_WITHOUT_GUARD = """
import minibp
from minibp.net import Net

def build(*, input_shape, classes):
    net = Net(input_shape)
    net.conv(8, kernel=3)
    net.classifier(classes)
    return net

minibp.fit(build, data="cifar10", data_dir={data_dir!r}, out={out!r}, overwrite=True, iters=2, batch=16,
           lr_schedule="0:0.05", val_every=2)
"""


@pytest.mark.slow
def test_evaluate_never_runs_a_scripts_training_again(tmp_path, data_dir, capsys):
    # Without a guard, evaluate imported the script, whose fit(overwrite=True) deleted the run and trained it
    # again. Now evaluate builds the net its checkpoint keeps as data, and imports nothing of the run's.
    script, run = tmp_path / "train_it.py", tmp_path / "run"
    script.write_text(SCRIPT_WITHOUT_GUARD.format(data_dir=str(data_dir), out=str(run)))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.name != "lock"}
    assert evaluate.main([str(run)]) == 0
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.name != "lock"} == before


SLOW_NET = '''
import time
from minibp import models

time.sleep(1.0)  # an import that takes its time (a large library, a network share)


def build(*, input_shape, classes):
    time.sleep(1.0)  # and a function that does too
    return models.by_name("resnet11", input_shape=input_shape, classes=classes)
'''


def test_a_model_file_that_takes_long_says_what_is_still_being_imported_and_where(tmp_path, data_dir, monkeypatch,
                                                                                  capsys):
    # a model file that never returned hung the trainer without a word
    (tmp_path / "slow.py").write_text(SLOW_NET)
    monkeypatch.setattr(modelspec, "SLOW_S", 0.3)
    assert train.main(base_args(tmp_path, model=f"{tmp_path / 'slow.py'}:build", iters=2, val_every=2)) == 0
    err = capsys.readouterr().err
    assert f"minibp: still importing {tmp_path / 'slow.py'} after " in err
    assert f"slow.py:5" in err and "minibp: still calling slow.py:build() after " in err and "slow.py:9" in err
    assert "Ctrl-C stops it" in err


MARKING_NET = """
import pathlib

pathlib.Path({marker!r}).write_text("imported")  # what a file of someone else's could do, run as whoever loads it


def build(*, input_shape, classes):
    net = Net(input_shape)
    net.conv(8)
    with net.residual():
        net.conv(8, kernel=1)
    net.classifier(classes)
    return net
"""


def test_loading_a_run_never_runs_its_model_file_and_needs_none(tmp_path, data_dir, capsys):
    """The checkpoint keeps the net as data: evaluate, minibp.load (predict) and export build it from that, and never
    import the model file the run was trained with: a file that writes a marker as it is imported writes none,
    and with the file gone they all still work."""
    marker = tmp_path / "marker"
    path = write_model(tmp_path, MARKING_NET.format(marker=str(marker)))
    assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2, val_every=2)) == 0
    assert marker.exists()  # training imported it: the user's own run
    run = tmp_path / "run"
    for gone in (False, True):
        marker.unlink(missing_ok=True)
        if gone:
            path.unlink()
        assert evaluate.main([str(run), "--json"]) == 0
        model = minibp.load(run)
        assert model.predict(np.zeros((2, 8, 8, 3), np.uint8))[0].shape == (2,)
        assert not marker.exists(), "loading the run ran its model file"
    assert checkpoint.load(run / "best.h5").structure["recipe"][-1] == {"classifier": 4}


def test_a_model_file_others_could_write_or_own_is_not_imported(tmp_path, data_dir, capsys):
    """A model file writable by other users, or owned by another user, is refused in one line naming it and the fix,
    before any of it runs: a line another user appended would run as whoever trains."""
    marker = tmp_path / "marker"
    path = write_model(tmp_path, MARKING_NET.format(marker=str(marker)))
    path.chmod(0o666)
    assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{path} is writable by other users (mode 0666)" in line and f"chmod go-w {path}" in line
    assert not marker.exists()
    path.chmod(0o644)
    if os.geteuid() == 0:  # (only root can give a file away)
        os.chown(path, 12345, 12345)
        assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2)) == 2
        assert f"{path} is owned by uid 12345, not by you (uid 0)" in one_line_error(capsys.readouterr().err)
        assert not marker.exists()


def test_a_run_whose_model_file_is_gone_fine_tunes_and_resumes_from_its_structure(tmp_path, data_dir, capsys):
    """--init-from without --model builds the source's net from the structure its checkpoint keeps (another
    classifier for other data), never importing the source's model file; a resume whose file is gone builds the
    net its own checkpoint keeps, and says so."""
    from runs import make_dataset
    marker = tmp_path / "marker"
    path = write_model(tmp_path, MARKING_NET.format(marker=str(marker)))
    assert train.main(base_args(tmp_path, out="source", model=f"{path}:build", iters=2, val_every=2)) == 0
    marker.unlink()
    make_dataset(tmp_path / "five", classes=5, seed=1)
    tuned = base_args(tmp_path, out="tuned", data_dir=str(tmp_path / "five"), init_from=str(tmp_path / "source"),
                      iters=2, val_every=2)
    at = tuned.index("--model")
    assert train.main(tuned[:at] + tuned[at + 2:]) == 0  # the file is there, and not imported
    assert not marker.exists()
    assert checkpoint.load(tmp_path / "tuned" / "checkpoint.h5").model_file is None  # (built with no file)
    path.unlink()
    assert train.main(["--out", str(tmp_path / "tuned"), "--resume", "--iters", "3"]) == 0
    assert "is not there: the net is built from the structure" in capsys.readouterr().err
    assert train.main(["--out", str(tmp_path / "source"), "--resume", "--iters", "3"]) == 0
    assert checkpoint.load(tmp_path / "tuned" / "checkpoint.h5").structure["recipe"][-1] == {"classifier": 5}
    assert not marker.exists()


def test_a_resume_says_that_its_model_file_changed(tmp_path, data_dir, capsys):
    """A checkpoint records the model file's SHA-256; a resume with a file that changed (here, a comment) and still
    builds the run's net says so on stderr, and goes on."""
    path = write_model(tmp_path, MARKING_NET.format(marker=str(tmp_path / "marker")))
    assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2, val_every=2)) == 0
    recorded = checkpoint.load(tmp_path / "run" / "checkpoint.h5").model_file
    assert recorded["path"] == str(path) and len(recorded["sha256"]) == 64
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3"]) == 0
    assert "changed since" not in capsys.readouterr().err
    path.write_text(path.read_text() + "# an edit that builds the same net\n")
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 0
    assert f"note: {path} changed since" in capsys.readouterr().err


def test_a_run_saved_before_checkpoints_kept_their_net_finds_its_moved_file_through_model(tmp_path, data_dir,
                                                                                         capsys):
    """A checkpoint without the net's structure (an older minibp's) builds the net with its model file: where that
    file is gone, the one-line refusal names it and the option that points to its new place, and model= (--model)
    loads it from there; a checkpoint that keeps its net refuses model= rather than ignore it."""
    import h5py
    path = write_model(tmp_path, MARKING_NET.format(marker=str(tmp_path / "marker")))
    assert train.main(base_args(tmp_path, model=f"{path}:build", iters=2, val_every=2)) == 0
    run = tmp_path / "run"
    with pytest.raises(ValueError, match="keeps its net as data and loads without a model file: leave --model out"):
        minibp.load(run, model=f"{path}:build")
    for name in ("best.h5", "checkpoint.h5"):  # as an older minibp wrote them
        with h5py.File(run / name, "r+") as f:
            del f.attrs["structure"]
            f.attrs["attrs_sha256"] = checkpoint.attrs_sha256(f.attrs)
    moved = tmp_path / "moved"
    moved.mkdir()
    path.rename(moved / path.name)
    with pytest.raises(ValueError) as refused:
        minibp.load(run)
    assert f"builds its net with {path}, which is not there: give the file's new place with --model " \
           f"FILE.py:build (minibp.load(..., model=))" in str(refused.value)
    model = minibp.load(run, model=f"{moved / path.name}:build")
    assert model.predict(np.zeros((2, 8, 8, 3), np.uint8))[0].shape == (2,)
    spec = f"{moved / path.name}:build"
    np.save(tmp_path / "images.npy", np.zeros((2, 8, 8, 3), np.uint8))
    capsys.readouterr()
    assert evaluate.main([str(run)]) == 2  # the refusal names the option ...
    assert "give the file's new place with --model FILE.py:build" in one_line_error(capsys.readouterr().err)
    assert evaluate.main([str(run), "--model", spec]) == 0  # ... which each command takes
    assert predict.main([str(run), str(tmp_path / "images.npy"), "--model", spec]) == 0
    pytest.importorskip("onnx")
    assert export.main([str(run), "--out", str(tmp_path / "out"), "--format", "safetensors", "--model", spec]) == 0


def test_an_error_without_a_message_is_given_a_reason(tmp_path, data_dir, monkeypatch, capsys):
    # A model whose function ran out of memory was reported as "raised MemoryError: ", its reason empty
    monkeypatch.chdir(tmp_path)
    for error, reason in (("MemoryError", "out of memory"), ("RuntimeError", "(no message)")):
        write_model(tmp_path, f"def build(*, input_shape, classes):\n    raise {error}\n")
        assert train.main(base_args(tmp_path, out="runs/own", model="mynet.py:build", iters=2)) == 2
        assert one_line_error(capsys.readouterr().err).endswith(f"raised {error}: {reason}")


def test_a_model_that_changes_the_working_folder_trains_and_resumes_in_the_folder_it_started_in(tmp_path, data_dir,
                                                                                               monkeypatch, capsys):
    # A model whose function called os.chdir stopped its run with "lock removed or replaced": the run folder, given
    # relative, was then looked for under the folder the model had gone to
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    model = write_model(tmp_path, f"""\
        import os

        def build(*, input_shape, classes):
            os.chdir({str(elsewhere)!r})
            net = Net(input_shape)
            net.conv(8)
            net.classifier(classes)
            return net
        """)
    monkeypatch.chdir(work)
    argv = base_args(tmp_path, model=f"{model}:build", iters=2, val_every=2, checkpoint_every=2)
    argv[argv.index("--out") + 1] = "run"  # relative: under the working folder
    assert train.main(argv) == 0
    err = capsys.readouterr().err
    assert f"changed the working folder to {elsewhere}; minibp went back to {work}" in err, err
    assert os.getcwd() == str(work) and (work / "run" / "checkpoint.h5").is_file()
    assert not (elsewhere / "run").exists()
    assert train.main(["--out", "run", "--resume", "--iters", "4"]) == 0
    assert checkpoint.load(work / "run" / "checkpoint.h5").iteration == 4
