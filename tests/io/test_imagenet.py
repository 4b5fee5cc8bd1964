"""ImageNet: the streaming JPEG reader on a small tree generated here, and the trainer on that tree at reduced
resolution. (The bottleneck ResNets: tests/test_models.py; the decoding processes: test_workers.py.)"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from minibp import evaluate, models, train
from minibp.run import checkpoint
from minibp.io import imagenet
from conftest import host
from nets import tiny_resnet
from runs import COLORS, ROOT, read_metrics, wait_gone


# ----------------------------------------------------------------------------- the listing

def test_the_listing_gives_sorted_classes_and_leaves_out_other_files(tree, capsys):
    (tree / "train" / "n00000001" / "notes.txt").write_text("not an image")
    (tree / "train" / ".cache").mkdir()
    train_split, val = imagenet.load_folders(tree)
    assert train_split.class_names == val.class_names == tuple(f"n{i:08d}" for i in range(4))
    assert (len(train_split), len(val), train_split.classes) == (48, 16, 4)
    for folder in (train_split, val):
        folders = [f.decode().split("/")[0] for f in folder.files]
        assert folders == [folder.class_names[label] for label in folder.labels]
    assert "left out 1 entries that are not image files (named otherwise, folders or broken links: " \
        "n00000001/notes.txt)" in capsys.readouterr().err


def test_broken_links_and_folders_named_as_images_are_left_out_with_a_warning(tree, capsys):
    (tree / "train" / "n00000001" / "gone.JPEG").symlink_to(tree / "nowhere.JPEG")
    (tree / "train" / "n00000002" / "x.JPEG").mkdir()
    (tree / "train" / "n00000003" / "linked.JPEG").symlink_to(tree / "train" / "n00000003" / "n00000003_0.JPEG")
    train_split, _ = imagenet.load_folders(tree)
    assert len(train_split) == 49  # the link to an image is one
    assert "left out 2 entries that are not image files (named otherwise, folders or broken links: " \
        "n00000001/gone.JPEG, n00000002/x.JPEG)" in capsys.readouterr().err


@pytest.mark.parametrize("damage,error,match", [
    (lambda t: t / "nothing", FileNotFoundError, "no ImageNet folder"),
    (lambda t: (os.rename(t / "val", t / "valid"), t)[1], FileNotFoundError, "no val/ folder"),
    (lambda t: ((t / "val" / "n99999999").mkdir(), t)[1], ValueError, "is not one of the 4 classes of train/"),
    (lambda t: ((t / "train" / "n99999999").mkdir(), t)[1], ValueError, "n99999999 holds no images"),
])
def test_a_broken_layout_is_a_clear_error(tree, damage, error, match):
    with pytest.raises(error, match=match):
        imagenet.load_folders(damage(tree))


# ----------------------------------------------------------------------------- decoding

def test_the_training_crop_is_the_drawn_box_resized_then_maybe_flipped(tmp_path):
    path = tmp_path / "a.png"  # lossless and small: no DCT-scaled decoding, exact comparison
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (60, 90, 3), dtype=np.uint8)).save(path)
    flips = 0
    for position in range(40):
        rng = np.random.default_rng((7, 1, 3, position))
        box = imagenet.crop_box(90, 60, rng)
        flip = rng.random() < 0.5
        expected = Image.open(path).convert("RGB").resize((32, 32), Image.Resampling.BILINEAR, box=box)
        expected = np.asarray(expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else expected)
        assert np.array_equal(imagenet.decode(path, 32, (7, 3, position)), expected)
        flips += flip
    assert 8 <= flips <= 32


def test_random_resized_crops_keep_to_the_area_and_aspect_ranges():
    rng = np.random.default_rng(0)
    for width, height in ((500, 375), (90, 40), (40, 90)):
        for _ in range(500):
            left, top, right, bottom = imagenet.crop_box(width, height, rng)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            w, h = right - left, bottom - top  # (up to the rounding of w and h)
            assert 0.07 <= w * h / (width * height) <= 1 and abs(np.log(w / h)) <= np.log(4 / 3) + 1 / min(w, h)
    assert imagenet.crop_box(1000, 10, rng) == (493, 0, 506, 10)  # no try fits: the central 4:3 crop


def torchvision_center_crop(image, size):
    """Resize(round(size*256/224)) then CenterCrop(size), in torchvision's integer arithmetic, with Pillow."""
    short = round(size * 256 / 224)
    width, height = image.size
    resized = image.resize((short, int(short * height / width)) if width <= height else
                           (int(short * width / height), short), Image.Resampling.BILINEAR)
    left, top = round((resized.width - size) / 2), round((resized.height - size) / 2)
    return np.asarray(resized.crop((left, top, left + size, top + size)), np.float64)


def test_evaluation_crops_are_torchvisions_and_draft_decoding_matches_full_decoding(tmp_path):
    rng = np.random.default_rng(2)
    coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
    for width, height in ((640, 480), (300, 451)):
        picture = Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)
        picture.save(tmp_path / "a.png")
        picture.save(tmp_path / "a.JPEG", quality=95)
        expected = torchvision_center_crop(picture, 64)
        assert np.abs(imagenet.decode(tmp_path / "a.png", 64, None) - expected).max() <= 1  # lossless, full size
        full = torchvision_center_crop(Image.open(tmp_path / "a.JPEG").convert("RGB"), 64)
        drafted = imagenet.decode(tmp_path / "a.JPEG", 64, None)  # decoded at 1/4 scale (Image.draft)
        assert np.abs(drafted - full).mean() < 1.0


def test_an_undecodable_file_is_named(tree):
    bad = tree / "train" / "n00000002" / "n00000002_5.JPEG"
    bad.write_bytes(b"not a JPEG at all")
    train_split, val = imagenet.load_folders(tree)
    with imagenet.Batches(train_split, batch=48, size=32, workers=2) as batches:
        with pytest.raises(ValueError, match=f"{bad}: cannot decode it as an image"):
            batches.next()
    (tree / "val" / "n00000000" / "n00000000_1.JPEG").write_bytes(b"")
    with pytest.raises(ValueError, match="n00000000_1.JPEG: cannot decode it as an image"):
        list(imagenet.evaluation_batches(val, batch=4, size=32, workers=1))


# ----------------------------------------------------------------------------- batches

def normalised(pixels):
    return (pixels / np.float32(255) - np.array(imagenet.MEAN, np.float32)) / np.array(imagenet.STD, np.float32)


def test_batches_are_the_decoded_crops_normalised_and_labelled(tree):
    train_split, _ = imagenet.load_folders(tree)
    with imagenet.Batches(train_split, batch=8, size=32, seed=3, workers=2) as batches:
        for _ in range(7):  # into the second epoch (6 batches an epoch)
            images, labels = batches.next()
            positions = range(batches.position - 8, batches.position)
            files = train_split.files[batches.order[list(positions)]]
            assert np.array_equal(labels, train_split.labels[batches.order[list(positions)]])
            expected = np.stack([imagenet.decode(tree / "train" / f.decode(), 32, (3, batches.epoch, p))
                                 for f, p in zip(files, positions)])
            assert images.shape == (8, 32, 32, 3) and images.dtype == np.float32
            assert np.allclose(host(images), normalised(expected), atol=1e-5)
        assert batches.epoch == 1 and not np.array_equal(batches.order, imagenet.epoch_order(3, 0, 48))
    means = [np.asarray(Image.open(tree / "train" / f.decode())).mean(axis=(0, 1)) for f in train_split.files]
    assert all(np.abs(m - COLORS[label]).max() < 20 for m, label in zip(means, train_split.labels))


def test_the_stream_resumes_from_a_checkpoint_whatever_the_workers(tree, tmp_path):
    train_split, _ = imagenet.load_folders(tree)
    with imagenet.Batches(train_split, batch=10, size=32, seed=1, workers=2) as straight:
        taken = [straight.next() for _ in range(3)]
        state = straight.state()
        rest = [straight.next() for _ in range(5)]  # 4 batches an epoch: across the epoch's end
    net = tiny_resnet(classes=4).compile(pass_images=2, bits="4")
    checkpoint.save(tmp_path / "c.h5", net, iteration=3, config={}, data_state=state)  # the fields it checks
    saved = checkpoint.load(tmp_path / "c.h5").data_state
    with imagenet.Batches(train_split, batch=10, size=32, seed=1, workers=1) as resumed:
        resumed.next()  # batches decoded ahead of the restored position are dropped
        resumed.restore(saved)
        again = [resumed.next() for _ in range(5)]
    assert len(taken) == 3 and resumed.epoch == 1
    for (a, la), (b, lb) in zip(rest, again):
        assert np.array_equal(host(a), host(b)) and np.array_equal(la, lb)


def test_restore_refuses_another_listing_seed_or_reader(tree):
    train_split, _ = imagenet.load_folders(tree)
    state = imagenet.Batches(train_split, batch=8, seed=0, workers=1).state()
    with pytest.raises(ValueError, match="another seed"):
        imagenet.Batches(train_split, batch=8, seed=1, workers=1).restore(state)
    hdf5_state = dict(state, rng=json.dumps(np.random.default_rng(0).bit_generator.state))
    with pytest.raises(ValueError, match="not an ImageNet reader's"):
        imagenet.Batches(train_split, batch=8, seed=0, workers=1).restore(hdf5_state)
    os.rename(tree / "train" / "n00000000" / "n00000000_0.JPEG", tree / "train" / "n00000000" / "renamed.JPEG")
    moved, _ = imagenet.load_folders(tree)
    with pytest.raises(ValueError, match="images were added, removed or renamed"):
        imagenet.Batches(moved, batch=8, seed=0, workers=1).restore(state)


def test_evaluation_batches_cover_the_split_in_order(tree):
    _, val = imagenet.load_folders(tree)
    got = list(imagenet.evaluation_batches(val, batch=6, size=32, workers=2))
    assert [len(labels) for _, labels in got] == [6, 6, 4]
    assert np.array_equal(np.concatenate([labels for _, labels in got]), val.labels)
    expected = np.stack([imagenet.decode(tree / "val" / f.decode(), 32, None) for f in val.files])
    assert np.allclose(np.concatenate([host(images) for images, _ in got]), normalised(expected), atol=1e-5)


# ----------------------------------------------------------------------------- the trainer


def imagenet_args(tree, out, **overrides):
    options = dict(data="imagenet", data_dir=str(tree), model="resnet50", image_size=32, batch=8, iters=2,
                   lr_schedule="0:0.01", log_every=1, val_every=2, checkpoint_every=2, workers=2, out=str(out))
    options.update(overrides)
    return [f"--{key.replace('_', '-')}={value}" for key, value in options.items()]


@pytest.mark.slow
def test_resnet50_trains_on_the_tree_at_32_pixels(tree, tmp_path, capsys):
    assert train.main(imagenet_args(tree, tmp_path / "run")) == 0
    records = read_metrics(tmp_path / "run")
    assert [r["kind"] for r in records] == ["train", "train", "val"]
    assert all(np.isfinite(r["loss"]) for r in records)
    assert "resnet50 (50 units, 23,508,548 parameters) on imagenet (48 training images)" in capsys.readouterr().out
    config = checkpoint.load(tmp_path / "run" / "checkpoint.h5").config
    assert (config["data"], config["image_size"], config["weight_decay"]) == ("imagenet", 32, 1e-4)


@pytest.fixture
def tiny_family(monkeypatch):
    """'resnet50' shrunk to one block a stage and widths of 8: the same builder, seconds to train."""
    monkeypatch.setattr(models, "IMAGENET_BLOCKS", {50: (1, 1, 1, 1)})
    monkeypatch.setattr(models, "IMAGENET_WIDTHS", (8, 8, 8, 8))


@pytest.mark.slow
def test_an_imagenet_run_learns_resumes_bit_identically_and_evaluates(tree, tmp_path, tiny_family, capsys):
    # 36 iterations: at 24 the 4-bit store's noise alone could move the 16 validation images across 0.75
    common = dict(iters=36, lr_schedule="0:0.05", log_every=6, val_every=36, checkpoint_every=12)
    assert train.main(imagenet_args(tree, tmp_path / "straight", **common)) == 0
    assert train.main(imagenet_args(tree, tmp_path / "resumed", **dict(common, iters=12))) == 0
    assert train.main(["--out", str(tmp_path / "resumed"), "--resume", "--iters", "36", "--workers", "1"]) == 0
    a, b = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("straight", "resumed"))
    assert a.iteration == b.iteration == 36 and all(np.array_equal(a.state[k], b.state[k]) for k in a.state)
    validation = [r for r in read_metrics(tmp_path / "straight") if r["kind"] == "val"]
    assert validation[-1]["accuracy"] >= 0.75  # each class has its colour: chance is 0.25
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "straight"), "--json", "--workers", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == validation[-1]["accuracy"]


def test_a_tree_whose_classes_were_renamed_is_refused_by_resume_and_evaluate(tree, tmp_path, tiny_family, capsys):
    """n00000000 renamed n00000009 (as many classes): every label would shift by one, silently."""
    assert train.main(imagenet_args(tree, tmp_path / "run", workers=1)) == 0
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").class_names == tuple(f"n{i:08d}" for i in range(4))
    for split in ("train", "val"):
        os.rename(tree / split / "n00000000", tree / split / "n00000009")
    capsys.readouterr()
    expected = "label 0 is 'n00000000' in the run and 'n00000001' there (4 classes against 4)"
    assert evaluate.main([str(tmp_path / "run"), "--workers", "1"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"error: {tree / 'train'} does not hold the classes") and expected in line
    assert "\n" not in line
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize("overrides,match", [
    (dict(model="resnet164"), "not an ImageNet ResNet"),
    (dict(image_size=32000), "too large for this machine (input 32000x32000x3, 4 classes)"),
    (dict(data="cifar10", model="resnet50"), "needs ImageNet data, --data imagenet"),
    (dict(image_size=40), "multiple of 32"),
    (dict(data="cifar10", model="resnet11"), "--image-size applies to --data imagenet only"),
    (dict(workers=0), "--workers must be a positive integer, got 0"),
    (dict(batch=64), "batch 64 must be between 1 and the 48 images"),
])
def test_bad_imagenet_options_are_clear_errors(tree, tmp_path, capsys, overrides, match):
    assert train.main(imagenet_args(tree, tmp_path / "run", **overrides)) == 2
    assert match in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_saves_and_leaves_no_worker_running(tree, tmp_path):
    run = tmp_path / "run"
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from minibp import models, train; "
            "models.IMAGENET_BLOCKS = {50: (1, 1, 1, 1)}; models.IMAGENET_WIDTHS = (8, 8, 8, 8); "
            "sys.exit(train.main(sys.argv[1:]))")
    argv = imagenet_args(tree, run, iters=100000, val_every=100000, checkpoint_every=100000)
    process = subprocess.Popen([sys.executable, "-c", code] + argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    deadline, workers = time.time() + 60, []
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and
                                          (run / "metrics.jsonl").read_text().count("\n") >= 2):
        time.sleep(0.1)
    for pid in os.listdir("/proc"):  # the trainer's decoding processes
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            if f"PPid:\t{process.pid}\n" in status and "import serve" in Path(f"/proc/{pid}/cmdline").read_text():
                workers.append(int(pid))
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            pass
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 130, output
    assert len(workers) == 2 and wait_gone(workers)
    assert checkpoint.load(run / "checkpoint.h5").iteration >= 2


@pytest.mark.slow
def test_sigterm_while_the_workers_shut_down_is_said_and_loses_nothing(tree, tmp_path):
    # rc 143 and not a word: the trainer had put back the default handler before it stopped the workers
    run = tmp_path / "run"
    code = (f"import os, signal, sys; sys.path.insert(0, {str(ROOT)!r}); from minibp import models, train; "
            "from minibp.io import imagenet; "
            "models.IMAGENET_BLOCKS = {50: (1, 1, 1, 1)}; models.IMAGENET_WIDTHS = (8, 8, 8, 8); "
            "close = imagenet.Batches.close; "
            "imagenet.Batches.close = lambda self: (os.kill(os.getpid(), signal.SIGTERM), close(self)); "
            "sys.exit(train.main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", code] + imagenet_args(tree, run), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SIGTERM while the run shut down" in done.stdout and "nothing is lost" in done.stdout
    assert checkpoint.load(run / "checkpoint.h5").iteration == 2
