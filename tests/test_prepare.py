"""minibp.prepare (and datasets/prepare.py, the checkout's command for it) on small archives in the official
formats, built here; corrupt inputs refused."""
import errno
import gzip
import hashlib
import io
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from minibp import prepare

ROOT = Path(__file__).resolve().parent.parent


def _pickled(obj):
    return pickle.dumps(obj)


def make_cifar_archive(path, name, *, per_batch=6, seed=0):
    """A tar.gz laid out like the official CIFAR python archive, with few images a batch."""
    rng = np.random.default_rng(seed)
    spec = prepare.CIFAR[name]
    classes = 10 if name == "cifar10" else 100
    members, expected = {}, {}
    for split in ("train", "test"):
        datas, labels = [], []
        for stem in spec[split]:
            data = rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            lab = rng.integers(0, classes, per_batch).tolist()
            members[stem] = {b"data": data, spec["labels_key"]: lab}
            datas.append(data)
            labels += lab
        expected[split] = (np.concatenate(datas).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), np.array(labels))
    members[spec["meta"]] = {spec["names_key"]: [f"class{i}".encode() for i in range(classes)]}
    with tarfile.open(path, "w:gz") as tar:
        for stem, obj in members.items():
            payload = _pickled(obj)
            info = tarfile.TarInfo(f"{spec['folder']}/{stem}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path, expected


def md5(path):
    return hashlib.md5(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_archive_converts_to_nhwc_hdf5(tmp_path, name):
    archive, expected = make_cifar_archive(tmp_path / "a.tar.gz", name)
    out = prepare.convert_cifar(name, archive, tmp_path / f"{name}.h5", expected_md5=md5(archive))
    with h5py.File(out, "r") as f:
        for split in ("train", "test"):
            assert f[split]["images"].dtype == np.uint8
            assert np.array_equal(f[split]["images"][...], expected[split][0])
            assert np.array_equal(f[split]["labels"][...], expected[split][1])
        assert f.attrs["archive_md5"] == md5(archive) and f.attrs["classes"] == (10 if name == "cifar10" else 100)
        assert f.attrs["source"].startswith("https://www.cs.toronto.edu/")
    assert [p.name for p in tmp_path.iterdir() if "tmp" in p.name] == []


def test_cifar_checksum_mismatch_is_refused_before_unpickling(tmp_path):
    archive, _ = make_cifar_archive(tmp_path / "a.tar.gz", "cifar10")
    with pytest.raises(prepare.DataError, match="not the official cifar10 archive"):
        prepare.convert_cifar("cifar10", archive, tmp_path / "c.h5")  # the official md5 is expected
    assert not (tmp_path / "c.h5").exists()


def test_truncated_cifar_archive_is_refused(tmp_path):
    archive, _ = make_cifar_archive(tmp_path / "a.tar.gz", "cifar10")
    data = archive.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(prepare.DataError, match="corrupt, truncated"):
        prepare.convert_cifar("cifar10", cut, tmp_path / "c.h5", expected_md5=md5(archive))
    with pytest.raises(prepare.DataError, match="corrupt or truncated"):  # even if its checksum were right
        prepare.convert_cifar("cifar10", cut, tmp_path / "c.h5", expected_md5=md5(cut))
    assert not (tmp_path / "c.h5").exists()


def test_wrong_archive_is_refused(tmp_path):
    archive, _ = make_cifar_archive(tmp_path / "a.tar.gz", "cifar100")
    with pytest.raises(prepare.DataError, match="has no member cifar-10-batches-py"):
        prepare.convert_cifar("cifar10", archive, tmp_path / "c.h5", expected_md5=md5(archive))
    with pytest.raises(prepare.DataError, match="no archive"):
        prepare.convert_cifar("cifar10", tmp_path / "missing.tar.gz", tmp_path / "c.h5")


def write_idx(path, array, *, compress=True):
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.astype(np.uint8).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:  # closed: an unclosed GzipFile can lose its tail
        f.write(raw)
    return raw


def make_idx_dir(directory, *, n_train=12, n_test=5, seed=0):
    rng = np.random.default_rng(seed)
    directory.mkdir(exist_ok=True)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        arrays[prefix] = (rng.integers(0, 256, (n, 28, 28)), rng.integers(0, 10, n))
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz", arrays[prefix][0])
        write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz", arrays[prefix][1])
    return arrays


def test_fashion_mnist_idx_files_convert(tmp_path):
    arrays = make_idx_dir(tmp_path / "idx")
    out = prepare.convert_fashion_mnist(tmp_path / "idx", tmp_path / "fm.h5", verify=False)
    with h5py.File(out, "r") as f:
        assert f["train"]["images"].shape == (12, 28, 28, 1)
        assert np.array_equal(f["train"]["images"][..., 0], arrays["train"][0])
        assert np.array_equal(f["test"]["labels"][...], arrays["t10k"][1])
        assert f.attrs["classes"] == 10


def test_fashion_mnist_checksums_are_checked(tmp_path):
    make_idx_dir(tmp_path / "idx")
    with pytest.raises(prepare.DataError, match="not the official"):
        prepare.convert_fashion_mnist(tmp_path / "idx", tmp_path / "fm.h5")


@pytest.mark.parametrize("damage,match", [("truncate", "truncated or corrupt|corrupt or truncated"),
                                          ("magic", "not an IDX file"), ("missing", "has no")])
def test_bad_idx_files_are_refused(tmp_path, damage, match):
    make_idx_dir(tmp_path / "idx")
    target = tmp_path / "idx" / "train-images-idx3-ubyte.gz"
    raw = gzip.open(target).read()
    if damage == "truncate":
        gzip.open(target, "wb").write(raw[:-100])
    elif damage == "magic":
        gzip.open(target, "wb").write(b"\x00\x00\x09" + raw[3:])
    else:
        target.unlink()
    with pytest.raises(prepare.DataError, match=match):
        prepare.convert_fashion_mnist(tmp_path / "idx", tmp_path / "fm.h5", verify=False)
    assert not (tmp_path / "fm.h5").exists()


@pytest.mark.skipif(not prepare.FASHION_MNIST_DIR.is_dir(), reason="the Debian package dataset-fashion-mnist is "
                    "not installed (the README's set-up line installs it)")
def test_real_fashion_mnist_from_the_debian_package(tmp_path):
    out = prepare.convert_fashion_mnist(prepare.FASHION_MNIST_DIR, tmp_path / "fm.h5")
    with h5py.File(out, "r") as f:
        assert f["train"]["images"].shape == (60000, 28, 28, 1) and f["test"]["labels"].shape == (10000,)
        assert sorted(np.bincount(f["train"]["labels"][...]).tolist()) == [6000] * 10


@pytest.mark.slow
def test_script_runs_beside_a_package_named_datasets(tmp_path):
    """A `datasets` package earlier on sys.path (as Hugging Face's is) must not matter."""
    fake = tmp_path / "site" / "datasets"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('the wrong datasets package was imported')\n")
    make_idx_dir(tmp_path / "idx")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    done = subprocess.run([sys.executable, str(ROOT / "datasets" / "prepare.py"), "fashion-mnist", "--source",
                           str(tmp_path / "idx"), "--out", str(tmp_path / "out")], env=env, capture_output=True,
                          text=True)
    # the made-up IDX files fail the official checksum: the script ran and said so, as for a bad input file
    assert done.returncode == 2 and "not the official" in done.stderr, done.stderr


def run_main(capsys, *argv):
    """(exit status, stderr) of prepare.main(argv), stderr checked to be one line."""
    status = prepare.main(list(argv))
    err = capsys.readouterr().err
    assert err == "" if status == 0 else err.startswith("error: ") and err.count("\n") == 1, err
    return status, err


@pytest.fixture
def cifar_archive(tmp_path, monkeypatch):
    """A made-up cifar10 archive that main() takes for the official one."""
    archive, _ = make_cifar_archive(tmp_path / "a.tar.gz", "cifar10")
    monkeypatch.setitem(prepare.CIFAR["cifar10"], "md5", md5(archive))
    return archive


@pytest.mark.parametrize("out,match", [("a-file", "is a file, not a folder"), ("a-file/below", "cannot make"),
                                       ("/proc/xx", "cannot make")])
def test_out_must_be_a_folder(tmp_path, capsys, cifar_archive, out, match):
    (tmp_path / "a-file").write_text("not a folder")
    status, err = run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(tmp_path / out))
    assert status == 2 and match in err and "--out" in err


# what h5py raises on a full disk (its message, two lines, abridged) and what os.fsync raises
FULL_DISK = {"h5py": ((h5py.Group, "create_dataset"), "Unable to synchronously create dataset (file write failed: "
                      "time = Tue Dec  1 12:51:47 2026\n, errno = 28, error message = 'No space left on device')"),
             "fsync": ((os, "fsync"), os.strerror(errno.ENOSPC))}


@pytest.mark.parametrize("failing", list(FULL_DISK))
def test_a_failed_write_says_why_and_keeps_the_existing_file(tmp_path, capsys, monkeypatch, cifar_archive, failing):
    """A full disk, injected where the HDF5 data is written or where it is synced: one line, exit 1, and the
    file of an earlier conversion as it was."""
    out = tmp_path / "out"
    assert run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(out))[0] == 0
    before = (out / "cifar10.h5").read_bytes()
    (owner, name), message = FULL_DISK[failing]

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, message)
    monkeypatch.setattr(owner, name, full)
    status, err = run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(out))
    assert status == 1 and f"could not write {out / 'cifar10.h5'}: No space left on device" in err
    assert (out / "cifar10.h5").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["cifar10.h5"]  # no temporary file left


def test_a_failed_download_says_why(tmp_path, capsys, monkeypatch):
    def offline(*args, **kwargs):
        raise prepare.urllib.error.URLError("no network")
    monkeypatch.setattr(prepare.urllib.request, "urlopen", offline)
    status, err = run_main(capsys, "cifar10", "--out", str(tmp_path))
    assert status == 1 and "could not download https://www.cs.toronto.edu/" in err and "no network" in err
    assert list(tmp_path.iterdir()) == []  # no partial download


# A child that runs prepare.main until it is mid-work (downloading, or writing the HDF5 file, its temporary
# file open), says so by making the file `ready` and waits there for the test's SIGINT: no timing luck.
INTERRUPTED_CHILD = r"""
import os, sys, time
from pathlib import Path
import h5py
from minibp import prepare
stage, ready, md5, *argv = sys.argv[1:]
prepare.CIFAR["cifar10"]["md5"] = md5

def hold(*args, **kwargs):
    Path(ready).touch()
    time.sleep(60)
    raise SystemExit("no SIGINT came")

class Response:  # a download of 3 MiB that stops after its first MiB
    headers = {"Content-Length": str(3 << 20)}
    blocks = 0
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        return False
    def read(self, size):
        self.blocks += 1
        return b"x" * size if self.blocks == 1 else hold()

class Held:  # a SIGINT while Python runs its __del__ is "Exception ignored": swallowed where no one sees it
    def __del__(self):
        hold()

if stage == "write":
    h5py.Group.create_dataset = hold
elif stage == "close":
    closing = h5py.File.close

    def close(self):
        if os.path.realpath(self.filename).endswith(".tmp"):  # the file written, not one read or in memory
            Held()
        closing(self)
    h5py.File.close = close
else:
    prepare.urllib.request.urlopen = lambda url, timeout: Response()
sys.exit(prepare.main(argv))
"""


def interrupt_when_ready(argv, ready, *, env=None, check=None):
    """Start argv, wait until it touches `ready`, run `check`, send SIGINT; (returncode, stdout, stderr)."""
    child = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Python turns SIGINT into KeyboardInterrupt only if it starts with SIGINT's default action, which a test
        # run launched in the background (SIGINT ignored) would not hand down
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if not ready.exists():
            child.kill()
            pytest.fail(f"the child never got mid-work: {child.communicate()[1]!r}")
        if check is not None:
            check()
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.returncode, stdout, stderr


@pytest.mark.slow
@pytest.mark.parametrize("stage,earlier", [("download", False), ("write", False), ("write", True),
                                           ("close", True)])
def test_ctrl_c_says_in_one_line_what_it_left_and_exits_130(tmp_path, capsys, cifar_archive, stage, earlier):
    """SIGINT mid-download or mid-write (or while h5py closes the file, where Python swallows it): no traceback,
    one line on stderr, status 130, and nothing half-written left (no partial download, no temporary file), the
    file of an earlier conversion as it was."""
    out = tmp_path / "out"
    if earlier:
        assert run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if earlier else {}
    argv = ["--archive", str(cifar_archive)] if stage != "download" else []
    ready = tmp_path / "ready"

    def a_temporary_file_is_there():
        assert [p for p in out.iterdir() if p.name.endswith(".tmp")], "no temporary file to be left behind"

    returncode, stdout, stderr = interrupt_when_ready(
        [sys.executable, "-c", INTERRUPTED_CHILD, stage, str(ready), md5(cifar_archive), "cifar10", "--out", str(out),
         *argv], ready, check=a_temporary_file_is_there)
    target = out / "cifar10.h5"
    expected = (f"interrupted: {target} was not replaced (the one there is as it was)" if earlier else
                f"interrupted: {target} was not written")
    assert (returncode, stderr) == (130, expected + "\n")
    if stage == "download":  # the progress line ended, not run into by what comes next
        assert stdout.endswith(" / 3.0 MiB\n"), stdout
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing new, nothing changed


@pytest.mark.slow
def test_ctrl_c_while_it_loads_its_libraries_is_one_line_and_130(tmp_path):
    # Ctrl-C in the first second, while NumPy, h5py and CuPy load, printed a KeyboardInterrupt traceback (exit -2)
    ready, slow = tmp_path / "ready", tmp_path / "slow" / "h5py"
    slow.mkdir(parents=True)  # an h5py that takes its time to import, until the test's SIGINT
    (slow / "__init__.py").write_text(f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)\n")
    returncode, _, stderr = interrupt_when_ready(
        [sys.executable, "-m", "minibp.prepare", "cifar10", "--out", str(tmp_path / "out")], ready,
        env=dict(os.environ, PYTHONPATH=f"{tmp_path / 'slow'}:{ROOT}"))
    assert (returncode, stderr) == (130, "interrupted while python3 -m minibp.prepare started: nothing was "
                                         "written\n")
    assert not (tmp_path / "out").exists()


# h5py files that prepare closes, by the moment: before the write (data.write's in-memory trial of the
# attributes), the file written (its temporary file), and after it (the published file, read back)
CLOSED = {"before": lambda name: not name.endswith(".h5") and not name.endswith(".tmp"),
          "writing": lambda name: name.endswith(".tmp"), "after": lambda name: name.endswith("cifar10.h5")}


@pytest.mark.parametrize("moment", list(CLOSED))
def test_a_ctrl_c_that_h5py_swallows_still_keeps_the_old_file_and_exits_130(tmp_path, capsys, monkeypatch,
                                                                           cifar_archive, moment):
    """A KeyboardInterrupt raised where Python can only report it ("Exception ignored in ...": a __del__ while
    h5py closes a file) used to let the write go on: the old file replaced, exit status 0. Whenever it comes, the
    status is 130, and before the publication the old file stays."""
    out = tmp_path / "out"
    assert run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(out))[0] == 0
    before = (out / "cifar10.h5").read_bytes()
    closing = h5py.File.close

    class Interrupted:
        def __del__(self):
            raise KeyboardInterrupt

    def close(self):
        if CLOSED[moment](os.path.realpath(self.filename)):
            Interrupted()  # made and dropped: its __del__ raises where nothing can catch it
        closing(self)
    monkeypatch.setattr(h5py.File, "close", close)
    assert prepare.main(["cifar10", "--archive", str(cifar_archive), "--out", str(out)]) == 130
    target = out / "cifar10.h5"
    said = capsys.readouterr().err
    if moment == "after":
        assert said == f"interrupted after {target} was written (whole)\n"
    else:
        assert said == f"interrupted: {target} was not replaced (the one there is as it was)\n"
        assert target.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["cifar10.h5"]


def test_a_temporary_file_a_killed_writer_left_is_removed_at_the_next_write(tmp_path, capsys, cifar_archive):
    """SIGKILL leaves its temporary file (tens of megabytes); the next write of that file removes it, where its
    writer is gone (it holds no lock on it) and it has not changed for a minute, and where it is the user's own
    regular file: one being written, one just made or a link that looks like one stays."""
    import fcntl
    out = tmp_path / "out"
    out.mkdir()
    old, fresh, held, link = (out / f"cifar10.h5.{name}.tmp"
                              for name in ("k1ll3d_x", "n0wmad3_", "wr1t1ng_", "l1nk3d__"))
    for path in (old, fresh, held):
        path.write_bytes(b"x" * 1000)
    link.symlink_to(old)
    an_hour_ago = time.time() - 3600
    for path in (old, held):
        os.utime(path, (an_hour_ago, an_hour_ago))
    with open(held, "rb") as writer:
        fcntl.flock(writer, fcntl.LOCK_EX)  # a writer at work on it, however long
        assert run_main(capsys, "cifar10", "--archive", str(cifar_archive), "--out", str(out))[0] == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(["cifar10.h5", fresh.name, held.name, link.name])
