"""The run folder (minibp/run/folder.py) under hostile conditions: one trainer at a time, even with its lock or the whole
folder deleted while it runs; a metrics log that holds each iteration once and names damage by file and line; a
full disk; stale temporary files; and refused starts that must leave the disk as they found it."""
import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from minibp import backend, integrity, train
from minibp.run import checkpoint
from minibp.run.folder import MAX_LINE, MetricsLog
from minibp.run.folder import read_metrics as read_metrics_file
from minibp.run.session import Session
from runs import ROOT, base_args, one_line_error, read_metrics, running, start_trainer, wait_for_lines


def stopped(process, timeout=60):
    """(exit status, output) of a trainer that must stop by itself."""
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"the trainer did not stop: {output[-2000:]}")
    return process.returncode, output


# ----------------------------------------------------------------------------- the lock and the folder

@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_trainer_whose_lock_is_gone_stops_and_a_second_one_owns_the_folder(tmp_path, data_dir, capsys, how):
    """flock holds the lock file's inode: with OUT/lock deleted or replaced a second trainer can lock the
    folder, so the first must stop at its next write, writing nothing more."""
    run = tmp_path / "run"
    first = start_trainer(base_args(tmp_path, iters=100000, log_every=1, val_every=100000, checkpoint_every=2))
    try:
        wait_for_lines(run / "metrics.jsonl", 3)
        if how == "deleted":
            (run / "lock").unlink()
        else:
            (run / "lock.new").write_text("0\n")
            os.replace(run / "lock.new", run / "lock")
        code, output = stopped(first)
    finally:
        first.kill()
        first.wait()
    assert code == 1 and "Traceback" not in output, output
    assert f"error: {run / 'lock'} was removed or replaced while this trainer held it" in output
    last = max(r["iter"] for r in read_metrics(run))
    saved = checkpoint.load(run / "checkpoint.h5")
    assert saved.iteration <= last  # its last checkpoint came before its last record: none after the loss
    # the folder is the second trainer's now; it resumes from the first one's last checkpoint
    assert train.main(["--out", str(run), "--resume", "--iters", str(saved.iteration + 2)]) == 0
    assert checkpoint.load(run / "checkpoint.h5").iteration == saved.iteration + 2


def remove_like_rm_rf(path):
    """Delete a folder a live trainer is writing into, as `rm -rf` does: an entry that vanishes
    under it (a checkpoint's temporary file renamed into place) or a file that appears after the
    listing is not an error; try again until the folder is gone (a few times: a trainer that kept
    refilling it would be the fault the caller tests for)."""
    for attempt in range(20):
        if not path.exists():
            return
        try:
            shutil.rmtree(path)
            return
        except OSError as err:
            if err.errno not in (errno.ENOENT, errno.ENOTEMPTY) or attempt == 19:
                raise


@pytest.mark.slow
def test_a_deleted_run_folder_stops_the_trainer_without_recreating_it(tmp_path, data_dir):
    run = tmp_path / "run"
    process = start_trainer(base_args(tmp_path, iters=100000, log_every=1, val_every=100000, checkpoint_every=5))
    try:
        wait_for_lines(run / "metrics.jsonl", 3)
        remove_like_rm_rf(run)
        code, output = stopped(process)
    finally:
        process.kill()
        process.wait()
    assert code == 1 and "Traceback" not in output and "done:" not in output, output
    assert "was removed or replaced while this trainer held it" in output.splitlines()[-1]
    assert not run.exists()


# ----------------------------------------------------------------------------- the metrics log

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


def test_read_metrics_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iter": 1}\n[1, 2]\n{"iter": 3}\n')
    with pytest.raises(ValueError, match=f"{path}:2"):
        read_metrics_file(path)


# ----------------------------------------------------------------------------- writes

def limited_trainer(argv, max_bytes):
    """A trainer run in a process that cannot grow any file past max_bytes: a write fails as on a full disk
    (EFBIG, where a full disk gives ENOSPC: the same failed write to the trainer)."""
    return subprocess.run([sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes)),
                          timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["checkpoint.h5", "metrics.jsonl"])
def test_a_failed_write_names_the_file_and_keeps_the_checkpoint(tmp_path, data_dir, which):
    assert train.main(base_args(tmp_path, iters=2, val_every=2, log_every=1, checkpoint_every=2)) == 0
    run = tmp_path / "run"
    before = (run / "checkpoint.h5").read_bytes()
    # room for the metrics as they are and a little more, or for nothing like a checkpoint
    limit = (run / "metrics.jsonl").stat().st_size + (50 if which == "metrics.jsonl" else 10_000)
    done = limited_trainer(["--out", str(run), "--resume", "--iters", "6"], limit)
    assert done.returncode == 1, done.stderr
    line = one_line_error(done.stderr)
    assert f"cannot write {run / which} (File too large); the previous checkpoint (iteration 2) is kept" in line
    assert (run / "checkpoint.h5").read_bytes() == before and not integrity.stale_temporaries(run / "checkpoint.h5")


def test_stale_temporary_metrics_are_removed_at_start(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    stale = tmp_path / "run" / "metrics.jsonl.k3j4l5.tmp"
    stale.write_text('{"kind": "train", "iter": 1}\n')  # what a resume killed mid-rewrite leaves
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3"]) == 0
    assert not stale.exists()


def test_stale_temporary_checkpoints_are_removed_at_start(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    stale = tmp_path / "run" / "checkpoint.h5.x1y2z3.tmp"
    stale.write_bytes(b"\0" * 4096)  # what a SIGKILLed write leaves
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "3"]) == 0
    assert not stale.exists()


# ----------------------------------------------------------------------------- refused starts

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


def test_a_refused_start_leaves_the_disk_as_it_found_it(tmp_path, data_dir, monkeypatch, capsys):
    nested = tmp_path / "runs" / "deeper" / "run"
    assert train.main(base_args(tmp_path, out=nested, batch=100000)) == 2  # larger than the data
    assert "between 1 and" in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "runs").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setattr(backend, "available_memory", lambda: 2**20)
    assert train.main(base_args(tmp_path, out="empty")) == 2  # no batch fits
    assert "available" in one_line_error(capsys.readouterr().err)
    assert empty.is_dir() and not list(empty.iterdir())
    monkeypatch.undo()
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    names = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 2  # holds a run: --overwrite needed
    assert "--overwrite" in one_line_error(capsys.readouterr().err)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == names


# ----------------------------------------------------------------------------- a full disk, a vanished log

@pytest.mark.slow
def test_a_full_disk_at_the_start_names_the_lock_file_and_leaves_nothing(tmp_path, data_dir):
    done = limited_trainer(base_args(tmp_path, out="runs/run"), 0)  # the first write, the lock's pid, fails
    assert done.returncode == 1, done.stderr
    assert f"cannot write {tmp_path / 'runs' / 'run' / 'lock'} (File too large)" in one_line_error(done.stderr)
    assert not (tmp_path / "runs").exists()


def test_a_failed_append_leaves_nothing_for_close_to_fail_on(tmp_path):
    # A buffered log kept a failed record and failed again on close, which hid the first error's file name.
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    log.write(kind="train", iter=1)
    size = path.stat().st_size
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))  # the file cannot grow: as a full disk
    try:
        with pytest.raises(OSError):
            log.write(kind="train", iter=2)
        log.close()  # must not raise
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert [r["iter"] for r in read_metrics_file(path)] == [1]


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_metrics_file_removed_mid_run_stops_the_run(tmp_path, data_dir, capsys, monkeypatch, how):
    # Appending to a deleted file loses every later record unseen: the run stops as failed instead.
    real = MetricsLog.write

    def write(log, **record):
        if record.get("iter") == 3 and record.get("kind") == "train":
            log.path.unlink()
            if how == "replaced":
                log.path.write_text("")
        real(log, **record)

    monkeypatch.setattr(MetricsLog, "write", write)
    assert train.main(base_args(tmp_path, iters=6, log_every=1, checkpoint_every=2, val_every=100)) == 1
    line = one_line_error(capsys.readouterr().err)
    assert (f"cannot write {tmp_path / 'run' / 'metrics.jsonl'} (removed or replaced while the run appended to "
            "it); the previous checkpoint (iteration 2) is kept") in line


def test_read_metrics_refuses_an_overlong_line_without_reading_it_whole(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iter": 1}\n' + "x" * (MAX_LINE + 10) + '\n{"iter": 3}\n')
    with pytest.raises(ValueError, match=f"{path}:2 is longer than {MAX_LINE} bytes"):
        read_metrics_file(path)


def test_a_resume_reads_a_huge_metrics_file_in_bounded_memory(tmp_path, data_dir, capsys):
    # A terabyte of zeros (a sparse file): read whole, it grew the process until the kernel killed it.
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_text().count("\n")
    os.truncate(metrics, 1 << 40)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    assert f"{metrics}:{lines + 1} is longer than {MAX_LINE} bytes" in one_line_error(capsys.readouterr().err)


def test_a_torn_last_line_is_still_dropped_when_blank_lines_follow(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"iter": 1}\n{"iter": 2, "lo\n\n')
    assert read_metrics_file(path) == [{"iter": 1}]
    assert f"{path}:2: dropping a torn last line" in capsys.readouterr().err


# ----------------------------------------------------------------------------- links and files of others

# What another user who can write a shared run folder may put where minibp's own files go (issue 56): a link to
# a victim file, a link to a file not there yet (open would create it), a second name of the victim (a hard
# link), a FIFO (an open that would hang) or a folder.
PLANTS = ("link", "dangling link", "hard link", "fifo", "folder")


def plant(where, how, victim):
    """Put `how` at the path `where` (removed first), aimed at the file `victim` (made with known bytes)."""
    if where.is_dir() and not where.is_symlink():
        shutil.rmtree(where)
    elif os.path.lexists(where):
        where.unlink()
    if how != "dangling link":
        victim.write_bytes(b"the victim's own bytes\n")
    if how in ("link", "dangling link"):
        where.symlink_to(victim)
    elif how == "hard link":
        os.link(victim, where)
    elif how == "fifo":
        os.mkfifo(where)
    else:
        where.mkdir()


def untouched(victim, how):
    return not victim.exists() if how == "dangling link" else victim.read_bytes() == b"the victim's own bytes\n"


@pytest.mark.parametrize("name", ["lock", "checkpoint.h5", "best.h5", "metrics.jsonl"])
@pytest.mark.parametrize("how", PLANTS)
def test_a_resume_refuses_a_link_or_other_file_where_its_own_goes(tmp_path, data_dir, capsys, name, how):
    # As seen: rm RUN/lock; ln -s /tmp/victim.txt RUN/lock; --resume exited 0 with the trainer's pid in the victim.
    assert train.main(base_args(tmp_path, iters=2, val_every=2, checkpoint_every=2)) == 0
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    plant(run / name, how, victim)
    capsys.readouterr()
    code = run_with_timeout(["--out", str(run), "--resume", "--iters", "4"])
    if how != "hard link" or name in ("lock", "metrics.jsonl"):  # (the others are renamed over, never written in)
        assert code == 2
        line = one_line_error(capsys.readouterr().err)
        assert str(run / name) in line and ("symbolic link" in line or "not a regular file" in line
                                            or "a folder" in line or "other name" in line), line
    assert untouched(victim, how)


@pytest.mark.parametrize("how", PLANTS)
def test_a_fresh_run_refuses_a_link_or_other_file_where_its_lock_goes(tmp_path, data_dir, capsys, how):
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    run.mkdir()
    plant(run / "lock", how, victim)
    assert run_with_timeout(base_args(tmp_path, iters=2, val_every=2)) == 2
    assert str(run / "lock") in one_line_error(capsys.readouterr().err)
    assert untouched(victim, how)


def run_with_timeout(argv, seconds=60):
    """train.main(argv), failed by SIGALRM if it hangs (an open of a FIFO waits for a writer for ever)."""
    def hung(*_):
        raise AssertionError(f"the trainer hung: {argv}")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        return train.main(argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("how", ["link", "hard link", "fifo"])
def test_a_file_planted_while_the_run_trains_is_refused_and_never_written_through(tmp_path, data_dir, capsys,
                                                                                    monkeypatch, how):
    # After the start's checks: each write of the checkpoint and the metrics refuses what is at its name then.
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    real = Session.save

    def save(session, **kwargs):
        if session.iteration == 4:
            plant(run / "checkpoint.h5", how, victim)
        return real(session, **kwargs)
    monkeypatch.setattr(Session, "save", save)
    code = run_with_timeout(base_args(tmp_path, iters=6, val_every=100, checkpoint_every=2))
    if how == "hard link":  # renamed over: the other name keeps the victim's bytes
        assert code == 0
    else:
        assert code == 1
        line = one_line_error(capsys.readouterr().err)
        assert f"cannot write {run / 'checkpoint.h5'}" in line and "previous checkpoint (iteration 2) is kept" in line
    assert untouched(victim, how)


@pytest.mark.parametrize("how", ["link", "dangling link", "hard link", "fifo"])
def test_the_metrics_log_never_writes_through_a_link(tmp_path, how):
    path, victim = tmp_path / "metrics.jsonl", tmp_path / "victim.txt"
    plant(path, how, victim)
    with pytest.raises(OSError, match="symbolic link|not a regular file|other name"):
        run_with_timeout_call(lambda: MetricsLog(path).write(kind="train", iter=1))
    assert untouched(victim, how)


def run_with_timeout_call(call, seconds=30):
    def hung(*_):
        raise AssertionError("hung")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_temporary_file_is_written_through_the_file_made_whatever_its_name_holds_later(tmp_path):
    # Another user who can write the folder swaps the temporary name for a link between its creation and the
    # write: the write (and the chmod that follows it) still goes to the file made, never through the link.
    path, victim = tmp_path / "checkpoint.h5", tmp_path / "victim.txt"
    victim.write_bytes(b"the victim's own bytes\n")
    os.chmod(victim, 0o600)
    with pytest.raises(OSError):  # the name it would publish is no longer its file: nothing published
        with integrity.atomic_file(path) as tmp:
            made = integrity.stale_temporaries(path)[0]
            made.unlink()
            made.symlink_to(victim)
            with open(tmp, "wb") as f:
                f.write(b"minibp's bytes")
    assert victim.read_bytes() == b"the victim's own bytes\n" and victim.stat().st_mode & 0o777 == 0o600
    assert not path.exists() and made.is_symlink()  # what another put at the name is not removed either


FORKING_NET = '''
import os, sys, time
from minibp import models

def build(*, input_shape, classes):
    child = os.fork()
    if child == 0:  # lives on after the trainer, as a worker the user's code started might
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # (not the trainer's output: its reader would wait for this one too)
            os.dup2(quiet, fd)
        with open(os.environ["CHILD_PID_FILE"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
    return models.by_name("resnet11", input_shape=input_shape, classes=classes)
'''


@pytest.mark.slow
def test_a_child_the_model_function_forks_does_not_hold_the_folders_lock(tmp_path, data_dir):
    # As seen: a model function that forks left a child holding the lock, and for 30 s every start was refused,
    # naming a pid that had already exited. The lock is the trainer's process's alone.
    (tmp_path / "net.py").write_text(FORKING_NET)
    env = dict(os.environ, CHILD_PID_FILE=str(tmp_path / "child.pid"))
    argv = base_args(tmp_path, model=f"{tmp_path / 'net.py'}:build", iters=2, val_every=2)
    first = subprocess.run([sys.executable, "-m", "minibp.train"] + argv, cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    children = []
    try:
        assert first.returncode == 0, first.stderr
        wait_for_lines(tmp_path / "child.pid", 0, timeout=10)
        children.append(int((tmp_path / "child.pid").read_text()))
        assert running(children[-1])  # the fork lives on
        again = subprocess.run([sys.executable, "-m", "minibp.train", "--out", str(tmp_path / "run"), "--resume",
                                "--iters", "4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 0 and "in use" not in again.stderr, again.stderr
        children.append(int((tmp_path / "child.pid").read_text()))
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_fresh_start_in_a_folder_with_a_run_says_what_overwrite_would_delete(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    (tmp_path / "run" / "checkpoint.h5").unlink()  # best.h5 alone: --resume continues it (test_reliability.py)
    capsys.readouterr()
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "pass --resume to continue it" in line and line.endswith("which deletes best.h5, metrics.jsonl")


def test_a_working_folder_changed_under_a_relative_run_folder_is_said_for_what_it_is(tmp_path, monkeypatch):
    # Code of the user's that called os.chdir (minibp takes a model function back: tests/test_own_net.py) was told
    # that the lock was "removed or replaced", which sent them looking for another trainer
    from minibp.run.folder import FolderLost, RunDir
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    run = RunDir.claim("run", fresh=True)
    run.check()
    os.chdir(tmp_path / "elsewhere")
    with pytest.raises(FolderLost) as lost:
        run.check()
    assert str(lost.value) == (f"the working folder changed to {tmp_path / 'elsewhere'} (from {tmp_path}, which "
                               "holds the run folder run) while this trainer held it: an os.chdir in your code? It "
                               "stops without writing to the run folder")
    os.chdir(tmp_path)
    run.check()
    run.release()
