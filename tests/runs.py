"""What the tests that run minibp as a person would share: small data on disk (an HDF5 data set, an ImageNet
folder tree), the trainer's command line, what it prints and writes, and the processes it starts."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np

from minibp.io import data
from minibp.run.checkpoint import attrs_sha256

ROOT = Path(__file__).resolve().parent.parent
COLORS = np.array([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40]])  # a colour a class (make_tree)


def make_dataset(directory, name="cifar10", *, n_train=256, n_test=64, n_val=0, shape=(8, 8, 3), classes=4, seed=0):
    """A learnable data set: each class has its own mean image, plus noise."""
    rng = np.random.default_rng(seed)
    prototypes = rng.integers(40, 216, (classes,) + shape)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.h5"
    with h5py.File(path, "w") as f:  # by hand, as the format's page says a file may be written
        root, checksums = dict(name=name, classes=classes), {}
        for split, n in (("train", n_train), ("test", n_test)) + ((("val", n_val),) if n_val else ()):
            labels = rng.integers(0, classes, n)
            images = np.clip(prototypes[labels] + rng.normal(0, 25, (n,) + shape), 0, 255).astype(np.uint8)
            f.create_dataset(f"{split}/images", data=images)
            f.create_dataset(f"{split}/labels", data=labels)
            checksums[split] = data.split_checksums(images, labels)
            f[split].attrs.update(checksums[split])
        f.attrs.update(root, sha256=data.root_sha256(root, checksums))
    return path


def make_tree(root, *, train=12, val=4, seed=0):
    """ImageNet's layout with 4 classes: JPEGs of 40-90 px a side, each its class's colour plus noise."""
    from PIL import Image  # (Pillow: the imagenet extra)

    rng = np.random.default_rng(seed)
    for split, count in (("train", train), ("val", val)):
        for label, color in enumerate(COLORS):
            folder = Path(root) / split / f"n{label:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                height, width = rng.integers(40, 91, 2)
                pixels = np.clip(color + rng.normal(0, 30, (height, width, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"n{label:08d}_{i}.JPEG", quality=90)
    return Path(root)


def base_args(tmp_path, out="run", **overrides):
    options = dict(data="cifar10", data_dir=str(tmp_path / "data"), model="resnet11", batch=16, iters=6,
                   lr_schedule="0:0.05", log_every=2, val_every=3, checkpoint_every=3, out=str(tmp_path / out))
    options.update(overrides)
    argv = []
    for key, value in options.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def read_metrics(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def untimed(record):
    """A metrics record less its wall-clock time, which no two runs share."""
    return {k: v for k, v in record.items() if k != "time"}


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


def running(pid):
    """True while pid is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def wait_gone(pids, seconds=30):  # (generous: CI machines can be loaded)
    deadline = time.time() + seconds
    while time.time() < deadline and any(running(p) for p in pids):
        time.sleep(0.05)
    return not any(running(p) for p in pids)


def bar(direction, rng, size=(12, 12)):
    """A bright bar at the left or the right (mirror images: only orientation tells them apart), or the top."""
    image = rng.integers(0, 60, size).astype(np.uint8)
    where = dict(left=np.s_[:, :3], right=np.s_[:, -3:], top=np.s_[:3, :])[direction]
    image[where] += 150
    return image


def make_folder(root, *, classes=("left", "right", "top"), splits=(("train", 20), ("val", 6), ("test", 6)),
                size=(12, 12), seed=0):
    """The common layout of grey PNGs, `count` images a class in each split."""
    from PIL import Image  # (the tests that draw folders skip themselves without Pillow)
    rng = np.random.default_rng(seed)
    for split, count in splits:
        for direction in classes:
            folder = root / split / direction
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                Image.fromarray(bar(direction, rng, size)).save(folder / f"{i}.png")
    return root


def set_attrs(f, **attrs):
    """Change attributes and their checksum, as a hand-made checkpoint would: only the content checks remain."""
    f.attrs.update(attrs)
    f.attrs["attrs_sha256"] = attrs_sha256(f.attrs)


def make_file(path, *, n_train=6, n_test=4, classes=5):
    """A file written by data.write, with random 8x8x3 images and labels."""
    rng = np.random.default_rng(0)
    splits = {split: (rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), rng.integers(0, classes, n))
              for split, n in (("train", n_train), ("test", n_test))}
    return data.write(path, **splits, classes=classes)
