"""Prepared data files are checked whole when read: each kind of damage is a one-line error naming the file."""
import hashlib
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest

from minibp import backend
from minibp.io import data
from runs import ROOT, make_file


@pytest.fixture
def clean(tmp_path):
    return make_file(tmp_path / "cifar10.h5")


def test_a_clean_file_loads_whole_and_by_split(clean, capsys):
    train, test = data.load_dataset(clean)
    with h5py.File(clean, "r") as f:
        assert np.array_equal(train.images, f["train/images"][...]) and np.array_equal(test.labels, f["test/labels"])
    assert train.images.shape == (6, 8, 8, 3) and test.labels.dtype == np.int64 and train.classes == test.classes == 5
    assert np.array_equal(data.load_split(clean, "test").images, test.images)
    assert capsys.readouterr().err == ""


def flip_pixel(f):
    f["test/images"][1, 2, 3, 0] ^= 0x01


def flip_label(f):
    f["train/labels"][0] = (f["train/labels"][0] + 1) % 5


def rename_dataset(f):
    f.move("train/images", "train/imagse")


def empty_split(f):
    del f["test/images"], f["test/labels"]
    f["test/images"] = np.zeros((0, 8, 8, 3), np.uint8)
    f["test/labels"] = np.zeros(0, np.int64)


def zero_width_images(f):
    for split in ("train", "test"):
        del f[f"{split}/images"]
        f[f"{split}/images"] = np.zeros((len(f[f"{split}/labels"]), 8, 0, 3), np.uint8)


def float_images(f):
    images = f["test/images"][...]
    del f["test/images"]
    f["test/images"] = images.astype(np.float32)


def short_labels(f):
    labels = f["test/labels"][...]
    del f["test/labels"]
    f["test/labels"] = labels[:-1]


@pytest.mark.parametrize("damage,split,message", [
    (flip_pixel, "test", r"\(cifar10\): test images fail their SHA-256 check \(the file is damaged\): prepare it "
                         r"again with python3 -m minibp.prepare cifar10 --out "),
    (flip_label, "train", r"train labels fail their SHA-256 check"),
    # the structure is checked whole, whichever split is asked for
    (lambda f: f.attrs.__delitem__("classes"), "train", r": no 'classes' attribute: prepare it again"),
    (lambda f: f.attrs.__setitem__("classes", 1), "train", r"'classes' must be an integer of at least 2, got 1"),
    (lambda f: f.__delitem__("test"), "train", r"no 'test' group \(the file has: train\)"),
    (rename_dataset, "test", r"the train group has no 'images' dataset \(it has: imagse, labels\)"),
    (empty_split, "train", r"the test split is empty"),
    (zero_width_images, "test", r"train images are 8x0x3 \(H x W x C\): each of H, W and C must be at least 1"),
    (float_images, "train", r"test images must be uint8 \(N, H, W, C\), got float32 \(4, 8, 8, 3\)"),
    (short_labels, "train", r"test labels must be 4 integers for its 4 images, got int64 \(3,\)"),
])
def test_damage_is_a_one_line_error_naming_the_file(clean, damage, split, message):
    with h5py.File(clean, "r+") as f:
        damage(f)
    for load in (data.load_dataset, lambda path: data.load_split(path, split)):
        with pytest.raises(ValueError, match=message) as error:
            load(clean)
        assert str(error.value).startswith(f"{clean} (cifar10)") and "\n" not in str(error.value)


def reseal(f):
    """The root checksum recomputed, as a writer that means what it wrote would."""
    splits = [s for s in data.SPLITS if s in f]
    checksums = {s: {k: f[s].attrs[k] for k in ("images_sha256", "labels_sha256")} for s in splits}
    f.attrs["sha256"] = data.root_sha256({k: f.attrs[k] for k in f.attrs}, checksums)


def relabel(f):  # a label beyond the classes, with the checksum of the new labels
    labels = np.array([0, 4, 5, 1])
    f["test/labels"][...] = labels
    f["test"].attrs["labels_sha256"] = data.split_checksums(f["test/images"][...], labels)["labels_sha256"]
    reseal(f)


def smaller_test_images(f):
    del f["test/images"]
    f["test/images"] = np.zeros((4, 6, 6, 3), np.uint8)


@pytest.mark.parametrize("damage,message", [
    (relabel, r"test labels span \[0, 5\], outside the 5 classes \[0, 5\)"),
    (smaller_test_images, r"test images are 6x6x3 \(H x W x C\), train images 8x8x3"),
])
def test_consistent_files_of_inconsistent_data_are_refused(clean, damage, message):
    with h5py.File(clean, "r+") as f:
        damage(f)
    with pytest.raises(ValueError, match=message):
        data.load_dataset(clean)


def test_a_file_of_your_own_is_to_be_written_again(tmp_path):
    path = make_file(tmp_path / "mine.h5")
    with h5py.File(path, "r+") as f:
        flip_pixel(f)
    with pytest.raises(ValueError, match=r"mine.h5 \(mine\): test images fail their SHA-256 check \(the file is "
                                         r"damaged\): write it again \(minibp.io.data.write\)$"):
        data.load_dataset(path)


def test_a_file_that_is_not_hdf5_is_refused(tmp_path):
    path = tmp_path / "cifar10.h5"
    path.write_bytes(b"not HDF5 at all" * 100)
    with pytest.raises(ValueError, match=r"cifar10.h5 is not a readable HDF5 file \(.*\): prepare it again") as error:
        data.load_dataset(path)
    assert "\n" not in str(error.value)


def test_a_file_without_checksums_loads_with_one_warning(clean, capsys):
    """Files prepared by an older minibp carry no checksums: they load, with a warning, once per file."""
    with h5py.File(clean, "r+") as f:
        for split in ("train", "test"):
            del f[split].attrs["images_sha256"], f[split].attrs["labels_sha256"]
        del f.attrs["sha256"]  # (nor the root's checksum, which came later still)
        f["test/images"][0, 0, 0, 0] ^= 0x01  # cannot be detected
    train, test = data.load_dataset(clean)
    data.load_split(clean, "test")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {clean} (cifar10) has no SHA-256 checksums")
    assert "prepare it again with python3 -m minibp.prepare cifar10" in err
    assert len(train.images) == 6 and len(test.images) == 4


def strip_root_checksum(f):
    del f.attrs["sha256"]


def strip_root_checksum_and_add_a_class(f):  # an 11-class edit of a 10-class file (here 5 -> 6)
    del f.attrs["sha256"]
    f.attrs["classes"] = 6


def strip_a_split_checksum(f):
    del f.attrs["sha256"], f["test"].attrs["labels_sha256"]


def strip_every_split_checksum_but_one(f):
    del f.attrs["sha256"]
    for split, key in (("train", "images_sha256"), ("train", "labels_sha256"), ("test", "images_sha256")):
        del f[split].attrs[key]


@pytest.mark.parametrize("damage", [strip_root_checksum, strip_root_checksum_and_add_a_class, strip_a_split_checksum,
                                    strip_every_split_checksum_but_one])
def test_a_file_missing_some_of_its_checksums_is_damaged_not_older(clean, capsys, damage):
    # data.write always writes every checksum: one missing where others are is damage, not an older format
    with h5py.File(clean, "r+") as f:
        damage(f)
    for load in (data.load_dataset, lambda path: data.load_split(path, "train")):
        with pytest.raises(ValueError, match=r"checksum.* missing.*damaged") as error:
            load(clean)
        assert str(error.value).startswith(f"{clean} (cifar10)") and "\n" not in str(error.value)


def names_attr(value):
    def damage(f):
        f.attrs["class_names"] = value
        reseal(f)
    return damage


@pytest.mark.parametrize("value, message", [
    (np.array(["a", "b", "c"], dtype=h5py.string_dtype()), r"class_names has 3 names for 5 classes"),
    (np.arange(5), r"class_names\[0\] is .*not a string"),
    ("abcde", r"class_names must be a list of names, one per class"),
    (np.array(["a", "b", "c", "d", "\0e"], dtype="S2"), r"class_names\[4\] holds a NUL character"),
    (np.array([b"a", b"b", b"c", b"d", b"\xff"], dtype="S1"), r"class_names\[4\] is not valid UTF-8"),
    (np.array([["a", "b", "c", "d", "e"]], dtype=h5py.string_dtype()), r"class_names must be a list of names"),
])
def test_the_reader_checks_class_names_as_the_writer_does(clean, value, message):
    # 3 names for 10 classes, integers or the string 'abc' trained with exit 0 and a wrong minibp.load(...).class_names
    with h5py.File(clean, "r+") as f:
        names_attr(value)(f)
    with pytest.raises(ValueError, match=message) as error:
        data.load_dataset(clean)
    assert str(error.value).startswith(f"{clean} (cifar10)") and "\n" not in str(error.value)


def test_class_names_a_hand_written_file_stores_as_bytes_load(clean):
    with h5py.File(clean, "r+") as f:
        names_attr(np.array([b"a", b"b", b"c", b"d", b"e"]))(f)
    assert data.load_split(clean, "test").class_names == ("a", "b", "c", "d", "e")


def declared_not_stored(f):
    """The train split declares a million images and stores none (a file of kilobytes)."""
    for key, shape, chunks in (("images", (10**6, 8, 8, 3), (256, 8, 8, 3)), ("labels", (10**6,), (4096,))):
        del f["train"][key]
        f["train"].create_dataset(key, shape=shape, dtype=np.uint8 if key == "images" else np.int64, chunks=chunks)


def partly_stored(f):
    images = f["train/images"][...]
    del f["train/images"], f["train/labels"]
    f["train"].create_dataset("images", shape=(6000,) + images.shape[1:], dtype=np.uint8, chunks=(6,) + images.shape[1:])
    f["train/images"][:6] = images  # one chunk of a thousand: the rest reads as zeros, never written
    f["train/labels"] = np.zeros(6000, np.int64)


def stored_outside(f):
    """The train images read from another file (HDF5's external storage): never read."""
    images = f["train/images"][...]
    other = f.filename + ".raw"
    with open(other, "wb") as raw:
        raw.write(images.tobytes())
    del f["train/images"]
    f["train"].create_dataset("images", shape=images.shape, dtype=np.uint8, external=[(other, 0, images.nbytes)])


@pytest.mark.parametrize("damage, message", [
    (declared_not_stored, r"train images declare 1,000,000 images .* but the file stores"),
    (partly_stored, r"train images declare 6,000 images .* but the file stores"),
    (stored_outside, r"train images are stored outside the file"),
])
def test_a_split_the_file_does_not_hold_is_refused_before_it_is_read(clean, damage, message, monkeypatch):
    with h5py.File(clean, "r+") as f:
        damage(f)
    monkeypatch.setattr(h5py.Dataset, "read_direct", lambda *a, **k: pytest.fail("read before the check"))
    monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda *a, **k: pytest.fail("read before the check"))
    with pytest.raises(ValueError, match=message) as error:
        data.load_dataset(clean)
    assert "\n" not in str(error.value)


def test_a_split_larger_than_the_memory_is_refused_before_it_is_read(tmp_path, monkeypatch):
    # compressed zeros: a small file whose splits are large in memory
    path = make_file(tmp_path / "cifar10.h5")
    monkeypatch.setattr(backend, "host_memory", lambda: 500)  # bytes: the test split takes 800
    with pytest.raises(ValueError, match=r"its train and test splits take .* in memory, more than the .* available"):
        data.load_dataset(path)
    with pytest.raises(ValueError, match=r"its test split takes .* in memory, more than the .* available"):
        data.load_split(path, "test")


def test_a_large_split_is_read_in_chunks_and_checked_whole(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (300, 8, 8, 3), dtype=np.uint8)
    path = data.write(tmp_path / "mine.h5", train=(images, rng.integers(0, 3, 300)), test=(images[:4], [0, 1, 2, 0]),
                      classes=3)
    monkeypatch.setattr(data, "READ_BYTES", 1000)  # a few images a read
    reads = []
    real = h5py.Dataset.read_direct
    monkeypatch.setattr(h5py.Dataset, "read_direct", lambda *a, **k: reads.append(1) or real(*a, **k))
    assert np.array_equal(data.load_split(path, "train").images, images) and len(reads) > 40
    with h5py.File(path, "r+") as f:
        f["train/images"][299, 7, 7, 2] ^= 1  # in the last chunk read
    with pytest.raises(ValueError, match="train images fail their SHA-256 check"):
        data.load_split(path, "train")


def test_write_stores_the_checksums_of_what_it_writes(clean):
    with h5py.File(clean, "r") as f:
        for split in ("train", "test"):
            images, labels = f[split]["images"][...], f[split]["labels"][...]
            assert f[split].attrs["images_sha256"] == hashlib.sha256(images.tobytes()).hexdigest()
            assert f[split].attrs["labels_sha256"] == hashlib.sha256(labels.astype("<i8").tobytes()).hexdigest()


def pair(n=4, shape=(8, 8, 3), labels=None):
    images = np.zeros((n,) + shape, np.uint8)
    return images, np.zeros(n, np.int64) if labels is None else labels


@pytest.mark.parametrize("options,message", [
    (dict(train=pair()[0]), r"^train must be a pair \(images, labels\), got ndarray$"),
    (dict(train=(np.zeros((4, 8, 8, 3), np.float32), np.zeros(4, int))),
     r"^train images must be uint8 \(N, H, W, C\), got float32 \(4, 8, 8, 3\)$"),
    (dict(test=pair(shape=(8, 8))), r"^test images must be uint8 \(N, H, W, C\), got uint8 \(4, 8, 8\)$"),
    (dict(test=pair(labels=np.zeros(3, int))), r"^test labels must be 4 integers for its 4 images, got int64 \(3,\)$"),
    (dict(test=pair(labels=np.zeros(4))), r"^test labels must be 4 integers .*, got float64 \(4,\)$"),
    (dict(train=pair(n=0)), r"^the train split is empty$"),
    (dict(test=(np.zeros((0, 8, 8, 3), np.uint8), [])), r"^the test split is empty$"),  # not "labels must be..."
    (dict(train=pair(n=5, shape=(0, 28, 1)), test=pair(shape=(0, 28, 1))),
     r"^train images are 0x28x1 \(H x W x C\): each of H, W and C must be at least 1$"),
    (dict(test=pair(shape=(8, 8, 0))), r"^test images are 8x8x0 \(H x W x C\): each of H, W and C must be"),
    (dict(test=pair(shape=(8, 8, 1))), r"^test images are 8x8x1 \(H x W x C\), train images 8x8x3$"),
    (dict(test=pair(labels=np.array([0, 1, 3, -1]))), r"^test labels span \[-1, 3\], outside the 3 classes \[0, 3\)$"),
    (dict(classes=1), r"^'classes' must be an integer of at least 2, got 1$"),
    (dict(classes=2.0), r"^'classes' must be an integer of at least 2, got 2.0$"),
    (dict(class_names=["a", "b"]), r"^class_names has 2 names for 3 classes$"),
    (dict(attrs=dict(classes=4, source="x")), r"^attrs may not set classes: they are write's own arguments$"),
])
def test_write_refuses_what_the_reader_would_refuse(tmp_path, options, message):
    """Each mistake is one sentence (a ValueError), and nothing is written."""
    with pytest.raises(ValueError, match=message):
        data.write(tmp_path / "mine.h5", **{**dict(train=pair(), test=pair(), classes=3), **options})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options,message", [
    (dict(class_names="abc"), r"^class_names must be a list of names, one per class, not a str \('abc'\)$"),
    (dict(class_names=b"abc"), r"^class_names must be a list of names, one per class, not a bytes"),
    (dict(class_names=3), r"^class_names must be a list of names, one per class, got int$"),
    (dict(class_names=["a", None, "c"]), r"^class_names\[1\] is NoneType None, not a string$"),
    (dict(class_names=["a", "b\0", "c"]), r"^class_names\[1\] holds a NUL character \(at 1\), which HDF5 strings "
                                          r"cannot hold$"),
    (dict(class_names=["a", "b", "\ud800"]), r"^class_names\[2\] is not valid Unicode \(a lone surrogate '\\ud800' "
                                             r"at 0\): HDF5 strings are UTF-8$"),
    (dict(name="my\0data"), r"^name holds a NUL character \(at 2\)"),
    (dict(name="\udc80"), r"^name is not valid Unicode"),
    (dict(attrs=dict(source=None)), r"^attrs\['source'\] is None, which HDF5 cannot store: leave it out, or give a "
                                    r"string or a number$"),
    (dict(attrs=dict(files=["a", "b\0"])), r"^attrs\['files'\] holds a NUL character \(at 1\)"),
    (dict(attrs=dict(source="\udfff")), r"^attrs\['source'\] is not valid Unicode"),
    (dict(attrs=dict(source=dict(url="x"))), r"^attrs\['source'\] cannot be stored as an HDF5 attribute \(.+\)$"),
    (dict(attrs={"": 1}), r"^attrs has the name '': attribute names are non-empty strings$"),
    (dict(attrs={"a\0b": 1}), r"^the attrs name 'a\\x00b' holds a NUL character"),  # h5py would cut it to "a"
    (dict(attrs=["source"]), r"^attrs must be a dict of attribute names to values, got list$"),
])
def test_write_refuses_what_hdf5_cannot_store_before_writing(tmp_path, monkeypatch, options, message):
    """Strings HDF5 cannot hold and values it has no type for are one line each, not h5py's error halfway
    through the file: refused before the file is opened, the one already there left as it was."""
    path = data.write(tmp_path / "mine.h5", train=pair(), test=pair(), classes=3)
    before = path.read_bytes()

    def no_file(*args, **kwargs):
        raise AssertionError("write opened the file before refusing its input")
    monkeypatch.setattr(data, "atomic_file", no_file)
    with pytest.raises(ValueError, match=message) as error:
        data.write(path, **{**dict(train=pair(), test=pair(), classes=3), **options})
    assert "\n" not in str(error.value)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["mine.h5"]


def test_write_stores_names_and_attributes_and_the_reader_loads_them(tmp_path):
    rng = np.random.default_rng(1)
    train = (rng.integers(0, 256, (5, 4, 6, 2), dtype=np.uint8), np.array([0, 1, 2, 1, 0], np.uint8))
    test = (rng.integers(0, 256, (3, 4, 6, 2), dtype=np.uint8)[:, ::-1], [2, 2, 0])  # a view and a list are taken
    path = data.write(tmp_path / "sub" / "mine.h5", train=train, test=test, classes=3, class_names=["x", "y", "z"],
                      attrs=dict(source="made up"))
    with h5py.File(path, "r") as f:
        assert f.attrs["name"] == "mine" and f.attrs["source"] == "made up" and list(f.attrs["class_names"]) == \
            ["x", "y", "z"]
        assert f["train/labels"].dtype == np.int64
    loaded = dict(zip(("train", "test"), data.load_dataset(path)))
    for split, (images, labels) in (("train", train), ("test", test)):
        assert np.array_equal(loaded[split].images, images) and np.array_equal(loaded[split].labels, labels)
        assert loaded[split].classes == 3 and loaded[split].name == "mine"


def test_the_trainer_trains_on_a_file_of_your_own(tmp_path, capsys):
    """A data set written with data.write trains: its image shape and class count size the net. The trainer
    finds a data file as DATA_DIR/<--data>.h5, so this one takes the name cifar10.h5."""
    from minibp import train
    rng = np.random.default_rng(0)
    splits = {split: (rng.integers(0, 256, (n, 12, 12, 2), dtype=np.uint8), rng.integers(0, 3, n))
              for split, n in (("train", 24), ("test", 8))}
    data.write(tmp_path / "data" / "cifar10.h5", **splits, classes=3, name="three shapes")
    assert train.main(["--data", "cifar10", "--data-dir", str(tmp_path / "data"), "--model", "resnet11", "--batch",
                       "8", "--iters", "2", "--val-every", "2", "--log-every", "1", "--out", str(tmp_path / "run")]) == 0
    assert "on cifar10" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iter"] for r in records if r["kind"] == "val"] == [2] and all(np.isfinite(r["loss"]) for r in records)


def test_the_classes_are_under_the_files_checksum(clean):
    # a one-bit change of classes (10 -> 11 here 4 -> 5) trained a net of another class count
    with h5py.File(clean, "r+") as f:
        f.attrs["classes"] = f.attrs["classes"] ^ 1
    with pytest.raises(ValueError, match=r"its attributes \(classes, names, checksums\) fail their SHA-256 check"):
        data.load_dataset(clean)


def test_a_validation_split_is_written_read_and_checked(tmp_path):
    rng = np.random.default_rng(0)
    pair = lambda n: (rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), rng.integers(0, 3, n))  # noqa: E731
    path = data.write(tmp_path / "mine.h5", train=pair(6), test=pair(4), val=pair(5), classes=3,
                      class_names=["a", "b", "c"], attrs=dict(source="here", version=2, scale=0.5))
    val = data.load_split(path, "val")
    assert len(val.labels) == 5 and val.part == "val" and val.class_names == ("a", "b", "c") and val.sha256
    assert data.has_split(path, "val") and not data.has_split(data.write(tmp_path / "plain.h5", train=pair(6),
                                                                          test=pair(4), classes=3), "val")
    with pytest.raises(ValueError, match="has no val split"):
        data.load_split(tmp_path / "plain.h5", "val")
    with pytest.raises(ValueError, match=r"val images are 4x4x3 \(H x W x C\), train images 8x8x3"):
        data.write(tmp_path / "bad.h5", train=pair(6), test=pair(4), classes=3,
                   val=(np.zeros((2, 4, 4, 3), np.uint8), [0, 1]))


def test_hold_out_is_the_same_every_time_and_keeps_nothing_twice(clean):
    train, _ = data.load_dataset(clean)
    kept, held = data.hold_out(train, 0.5)
    again_kept, again_held = data.hold_out(train, 0.5)
    assert np.array_equal(held.images, again_held.images) and np.array_equal(kept.labels, again_kept.labels)
    assert len(kept.labels) + len(held.labels) == len(train.labels) and held.part == "held-out"
    rows = {bytes(i) for i in train.images}
    assert {bytes(i) for i in kept.images} | {bytes(i) for i in held.images} == rows
    for bad in (0.0, 1.0, 0.01):
        with pytest.raises(ValueError, match="--val-split"):
            data.hold_out(train, bad)


def test_the_old_import_keeps_working_for_a_release_with_a_deprecation_warning():
    """`from minibp import data`, as the docs once said, gives minibp.io.data and a DeprecationWarning."""
    code = ("import warnings; warnings.simplefilter('always'); from minibp import data; "
            "from minibp.io import data as io; assert data is io and data.write is io.write")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "DeprecationWarning: minibp.data is now minibp.io.data (from minibp.io import data)" in done.stderr


def test_the_docs_way_of_writing_a_file_by_hand_loads_checked_and_without_a_warning(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "data.md").read_text()
    code = text.split("## Writing one by hand", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    rng = np.random.default_rng(0)
    arrays = dict(train_images=rng.integers(0, 256, (6, 8, 8, 3), dtype=np.uint8), train_labels=rng.integers(0, 10, 6),
                  test_images=rng.integers(0, 256, (4, 8, 8, 3), dtype=np.uint8), test_labels=rng.integers(0, 10, 4))
    (tmp_path / "mydata").mkdir()
    monkeypatch.chdir(tmp_path)
    exec(code, dict(arrays))
    train, test = data.load_dataset(tmp_path / "mydata" / "cifar10.h5")
    assert train.sha256 and np.array_equal(test.images, arrays["test_images"]) and capsys.readouterr().err == ""


@pytest.mark.parametrize("classes", [np.array([10, 11]), "ten", 1.5])
def test_describe_refuses_a_class_count_that_is_not_one_in_one_line(clean, classes):
    # read for a --data-file's name before anything else: an array was a TypeError traceback
    with h5py.File(clean, "r+") as f:
        f.attrs["classes"] = classes
    with pytest.raises(ValueError, match=r"'classes' must be an integer of at least 2") as error:
        data.describe(clean)
    assert "\n" not in str(error.value)
