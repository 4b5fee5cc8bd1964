"""Prepared data files are checked whole when read: each kind of damage is a one-line error naming the file."""
import hashlib
import importlib.util
from pathlib import Path

import h5py
import numpy as np
import pytest

from minibp import data

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("minibp_prepare", ROOT / "datasets" / "prepare.py")
prepare = importlib.util.module_from_spec(spec)
spec.loader.exec_module(prepare)


def make_file(path, *, train_shape=(8, 8, 3), test_shape=None, n_train=6, n_test=4, classes=5, test_labels=None):
    """A file written by prepare.py's own writer, with random images and labels."""
    rng = np.random.default_rng(0)
    splits = {}
    for split, n, shape in (("train", n_train, train_shape), ("test", n_test, test_shape or train_shape)):
        labels = rng.integers(0, classes, n) if split == "train" or test_labels is None else np.asarray(test_labels)
        splits[split] = (rng.integers(0, 256, (n,) + shape, dtype=np.uint8), labels)
    return prepare.write_h5(path, splits, dict(name="cifar10", classes=classes))


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
                         r"again with python datasets/prepare.py cifar10 --out "),
    (flip_label, "train", r"train labels fail their SHA-256 check"),
    # the structure is checked whole, whichever split is asked for
    (lambda f: f.attrs.__delitem__("classes"), "train", r": no 'classes' attribute: prepare it again"),
    (lambda f: f.attrs.__setitem__("classes", 1), "train", r"'classes' attribute must be an integer of at least 2"),
    (lambda f: f.__delitem__("test"), "train", r"no 'test' group \(the file has: train\)"),
    (rename_dataset, "test", r"the train group has no 'images' dataset \(it has: imagse, labels\)"),
    (empty_split, "train", r"the test split is empty"),
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


def test_labels_beyond_the_classes_are_refused(tmp_path):
    path = make_file(tmp_path / "cifar10.h5", test_labels=[0, 4, 5, 1])  # checksummed as written
    with pytest.raises(ValueError, match=r"test labels span \[0, 5\], outside the 5 classes \[0, 5\)"):
        data.load_dataset(path)


def test_test_images_of_another_shape_are_refused(tmp_path):
    path = make_file(tmp_path / "cifar10.h5", train_shape=(32, 32, 3), test_shape=(28, 28, 3))
    with pytest.raises(ValueError, match=r"test images are 28x28x3 \(H x W x C\), train images 32x32x3"):
        data.load_split(path, "train")


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
        f["test/images"][0, 0, 0, 0] ^= 0x01  # cannot be detected
    train, test = data.load_dataset(clean)
    data.load_split(clean, "test")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {clean} (cifar10) has no SHA-256 checksums")
    assert "prepare it again with python datasets/prepare.py cifar10" in err
    assert len(train.images) == 6 and len(test.images) == 4


def test_prepare_stores_the_checksums_of_what_it_writes(clean):
    with h5py.File(clean, "r") as f:
        for split in ("train", "test"):
            images, labels = f[split]["images"][...], f[split]["labels"][...]
            assert f[split].attrs["images_sha256"] == hashlib.sha256(images.tobytes()).hexdigest()
            assert f[split].attrs["labels_sha256"] == hashlib.sha256(labels.astype("<i8").tobytes()).hexdigest()
