"""python3 -m minibp.predict's own: its inputs refused in one line whatever they hold (arrays of no image shape,
files that are not what their names say, sizes they only declare), and --out written whole, never over a file
unless --overwrite and never through a link."""
import numpy as np
import pytest

from minibp import backend, predict, train
from runs import make_dataset, one_line_error


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A small trained run on 8x8x3 images of 4 classes: (run folder, its data file)."""
    where = tmp_path_factory.mktemp("predict")
    path = make_dataset(where / "data")
    assert train.main(["--data-file", str(path), "--model", "resnet11", "--batch", "16", "--iters", "2",
                       "--lr-schedule", "0:0.05", "--val-every", "2", "--out", str(where / "run")]) == 0
    return where / "run", path


def predicted(capsys, *argv):
    """(exit status, the one error line or the output) of predict.main(argv)."""
    capsys.readouterr()
    code = predict.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, (one_line_error(captured.err) if code else captured.out)


# ----------------------------------------------------------------------------- --out

def test_out_refuses_an_existing_file_unless_overwrite_and_writes_it_whole(run, tmp_path, capsys):
    folder, path = run
    out = tmp_path / "p.csv"
    out.write_text("mine\n")
    code, line = predicted(capsys, folder, path, "--out", out)
    assert code == 2 and f"{out} exists" in line and "--overwrite" in line
    assert out.read_text() == "mine\n"
    code, _ = predicted(capsys, folder, path, "--out", out, "--overwrite")
    assert code == 0 and out.read_text().startswith("index,class,name,probability")
    assert [p.name for p in tmp_path.iterdir()] == ["p.csv"]  # no temporary file left
    code, _ = predicted(capsys, folder, path, "--out", tmp_path / "p.npz")
    assert code == 0 and np.load(tmp_path / "p.npz")["classes"].shape == (64,)


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_out_never_writes_through_a_link(run, tmp_path, capsys, overwrite):
    folder, path = run
    victim, out = tmp_path / "victim.txt", tmp_path / "p.csv"
    victim.write_text("the victim's own\n")
    out.symlink_to(victim)
    code, line = predicted(capsys, folder, path, "--out", out, *overwrite)
    assert code == 2 and f"{out} is a symbolic link" in line
    assert victim.read_text() == "the victim's own\n" and out.is_symlink()


# ----------------------------------------------------------------------------- .npy inputs

@pytest.mark.parametrize("array, match", [
    (np.array(7, np.uint8), "a single value, not images"),
    (np.zeros(8, np.uint8), "of 1 dimension"),
    (np.zeros((8, 8), np.uint8), "of 2 dimensions"),
    (np.zeros((1, 1, 8, 8, 3), np.uint8), "of 5 dimensions"),
    (np.zeros((2, 8, 8, 3), [("a", np.uint8)]), "uint8"),
])
def test_an_array_that_holds_no_images_is_refused_in_one_line(run, tmp_path, capsys, array, match):
    np.save(tmp_path / "x.npy", array)
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and match in line and "x.npy" in line


@pytest.mark.parametrize("content", [b"just some text\n", b"", b"\x93NUMPY\x01\x00garbage", b"PK\x03\x04zip"])
def test_a_file_named_npy_that_is_not_one_says_so_and_never_suggests_pickle(run, tmp_path, capsys, content):
    (tmp_path / "x.npy").write_bytes(content)
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and "is not a NumPy array file" in line and "pickle" not in line.lower()


def test_an_object_array_is_refused_without_unpickling_or_suggesting_it(run, tmp_path, capsys):
    np.save(tmp_path / "x.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and "Python objects" in line and "allow_pickle" not in line


def test_an_npy_that_declares_more_than_it_holds_is_refused_before_reading(run, tmp_path, capsys):
    # A header saying (10**7, 8, 8, 3) uint8 (1.8 GiB) over a few bytes: read whole, a MemoryError or worse.
    header = {"descr": "|u1", "fortran_order": False, "shape": (10**7, 8, 8, 3)}
    with open(tmp_path / "x.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 1000)
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and "x.npy" in line and "declares" in line


def test_an_npy_larger_than_the_memory_is_refused_before_reading(run, tmp_path, capsys, monkeypatch):
    np.save(tmp_path / "x.npy", np.zeros((4000, 8, 8, 3), np.uint8))  # 750 KiB
    monkeypatch.setattr(backend, "host_memory", lambda: 2**18)
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and "memory" in line


def test_a_data_file_that_declares_more_images_than_it_holds_is_refused(run, tmp_path, capsys):
    path = tmp_path / "huge.h5"
    import h5py
    with h5py.File(path, "w") as f:  # 10**7 images declared, none written: a file of a few kilobytes
        f.attrs["classes"] = 4
        for split in ("train", "test"):
            f.create_dataset(f"{split}/images", shape=(10**7, 8, 8, 3), dtype=np.uint8, chunks=(256, 8, 8, 3))
            f.create_dataset(f"{split}/labels", shape=(10**7,), dtype=np.int64, chunks=(4096,))
    code, line = predicted(capsys, run[0], path)
    assert code == 2 and "huge.h5" in line and "MemoryError" not in line


def test_which_with_a_checkpoint_file_is_refused_in_one_line(run, tmp_path, capsys):
    folder, path = run
    checkpoint = folder / "checkpoint.h5"
    for which in ("best", "last"):
        code, line = predicted(capsys, checkpoint, path, "--which", which)
        assert code == 2 and f"{checkpoint} is a checkpoint file" in line and f"--which {which}" in line
    code, _ = predicted(capsys, checkpoint, path)
    assert code == 0


@pytest.mark.parametrize("shape", [(5, 8, 8), (8, 8, 1), (2, 8, 8, 1)])
def test_an_array_of_another_shape_is_reported_as_given(run, tmp_path, capsys, shape):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.uint8))
    code, line = predicted(capsys, run[0], tmp_path / "x.npy")
    assert code == 2 and f"got {shape}" in line and "(1, " not in line.split("got")[1]
