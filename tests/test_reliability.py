"""Nothing lost, nothing silent: the trainer and the evaluator under kills, divergence, damaged files,
two trainers at once and options that do not fit the run."""
import json
import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from minibp import backend, checkpoint, evaluate, train
from minibp.rundir import read_metrics as read_metrics_file
from test_train import ROOT, base_args, make_dataset, read_metrics, untimed


@pytest.fixture
def data_dir(tmp_path):
    make_dataset(tmp_path / "data")
    return tmp_path / "data"


def one_line_error(err):
    """The error output is one line, with no traceback."""
    lines = [line for line in err.splitlines()  # what a first run compiles is said, not an error (kernels.py)
             if line.strip() and not line.startswith(("warning:", "minibp: compiling"))]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def start_trainer(argv):
    return subprocess.Popen([sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def wait_for_lines(path, count, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline and not (path.exists() and path.read_text().count("\n") >= count):
        time.sleep(0.05)


# ----------------------------------------------------------------------------- data loss

@pytest.mark.parametrize("rate", ["1e6", "1e30"])
def test_divergence_keeps_the_last_good_checkpoint(tmp_path, data_dir, capsys, rate):
    """From iteration 5 on the rate explodes; the run must stop with the iteration-5 checkpoint intact."""
    argv = base_args(tmp_path, iters=30, lr_schedule=f"0:0.05,5:{rate}", checkpoint_every=5, log_every=1,
                     val_every=100)
    assert train.main(argv) == 1
    line = one_line_error(capsys.readouterr().err)
    assert "diverged" in line and "--resume --lr-schedule 0:0.005,5:" in line
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")  # finite, or load would refuse it
    assert saved.iteration == 5 and "(iteration 5)" in line
    # the advice works: resumed with a rate that does not diverge, the run finishes
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--lr-schedule", "0:0.005",
                       "--iters", str(saved.iteration + 2)]) == 0


def test_checkpointing_every_iteration_through_divergence_leaves_a_finite_checkpoint(tmp_path, data_dir, capsys):
    argv = base_args(tmp_path, iters=30, lr_schedule="0:0.05,5:1e6", checkpoint_every=1, log_every=1, val_every=100)
    assert train.main(argv) == 1
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")  # load refuses NaN or Inf
    assert f"(iteration {saved.iteration})" in one_line_error(capsys.readouterr().err)


def test_a_checkpoint_is_never_written_from_a_net_that_is_not_finite(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, checkpoint_every=1, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    before = path.read_bytes()
    from minibp import models
    net = models.by_name("resnet11", input_shape=(8, 8, 3), classes=4).compile(batch=4, bits="4")
    net.params[3] = np.inf
    with pytest.raises(checkpoint.NotFinite, match="params"):
        checkpoint.save(path, net, iteration=9, config={}, data_state=dict(epoch=0, position=0, order=np.arange(4),
                                                                            rng="{}"))
    assert path.read_bytes() == before and not checkpoint.stale_temporaries(path)


def test_two_trainers_cannot_share_a_run_folder(tmp_path, data_dir, capsys):
    first = start_trainer(base_args(tmp_path, iters=100000, log_every=1, val_every=100000,
                                    checkpoint_every=2))
    try:
        wait_for_lines(tmp_path / "run" / "metrics.jsonl", 3)
        assert train.main(["--out", str(tmp_path / "run"), "--resume"]) == 2
        line = one_line_error(capsys.readouterr().err)
        assert f"in use by another trainer (pid {first.pid})" in line
        assert train.main(base_args(tmp_path) + ["--overwrite"]) == 2
        assert "in use" in capsys.readouterr().err
    finally:
        first.kill()
        first.wait()
    # the OS dropped the killed trainer's lock: the run resumes
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters",
                       str(checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration + 1)]) == 0


def test_the_final_checkpoint_is_saved_before_the_final_validation(tmp_path, data_dir, monkeypatch, capsys):
    def broken(*_args, **_kwargs):
        raise ValueError("the validation failed")
    monkeypatch.setattr(train, "evaluate", broken)
    assert train.main(base_args(tmp_path, iters=4, val_every=100, checkpoint_every=100)) == 2
    assert "the validation failed" in one_line_error(capsys.readouterr().err)
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration == 4


@pytest.mark.parametrize("iters", [4, 6], ids=["same-iters", "more-iters"])
def test_a_validation_cut_off_after_its_checkpoint_runs_on_resume(tmp_path, data_dir, monkeypatch, iters):
    """Killed between the iteration-4 checkpoint and its validation: the resumed run validates iteration 4
    first, also when --iters moves the end (4 was a validation point only as the old last iteration)."""
    real = train.evaluate
    monkeypatch.setattr(train, "evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    # (a second Ctrl-C quits at once, as a kill would: nothing more is written)
    assert train.main(base_args(tmp_path, iters=4, val_every=100, checkpoint_every=100)) == 130
    run = tmp_path / "run"
    assert checkpoint.load(run / "checkpoint.h5").iteration == 4
    assert not [r for r in read_metrics(run) if r["kind"] == "val"]
    monkeypatch.setattr(train, "evaluate", real)
    assert train.main(["--out", str(run), "--resume", "--iters", str(iters)]) == 0
    assert [r["iter"] for r in read_metrics(run) if r["kind"] == "val"] == sorted({4, iters})
    assert train.main(["--out", str(run), "--resume"]) == 0  # a finished run validates nothing twice
    assert [r["iter"] for r in read_metrics(run) if r["kind"] == "val"] == sorted({4, iters})


def test_a_broken_test_split_is_found_before_training(tmp_path, capsys):
    path = make_dataset(tmp_path / "data")
    with h5py.File(path, "r+") as f:
        labels = f["test/labels"][...]
        labels[0] = 99
        f["test/labels"][...] = labels
    assert train.main(base_args(tmp_path, iters=4)) == 2
    assert "test" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_torn_metrics_line_is_dropped_and_damage_elsewhere_named(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=4, log_every=1, val_every=2, checkpoint_every=2)) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"kind": "train", "it')  # a full disk cut this record short
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 0
    assert "torn last line" in capsys.readouterr().err
    iters = [r["iter"] for r in read_metrics(tmp_path / "run") if r["kind"] == "train"]
    assert iters == [1, 2, 3, 4, 5, 6]
    lines = metrics.read_text().splitlines()
    lines[2] = lines[2][:10]
    metrics.write_text("\n".join(lines) + "\n")
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "7"]) == 2
    assert f"{metrics}:3" in one_line_error(capsys.readouterr().err)


def test_a_fresh_run_refuses_a_folder_with_a_run_unless_told_to_overwrite(tmp_path, data_dir, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "train", "iter": 1, "loss": 1.0}\n')  # killed before a checkpoint
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 2
    assert "--overwrite" in one_line_error(capsys.readouterr().err)
    assert train.main(["--out", str(run), "--resume"]) == 2
    assert "--overwrite" in one_line_error(capsys.readouterr().err)
    assert train.main(base_args(tmp_path, iters=2, val_every=2, log_every=1) + ["--overwrite"]) == 0
    assert [r["iter"] for r in read_metrics(run) if r["kind"] == "train"] == [1, 2]


def test_kill_loop_loses_nothing_and_repeats_no_iteration(tmp_path, data_dir):
    """SIGKILL a run at random moments, restart it each time as a user would (resume if a checkpoint
    exists, else start again), and end with the weights of an uninterrupted run."""
    iters = 10
    common = dict(iters=iters, log_every=1, val_every=5, checkpoint_every=1)
    assert train.main(base_args(tmp_path, out="straight", **common)) == 0
    run = tmp_path / "run"
    rng = np.random.default_rng(1)
    for _ in range(4):
        resume = (run / "checkpoint.h5").exists()
        argv = ["--out", str(run), "--resume"] if resume else base_args(tmp_path, **common) + ["--overwrite"]
        process = start_trainer(argv)
        wait_for_lines(run / "metrics.jsonl", 1)  # the kernels are loaded and training is under way
        time.sleep(rng.uniform(0.0, 0.6))
        process.kill()
        process.wait()
    resume = (run / "checkpoint.h5").exists()
    argv = ["--out", str(run), "--resume"] if resume else base_args(tmp_path, **common) + ["--overwrite"]
    assert train.main(argv) == 0
    a, b = (checkpoint.load(tmp_path / name / "checkpoint.h5") for name in ("straight", "run"))
    assert a.iteration == b.iteration == iters
    assert all(np.array_equal(a.state[name], b.state[name]) for name in a.state)
    records = read_metrics(run)
    train_iters = [r["iter"] for r in records if r["kind"] == "train"]
    assert train_iters == list(range(1, iters + 1))
    assert [r["accuracy"] for r in records if r["kind"] == "val"] == [
        r["accuracy"] for r in read_metrics(tmp_path / "straight") if r["kind"] == "val"]
    assert not checkpoint.stale_temporaries(run / "checkpoint.h5")


def test_stale_temporary_checkpoints_are_removed_at_start(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    stale = tmp_path / "run" / "checkpoint.h5.x1y2z3.tmp"
    stale.write_bytes(b"\0" * 4096)  # what a SIGKILLed write leaves
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3"]) == 0
    assert not stale.exists()


# ----------------------------------------------------------------------------- resume options

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
        _set_attrs(f, config=json.dumps(config))
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


# ----------------------------------------------------------------------------- cheap checks first

def test_a_batch_larger_than_the_data_is_refused_before_allocating(tmp_path, data_dir, capsys):
    started = time.time()
    assert train.main(base_args(tmp_path, model="resnet1001", batch=100000)) == 2
    assert "between 1 and the split's 256 images" in one_line_error(capsys.readouterr().err)
    assert time.time() - started < 30


def test_a_plan_larger_than_the_memory_is_refused_with_the_batch_that_fits(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setattr(backend, "available_memory", lambda: 3 * 2**20)
    assert train.main(base_args(tmp_path, batch=64)) == 2
    line = one_line_error(capsys.readouterr().err)
    fits = int(line.split("the largest batch that fits is ")[1].split()[0])
    from minibp import models
    net = models.by_name("resnet11", input_shape=(8, 8, 3), classes=4)
    assert net.plan(batch=fits, bits="4").allocation_bytes <= 3 * 2**20 < net.plan(batch=fits + 1,
                                                                                  bits="4").allocation_bytes
    assert evaluate.main([str(tmp_path / "nothing"), "--batch", "64"]) == 2  # (no run: a clear error too)
    capsys.readouterr()


def test_evaluate_clamps_its_batch_to_the_split(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--batch", "100000", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 64


# ----------------------------------------------------------------------------- damaged checkpoints

def _rewrite(f, name, array):
    """Replace a dataset and its checksum, so that only the content checks can catch the change."""
    del f[name]
    f[name] = array
    f[name].attrs["sha256"] = checkpoint.sha256(array)


def _set_attrs(f, **attrs):
    """Change attributes and their checksum, as a hand-made checkpoint would: only the content checks remain."""
    f.attrs.update(attrs)
    f.attrs["attrs_sha256"] = checkpoint.attrs_sha256(f.attrs)


def _damage(path, how):
    with h5py.File(path, "r+") as f:
        if how == "flipped bit":
            params = f["state/params/unit0.w"][...]
            params.reshape(-1).view(np.uint32)[5] ^= 1 << 3
            f["state/params/unit0.w"][...] = params
        elif how == "order out of range":
            order = f["data_order"][...]
            order[0] = 10**6
            _rewrite(f, "data_order", order)
        elif how == "broken config":
            _set_attrs(f, config="{not json")
        elif how == "missing state":
            del f["state"]
        elif how == "not finite":
            running = f["state/running/unit1.bn"][...]
            running[0, 0] = np.nan
            _rewrite(f, "state/running/unit1.bn", running)
        elif how == "wrong shape":
            _rewrite(f, "state/params/unit1.gamma", np.ones(3, np.float32))


@pytest.mark.parametrize("how,match", [("flipped bit", "state/params/unit0.w fails its SHA-256"),
                                       ("order out of range", "data_order is not a permutation"),
                                       ("broken config", "not valid JSON"),
                                       ("missing state", "lacks state"),
                                       ("not finite", "running/unit1.bn hold NaN"),
                                       ("wrong shape", "the checkpoint's unit1.gamma is (3,), the net's (16,)")])
def test_a_damaged_checkpoint_is_named_by_train_and_evaluate(tmp_path, data_dir, capsys, how, match):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    _damage(path, how)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and match in line and "learning rate" not in line
    assert evaluate.main([str(tmp_path / "run")]) == 2
    assert match in one_line_error(capsys.readouterr().err)


def test_sigterm_saves_a_checkpoint_like_ctrl_c(tmp_path, data_dir):
    process = start_trainer(base_args(tmp_path, iters=100000, log_every=1, val_every=100000, checkpoint_every=1))
    wait_for_lines(tmp_path / "run" / "metrics.jsonl", 2)
    process.send_signal(signal.SIGTERM)  # a scheduler's stop: saves like Ctrl-C
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in output, output
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").iteration >= 2


def test_read_metrics_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iter": 1}\n[1, 2]\n{"iter": 3}\n')
    with pytest.raises(ValueError, match=f"{path}:2"):
        read_metrics_file(path)


@pytest.mark.parametrize("attribute", ["iteration", "config"])
def test_a_changed_checkpoint_attribute_fails_its_checksum(tmp_path, data_dir, capsys, attribute):
    """A flipped bit in the iteration (2 -> 18) would skip 16 iterations; in the config's bits (4 -> 8) it
    would train another run: the attributes are under a checksum, as the arrays are."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(path, "r+") as f:
        if attribute == "iteration":
            f.attrs["iteration"] = f.attrs["iteration"] ^ 16
        else:
            f.attrs["config"] = f.attrs["config"].replace('"bits": "4"', '"bits": "8"')
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "20"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and "is damaged: its attributes" in line and "fail their SHA-256 check" in line
    assert evaluate.main([str(tmp_path / "run")]) == 2
    assert "fail their SHA-256 check" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("edit,match", [
    (dict(batch="sixteen"), "configuration's batch is 'sixteen', not a positive integer"),
    (dict(model=None), "configuration lacks model"),
    (dict(momentum=float("nan")), "configuration's momentum is nan, not a finite non-negative number"),
    (dict(no_augment="no"), "configuration's no_augment is 'no', not true or false"),
    (dict(model="resnet12"), "holds a configuration that cannot run"),
])
def test_a_hand_made_config_is_checked_field_by_field(tmp_path, data_dir, capsys, edit, match):
    """The checksum rewritten too, as a hand-made checkpoint's would be: each field is still checked."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(path, "r+") as f:
        config = json.loads(f.attrs["config"])
        config.update(edit)
        _set_attrs(f, config=json.dumps({k: v for k, v in config.items() if v is not None}))
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and match in line
    assert evaluate.main([str(tmp_path / "run")]) == 2
    assert match in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("value", ["ten", None, 2.5])
def test_a_metrics_record_whose_iter_is_not_a_number_is_named(tmp_path, data_dir, capsys, value):
    assert train.main(base_args(tmp_path, iters=4, log_every=1, val_every=2, checkpoint_every=2)) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[1] = json.dumps(dict(json.loads(lines[1]), iter=value))
    metrics.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{metrics}:2 has iter {value!r}, not an iteration number" in line


def test_a_net_too_large_for_any_batch_names_what_is_too_big(tmp_path, data_dir, capsys):
    """A data file claiming 10^9 classes: no batch fits, and 'the largest batch that fits is 0' would mislead."""
    with h5py.File(data_dir / "cifar10.h5", "r+") as f:
        f.attrs["classes"] = 10**9
    assert train.main(base_args(tmp_path)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "even a batch of 1 needs" in line and "too large for this machine (input 8x8x3, 1,000,000,000 classes)" \
        in line and "largest batch" not in line
