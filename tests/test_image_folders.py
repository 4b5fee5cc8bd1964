"""A folder of image files as a data file (python3 -m minibp.prepare folder, data.write_folder) and as predict's
input: the common layout DIR/train/CLASS/*.png|jpg with val/ and test/ where present, one size or --size HxW,
grey or RGB as the images are, a bad file named in one line, a missing test/ held out and said, Ctrl-C leaving
no half-written file; predict's lines an image, its accuracy from class folders, and the file in its CSV."""
import builtins

import numpy as np
import pytest

from minibp import predict, prepare, train
from minibp.io import data
from minibp.io import images as image_files
from runs import one_line_error

Image = pytest.importorskip("PIL.Image", reason="image files need Pillow: pip install -e '.[imagenet]'")


def bar(direction, rng, size=(12, 12)):
    """A bright bar at the left or the right (mirror images: only orientation tells them apart), or the top."""
    image = rng.integers(0, 60, size).astype(np.uint8)
    where = dict(left=np.s_[:, :3], right=np.s_[:, -3:], top=np.s_[:3, :])[direction]
    image[where] += 150
    return image


def make_folder(root, *, classes=("left", "right", "top"), splits=(("train", 20), ("val", 6), ("test", 6)),
                size=(12, 12), seed=0):
    """The common layout of grey PNGs, `count` images a class in each split."""
    rng = np.random.default_rng(seed)
    for split, count in splits:
        for direction in classes:
            folder = root / split / direction
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(bar(direction, rng, size)).save(folder / f"{i}.png")
    return root


def test_a_folder_becomes_a_data_file_with_its_class_names_and_splits(tmp_path, capsys):
    folder = make_folder(tmp_path / "bars")
    (folder / "train" / "left" / "notes.txt").write_text("not an image")
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "bars.h5")]) == 0
    out = capsys.readouterr().out
    assert "left out 1 file(s) that are not .png, .jpg or .jpeg" in out
    assert f"wrote {tmp_path / 'bars.h5'}: train (60, 12, 12, 1), test (18, 12, 12, 1), val (18, 12, 12, 1)" in out
    train_split, test = data.load_dataset(tmp_path / "bars.h5")
    assert train_split.name == "bars" and train_split.class_names == ("left", "right", "top")
    assert list(np.bincount(train_split.labels)) == [20, 20, 20]
    first = np.asarray(Image.open(folder / "train" / "left" / "0.png"))
    assert np.array_equal(train_split.images[0, :, :, 0], first)  # pixels as the file holds them, sorted order
    assert data.load_split(tmp_path / "bars.h5", "val").images.shape == (18, 12, 12, 1)


def test_resizing_colour_and_a_missing_test_folder(tmp_path, capsys):
    folder = make_folder(tmp_path / "mixed", splits=(("train", 10),), size=(12, 12))
    Image.fromarray(np.full((20, 16, 3), [200, 0, 0], np.uint8)).save(folder / "train" / "top" / "red.jpg")
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "m.h5")]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "the images differ in size" in line and "red.jpg 20x16" in line and "give --size HxW" in line
    data.write_folder(tmp_path / "m.h5", folder, size=(8, 10))
    out = capsys.readouterr().out
    assert f"{folder} has no test/ folder: 3 of train/'s 31 images (a tenth, the same every time)" in out
    train_split, test = data.load_dataset(tmp_path / "m.h5")
    assert train_split.images.shape == (28, 8, 10, 3) and test.images.shape == (3, 8, 10, 3)  # one colour: RGB


@pytest.mark.parametrize("problem,match", [
    ("bad image", "left/broken.png: not an image Pillow can read"),
    ("bad size", "--size is HxW in pixels, e.g. 32x32, got '12by12'"),
    ("no train", "has no train/ folder: the layout is"),
    ("unknown class", "val/sideways is not a class of"),
    ("out folder", "give the .h5 file to write"),
])
def test_a_bad_folder_image_or_option_is_one_line_and_writes_nothing(tmp_path, capsys, problem, match):
    folder = make_folder(tmp_path / "bars", splits=(("train", 4), ("test", 2)))
    argv = ["folder", str(folder), "--out", str(tmp_path / "out.h5")]
    if problem == "bad image":
        (folder / "train" / "left" / "broken.png").write_bytes(b"\x89PNG not really")
    elif problem == "bad size":
        argv += ["--size", "12by12"]
    elif problem == "no train":
        (folder / "train").rename(folder / "training")
    elif problem == "unknown class":
        (folder / "val" / "sideways").mkdir(parents=True)
    else:
        argv[-1] = str(tmp_path)
    assert prepare.main(argv) == 2
    assert match in one_line_error(capsys.readouterr().err)
    assert not (tmp_path / "out.h5").exists()


def test_ctrl_c_while_decoding_leaves_the_file_that_was_there(tmp_path, capsys, monkeypatch):
    folder = make_folder(tmp_path / "bars", splits=(("train", 4), ("test", 2)))
    out = tmp_path / "bars.h5"
    assert prepare.main(["folder", str(folder), "--out", str(out)]) == 0
    before = out.read_bytes()
    monkeypatch.setattr(image_files, "decode", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert prepare.main(["folder", str(folder), "--out", str(out)]) == 130
    assert f"interrupted: {out} was not replaced" in capsys.readouterr().err
    assert out.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["bars", "bars.h5"]


def test_without_pillow_reading_images_says_how_to_install_it(monkeypatch):
    real = builtins.__import__

    def no_pil(name, *args, **kwargs):
        if name == "PIL" or name.startswith("PIL."):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(ValueError, match=r"reading image files needs Pillow: pip install 'minibp\[imagenet\]'"):
        image_files.pillow()


@pytest.fixture
def trained(tmp_path):
    """A small run on a folder of bars: (run folder, image folder)."""
    folder = make_folder(tmp_path / "bars", splits=(("train", 30), ("test", 4)))
    data.write_folder(tmp_path / "bars.h5", folder)
    assert train.main(["--data-file", str(tmp_path / "bars.h5"), "--model", "resnet11", "--batch", "15",
                       "--iters", "4", "--lr-schedule", "0:0.05", "--val-every", "4", "--out",
                       str(tmp_path / "run")]) == 0
    return tmp_path / "run", folder


def test_predict_takes_image_files_and_folders_and_reads_labels_from_class_folders(trained, tmp_path, capsys):
    run, folder = trained
    capsys.readouterr()
    one = folder / "test" / "left" / "0.png"
    assert predict.main([str(run), str(one)]) == 0
    out = capsys.readouterr().out
    assert "(iteration 4): 1 image; predicted " in out and f"  {one}: " in out and "accuracy" not in out
    assert predict.main([str(run), str(folder / "test"), "--out", str(tmp_path / "p.csv")]) == 0
    out = capsys.readouterr().out
    assert "12 images; predicted" in out and "accuracy " in out and "on the images' class folders" in out
    rows = (tmp_path / "p.csv").read_text().splitlines()
    assert rows[0] == "index,class,name,probability,file" and rows[1].endswith(str(folder / "test" / "left" / "0.png"))
    big = tmp_path / "big.png"  # another size and colour: decoded as the run's images are
    Image.fromarray(np.full((24, 30, 3), 90, np.uint8)).save(big)
    assert predict.main([str(run), str(big)]) == 0
    assert "resized 1 of 1 images to the run's 12x12 (H x W)" in capsys.readouterr().out


def test_predict_refuses_inputs_it_cannot_read_in_one_line(trained, tmp_path, capsys):
    run, folder = trained
    (tmp_path / "notes.txt").write_text("text")
    np.save(tmp_path / "x.npy", np.zeros((1, 12, 12, 1), np.uint8))
    capsys.readouterr()
    for inputs, match in (([tmp_path / "notes.txt"], "notes.txt: give an .npy file"),
                          ([tmp_path / "x.npy", folder / "test"], "give one .npy or .h5 file alone"),
                          ([tmp_path / "empty"], "empty: give an .npy file")):
        assert predict.main([str(run)] + [str(p) for p in inputs]) == 2
        assert match in one_line_error(capsys.readouterr().err)
