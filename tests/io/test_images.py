"""A folder of image files as a data file (python3 -m minibp.prepare folder, data.write_folder) and as predict's
input: the common layout DIR/train/CLASS/*.png|jpg with val/ and test/ where present, one size or --size HxW,
grey or RGB as the images are, a bad file named in one line, a missing test/ held out and said, Ctrl-C leaving
no half-written file; predict's lines an image, its accuracy from class folders, and the file in its CSV."""
import builtins
import json
import re

import h5py
import numpy as np
import pytest

from minibp import predict, prepare, train
from minibp.io import data
from minibp.io import images as image_files
from minibp.run import checkpoint
from runs import bar, make_folder, one_line_error

Image = pytest.importorskip("PIL.Image", reason="image files need Pillow: pip install -e '.[imagenet]'")


def test_a_folder_becomes_a_data_file_with_its_class_names_and_splits(tmp_path, capsys):
    folder = make_folder(tmp_path / "bars")
    (folder / "train" / "left" / "notes.txt").write_text("not an image")
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "bars.h5")]) == 0
    out = capsys.readouterr().out
    assert "left out 1 file(s) that are not images (.png, .jpg, .jpeg, .tif, .tiff)" in out
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
    with pytest.raises(ValueError, match=r"reading image files needs Pillow: install it with .* -m pip install .*\[images\]'"):
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


# ----------------------------------------------------------------------------- every mode, upright, resized

GRADIENT16 = np.linspace(0, 65535, 8 * 12).round().astype(np.uint16).reshape(8, 12)  # (H, W): 0 to 65535


def scaled16(values):
    """The 8-bit values of 16-bit ones: value / 257, rounded (65535 -> 255, 257 k -> k)."""
    return ((np.asarray(values, np.int64) + 128) // 257).astype(np.uint8)


def mode_file(tmp_path, mode):
    """(a file of the Pillow mode, as that mode's format carries it; the (H, W, C) uint8 decode must give, grey or
    RGB as the mode is)."""
    rng = np.random.default_rng(0)
    grey = rng.integers(0, 256, (8, 12), dtype=np.uint8)
    rgb = rng.integers(0, 256, (8, 12, 3), dtype=np.uint8)
    alpha = rng.integers(0, 256, (8, 12), dtype=np.uint8)
    palette = rng.integers(0, 256, 768, dtype=np.uint8)
    index = rng.integers(0, 256, (8, 12), dtype=np.uint8)
    if mode == "1":
        image, want = Image.fromarray(grey > 127), np.where(grey > 127, 255, 0).astype(np.uint8)[..., None]
    elif mode == "L":
        image, want = Image.fromarray(grey), grey[..., None]
    elif mode == "LA":
        image, want = Image.fromarray(np.dstack([grey, alpha]), "LA"), grey[..., None]  # alpha dropped
    elif mode in ("P", "PA"):
        image = Image.fromarray(index, "P")
        image.putpalette(palette.tolist())
        if mode == "PA":
            image = image.convert("PA")
            image.putalpha(Image.fromarray(alpha))
        want = palette.reshape(256, 3)[index]  # the palette's colours
    elif mode == "RGB":
        image, want = Image.fromarray(rgb), rgb
    elif mode == "RGBA":
        image, want = Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), rgb
    elif mode == "CMYK":
        image = Image.fromarray(np.dstack([rgb, alpha]), "CMYK")
        want = np.asarray(image.convert("RGB"))
    elif mode in ("I;16", "I;16B"):
        image = Image.fromarray(GRADIENT16) if mode == "I;16" else \
            Image.frombytes("I;16B", (12, 8), GRADIENT16.astype(">u2").tobytes())
        want = scaled16(GRADIENT16)[..., None]
    elif mode == "I":
        image, want = Image.fromarray(GRADIENT16.astype(np.int32)), scaled16(GRADIENT16)[..., None]
    else:  # F: values in [0, 1], scaled by 255
        values = np.linspace(0, 1, 96, dtype=np.float32).reshape(8, 12)
        image, want = Image.fromarray(values), np.rint(values * 255).astype(np.uint8)[..., None]
    suffix = ".png" if mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16") else ".tif"
    path = tmp_path / f"{mode.replace(';', '_')}{suffix}"
    image.save(path)
    assert Image.open(path).mode == mode  # the file carries the mode itself
    return path, want


MODES = ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "I;16", "I;16B", "I", "F"]


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_decodes_to_its_8_bit_values(tmp_path, mode):
    path, want = mode_file(tmp_path, mode)
    grey = want.shape[2] == 1
    assert image_files.header(path) == ((8, 12), grey)
    assert np.array_equal(image_files.decode(path, channels=want.shape[2]), want)
    if grey:  # a grey image where the run's are RGB: its value in each channel
        assert np.array_equal(image_files.decode(path, channels=3), np.repeat(want, 3, axis=2))


@pytest.mark.parametrize("mode, values, match", [
    ("I", np.array([[0, 70000]], np.int32), "32-bit integer pixels in [0, 70000]"),
    ("I", np.array([[-5, 10]], np.int32), "32-bit integer pixels in [-5, 10]"),
    ("F", np.array([[0.0, 1.5]], np.float32), "floating-point pixels in [0, 1.5]"),
    ("F", np.array([[np.nan, 0.5]], np.float32), "floating-point pixels that are not numbers"),
])
def test_pixels_outside_the_modes_range_are_refused_in_one_line(tmp_path, mode, values, match):
    Image.fromarray(values).save(tmp_path / "odd.tif")
    with pytest.raises(ValueError, match=re.escape(match)) as raised:
        image_files.decode(tmp_path / "odd.tif", channels=1)
    assert "odd.tif" in str(raised.value) and "\n" not in str(raised.value)


def test_16_bit_images_are_scaled_not_clipped_in_prepare_and_predict(tmp_path, capsys):
    folder = tmp_path / "deep"
    for split in ("train", "test"):
        for i, name in enumerate(("dark", "light")):
            (folder / split / name).mkdir(parents=True)
            Image.fromarray(GRADIENT16 // (2 - i)).save(folder / split / name / "0.png")
            Image.fromarray(GRADIENT16 // (2 - i)).save(folder / split / name / "1.tif")
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "deep.h5")]) == 0
    train_split, _ = data.load_dataset(tmp_path / "deep.h5")
    want = scaled16(GRADIENT16 // 2)[..., None]
    assert train_split.images.shape == (4, 8, 12, 1) and np.array_equal(train_split.images[0], want)
    found, _ = predict.list_images([folder / "test"])
    images, *_ = predict.read_images(found, (8, 12, 1), ("dark", "light"))
    assert np.array_equal(images[0], want)  # predict decodes as prepare does


def oriented(path, pixels, orientation):
    """Save pixels (H, W) or (H, W, 3) at path with the EXIF orientation tag."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, exif=exif)
    return path


@pytest.mark.parametrize("suffix", [".png", ".jpg"])
def test_the_exif_orientation_is_applied_and_sizes_count_it(tmp_path, suffix):
    from PIL import ImageOps
    stored = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)  # 64 wide, 48 high as stored
    path = oriented(tmp_path / f"a{suffix}", stored, 6)  # shown turned a quarter clockwise: 48 wide, 64 high
    assert image_files.header(path) == ((64, 48), False)
    upright = np.asarray(ImageOps.exif_transpose(Image.open(path)))
    assert upright.shape == (64, 48, 3) and np.array_equal(image_files.decode(path), upright)
    if suffix == ".png":
        assert np.array_equal(upright, np.rot90(stored, -1))


def test_a_turned_image_is_read_upright_by_prepare_and_predict(tmp_path, capsys):
    folder = make_folder(tmp_path / "bars", splits=(("train", 4), ("test", 2)), size=(12, 8))
    stored = bar("top", np.random.default_rng(1), (8, 12))  # stored 12 wide, 8 high: turned, the others' 8x12
    oriented(folder / "train" / "top" / "turned.png", stored, 8)
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "bars.h5")]) == 0
    train_split, _ = data.load_dataset(tmp_path / "bars.h5")
    turned = list(np.flatnonzero(train_split.labels == 2))[-1]  # sorted: turned.png after 0-3.png
    assert np.array_equal(train_split.images[turned, :, :, 0], np.rot90(stored, 1))
    images, _, resized, _ = predict.read_images([(folder / "train" / "top" / "turned.png", None)], (12, 8, 1), None)
    assert resized == 0 and np.array_equal(images[0, :, :, 0], np.rot90(stored, 1))


def test_a_size_larger_than_the_memory_is_refused_before_decoding(tmp_path, capsys, monkeypatch):
    from minibp import backend
    folder = make_folder(tmp_path / "bars", splits=(("train", 4), ("test", 2)))
    monkeypatch.setattr(backend, "host_memory", lambda: 8 << 30)
    monkeypatch.setattr(image_files, "decode", lambda *a, **k: pytest.fail("decoded"))
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "out.h5"), "--size", "100000x100000"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "100000x100000" in line and "18 images" in line and "more than the 8.00 GiB" in line and "--size" in line
    assert not (tmp_path / "out.h5").exists()


def test_hidden_folders_are_skipped_by_prepare_and_predict_which_say_so(tmp_path, capsys, trained):
    run, folder = trained
    for hidden in (folder / "train" / ".cache", folder / "test" / "left" / ".thumbnails"):
        hidden.mkdir()
        Image.fromarray(bar("left", np.random.default_rng(0))).save(hidden / "0.png")
    capsys.readouterr()
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "again.h5")]) == 0
    out = capsys.readouterr().out
    assert "left out 2 hidden folder(s) (names that start with '.')" in out and "classes left, right, top" in out
    assert "train (90, 12, 12, 1), test (12, 12, 12, 1)" in out
    assert predict.main([str(run), str(folder / "test")]) == 0
    out = capsys.readouterr().out
    assert "left out 1 hidden folder(s)" in out and "12 images; predicted" in out


def test_linked_class_folders_and_folders_in_them_are_read_by_prepare_and_predict(tmp_path, capsys, trained):
    run, folder = trained
    elsewhere = tmp_path / "elsewhere"
    (folder / "test" / "right").rename(elsewhere)
    (folder / "test" / "right").symlink_to(elsewhere, target_is_directory=True)  # a class folder that is a link
    more = make_folder(tmp_path / "more", classes=("left",), splits=(("test", 3),))
    (folder / "test" / "left" / "more").symlink_to(more / "test" / "left")       # a link inside a class folder
    (folder / "test" / "left" / "loop").symlink_to(folder / "test" / "left")     # a loop: read once
    capsys.readouterr()
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "linked.h5")]) == 0
    assert "test (15, 12, 12, 1)" in capsys.readouterr().out
    assert predict.main([str(run), str(folder / "test")]) == 0
    out = capsys.readouterr().out
    assert "15 images; predicted" in out and "accuracy" in out


def test_predict_says_why_class_folders_give_no_accuracy(trained, tmp_path, capsys):
    run, folder = trained
    (folder / "test" / "right").rename(folder / "test" / "sideways")
    (folder / "test" / "top").rename(folder / "test" / "upwards")
    capsys.readouterr()
    assert predict.main([str(run), str(folder / "test")]) == 0
    out = capsys.readouterr().out
    assert "no accuracy: folder classes sideways, upwards are not the run's (left, right, top)" in out
    Image.fromarray(bar("left", np.random.default_rng(0))).save(folder / "test" / "loose.png")
    (folder / "test" / "sideways").rename(folder / "test" / "right")
    (folder / "test" / "upwards").rename(folder / "test" / "top")
    assert predict.main([str(run), str(folder / "test")]) == 0
    assert "no accuracy: 1 of the 13 images lies in no class folder" in capsys.readouterr().out


def wide(tmp_path):
    """A 12 high, 24 wide RGB image, each pixel of its own value: (path, pixels)."""
    pixels = np.random.default_rng(0).integers(0, 256, (12, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "wide.png")
    return tmp_path / "wide.png", pixels


def test_resize_squash_crop_and_pad(tmp_path):
    path, pixels = wide(tmp_path)
    squash = image_files.decode(path, size=(12, 12))
    assert np.array_equal(squash, image_files.decode(path, size=(12, 12), resize="squash"))
    assert np.array_equal(squash, np.asarray(Image.fromarray(pixels).resize((12, 12), Image.Resampling.BILINEAR)))
    assert np.array_equal(image_files.decode(path, size=(12, 12), resize="crop"), pixels[:, 6:18])  # its centre
    pad = image_files.decode(path, size=(12, 12), resize="pad")  # 6 high, 12 wide, on black above and below
    half = np.asarray(Image.fromarray(pixels).resize((12, 6), Image.Resampling.BILINEAR))
    assert not pad[:3].any() and not pad[9:].any() and np.array_equal(pad[3:9], half)
    with pytest.raises(ValueError, match="--resize is squash, crop or pad, got 'fill'"):
        image_files.decode(path, size=(12, 12), resize="fill")


@pytest.mark.parametrize("resize", ["squash", "crop", "pad"])
def test_pillow_alone_resizes_as_predict_does(tmp_path, resize):
    """The recipe docs/using.md gives for the ONNX graph's images, with Pillow alone."""
    from PIL import ImageOps
    path, _ = wide(tmp_path)
    oriented(tmp_path / "turned.jpg", np.asarray(Image.open(path)), 6)
    for file in (path, tmp_path / "turned.jpg"):
        H, W = 10, 14
        image = ImageOps.exif_transpose(Image.open(file)).convert("RGB")  # "L" for a run on grey images
        if resize == "squash":
            image = image.resize((W, H), Image.Resampling.BILINEAR)
        elif resize == "crop":
            image = ImageOps.fit(image, (W, H), Image.Resampling.BILINEAR)
        else:
            image = ImageOps.pad(image, (W, H), Image.Resampling.BILINEAR, color=0)
        assert np.array_equal(np.asarray(image), image_files.decode(file, size=(H, W), resize=resize))


def test_prepare_says_how_it_resized_and_records_it_for_predict(tmp_path, capsys):
    folder = make_folder(tmp_path / "bars", splits=(("train", 30), ("test", 4)))
    Image.fromarray(np.full((12, 24), 90, np.uint8)).save(folder / "train" / "top" / "wide.png")
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "squash.h5"), "--size", "12x12"]) == 0
    out = capsys.readouterr().out
    assert "resized to 12x12 (H x W) by squash (the default" in out.splitlines()[0]
    assert "resized 1 of 103 images to 12x12 (H x W) by squash" in out
    assert data.resize_mode(tmp_path / "squash.h5") == "squash"
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "bars.h5"), "--size", "12x12",
                         "--resize", "crop"]) == 0
    out = capsys.readouterr().out
    assert "by crop" in out.splitlines()[0] and "resized 1 of 103 images to 12x12 (H x W) by crop" in out
    train_split, _ = data.load_dataset(tmp_path / "bars.h5")
    assert (train_split.images[train_split.labels == 2] == 90).all(axis=(1, 2, 3)).sum() == 1
    assert prepare.main(["folder", str(folder), "--out", str(tmp_path / "x.h5"), "--resize", "crop"]) == 2
    assert "--resize needs --size" in one_line_error(capsys.readouterr().err)
    assert train.main(["--data-file", str(tmp_path / "bars.h5"), "--model", "resnet11", "--batch", "15",
                       "--iters", "2", "--lr-schedule", "0:0.05", "--out", str(tmp_path / "run")]) == 0
    path, _ = wide(tmp_path)
    capsys.readouterr()
    assert predict.main([str(tmp_path / "run"), str(path)]) == 0
    assert "resized 1 of 1 images to the run's 12x12 (H x W) by crop (as its data file's were)" in \
        capsys.readouterr().out
    (tmp_path / "bars.h5").unlink()  # the data file gone: the run's checkpoint says how its images were resized
    assert predict.main([str(tmp_path / "run"), str(path)]) == 0
    assert "by crop (as its data file's were)" in capsys.readouterr().out
    for name in ("checkpoint.h5", "best.h5"):  # a checkpoint from before it kept that, without the data file
        with h5py.File(tmp_path / "run" / name, "r+") as f:
            facts = json.loads(f.attrs["data"])
            del facts["resize"]
            f.attrs["data"] = json.dumps(facts)
            f.attrs["attrs_sha256"] = checkpoint.attrs_sha256(f.attrs)
    assert predict.main([str(tmp_path / "run"), str(path)]) == 0
    assert f"by squash (the default: the run's data file {tmp_path / 'bars.h5'}, which says how its images were " \
           "resized, is gone or changed)" in capsys.readouterr().out
