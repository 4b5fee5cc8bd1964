"""Training data: HDF5 files written by datasets/prepare.py, in shuffled, augmented batches.

    train = load_split("data/cifar10.h5", "train")      # Split: uint8 images (N, H, W, C), labels (N,)
    mean = train.pixel_mean()                           # (H, W, C) float32, per-pixel mean in [0, 1]
    batches = Batches(train, batch=128, mean=mean, augment=True, seed=0)
    images, labels = batches.next()                     # float32 NHWC on the active device, int64 labels

Augmentation is the reference's: zero-pad 4 pixels (after mean subtraction, so the pad is the mean
image), crop a random window of the original size, flip horizontally with probability 1/2. The order
and the augmentation come from one seeded generator whose state is part of `state()`, so a resumed
run sees exactly the batches an uninterrupted one would.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from . import backend

PREPARE = "python datasets/prepare.py"
DATASETS = ("cifar10", "cifar100", "fashion-mnist")


@dataclass
class Split:
    images: np.ndarray   # (N, H, W, C) uint8
    labels: np.ndarray   # (N,) int64
    classes: int
    name: str

    def pixel_mean(self):
        """(H, W, C) float32 mean image, in [0, 1] units."""
        total = np.zeros(self.images.shape[1:], np.float64)
        for start in range(0, len(self.images), 4096):
            total += self.images[start:start + 4096].sum(axis=0, dtype=np.float64)
        return (total / (255.0 * len(self.images))).astype(np.float32)


def dataset_path(data_dir, name):
    return Path(data_dir) / f"{name}.h5"


def missing_dataset_message(name, path):
    how = f"{PREPARE} {name} --out {Path(path).parent}"
    if name == "fashion-mnist":
        how = ("apt-get install dataset-fashion-mnist   # Debian/Ubuntu; without it the next line downloads\n  "
               + how)
    return f"no {name} data at {path}. Get it with:\n  {how}"


def load_split(path, split):
    """The train or test split of a prepared HDF5 file, read into memory."""
    path = Path(path)
    if not path.is_file():
        name = path.stem
        raise FileNotFoundError(missing_dataset_message(name, path) if name in DATASETS else f"no data file {path}")
    try:
        with h5py.File(path, "r") as f:
            if split not in f:
                raise ValueError(f"{path} has no '{split}' group (groups: {', '.join(f)})")
            images, labels = f[split]["images"][...], f[split]["labels"][...]
            classes, name = int(f.attrs["classes"]), str(f.attrs.get("name", path.stem))
    except OSError as e:
        raise ValueError(f"{path} is not a readable HDF5 file ({e}); prepare it again with {PREPARE}") from None
    if images.dtype != np.uint8 or images.ndim != 4 or labels.shape != (len(images),):
        raise ValueError(f"{path}:{split} must hold uint8 images (N, H, W, C) and N labels, got {images.dtype} "
                         f"{images.shape} and {labels.shape}")
    return Split(images, labels.astype(np.int64), classes, name)


class Batches:
    """Endless batches of a split: reshuffled every epoch, augmented, normalised."""

    def __init__(self, split, *, batch, mean, augment, seed, shuffle=True):
        if not 1 <= batch <= len(split.images):
            raise ValueError(f"batch {batch} must be between 1 and the split's {len(split.images)} images")
        self.split, self.batch, self.augment, self.shuffle = split, int(batch), augment, shuffle
        self.mean = np.asarray(mean, np.float32)  # (H, W, C)
        self.rng = np.random.default_rng(seed)
        self.epoch, self.position = 0, 0
        self.order = self._new_order()
        H, W, C = split.images.shape[1:]
        self.out = np.empty((batch, H, W, C), np.float32)              # (B, H, W, C) the batch handed out
        self.padded = np.zeros((batch, H + 8, W + 8, C), np.float32)   # (B, H+8, W+8, C) zero-padded copy

    def _new_order(self):
        n = len(self.split.images)
        return self.rng.permutation(n) if self.shuffle else np.arange(n)

    def next(self):
        """(images (B, H, W, C) float32 on the device, labels (B,) int64 on the host)."""
        if self.position + self.batch > len(self.order):  # drop the ragged end of an epoch
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self._new_order()
        index = self.order[self.position:self.position + self.batch]
        self.position += self.batch
        images = self.split.images[index]
        out = self.out
        np.multiply(images, np.float32(1 / 255), out=out)
        out -= self.mean
        if self.augment:
            H, W = out.shape[1:3]
            self.padded[:, 4:4 + H, 4:4 + W] = out
            offsets = self.rng.integers(0, 9, size=(self.batch, 2))
            flips = self.rng.random(self.batch) < 0.5
            for i, ((dy, dx), flip) in enumerate(zip(offsets, flips)):
                window = self.padded[i, dy:dy + H, dx:dx + W]
                out[i] = window[:, ::-1] if flip else window
        return backend.xp.asarray(out), self.split.labels[index]

    def state(self):
        """The position in the stream: {epoch, position, order (N,) int64, rng (the generator state, JSON)}."""
        return dict(epoch=self.epoch, position=self.position, order=self.order.copy(),
                    rng=json.dumps(self.rng.bit_generator.state))

    def restore(self, state):
        if len(state["order"]) != len(self.split.images):
            raise ValueError("the saved data order does not match this data set (another file or split?)")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.order = np.asarray(state["order"], np.int64)
        self.rng.bit_generator.state = json.loads(state["rng"])


def evaluation_batches(split, *, batch, mean):
    """(images, labels) of the whole split in order, in batches of at most `batch`, normalised."""
    for start in range(0, len(split.images), batch):
        images = split.images[start:start + batch].astype(np.float32) * np.float32(1 / 255) - mean
        yield backend.xp.asarray(images), split.labels[start:start + batch]
