"""A run's data, as its configuration names it: the training split it draws batches from, the split it
validates on, the test split, and the preprocessing every image goes through (the trainer, evaluate, and
minibp.load's predictions share it, so a run is never fed images prepared another way).

    run_data = load(config)          # RunData: train, val, test, mean, batches, input_shape, path, validates_on
    print(run_data.validates_on)     # "the data file's val split", "5% of the training split, held out", ...

Validation reads, in this order: a held-out fraction of the training split (--val-split, data.hold_out: the
same images every time, never trained on), which the header and a warning say where the data file has a val
split of its own; the data file's own val split (data.write(..., val=...)); else the test split, as the
paper's recipe does, and the header says so.
"""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io import data, imagenet
from ..io.batches import Batches, parse_augment


@dataclass
class RunData:
    train: object        # data.Split (its held-out part removed) or imagenet.Folder
    val: object          # the split validations read
    test: object         # the test split (ImageNet: its val/ folder)
    mean: np.ndarray     # (H, W, C) float32: the training images' mean, subtracted from every image; None: ImageNet
    batches: object      # Batches or imagenet.Batches over train
    input_shape: tuple   # (H, W, C) the net takes
    path: Path           # the data file (ImageNet: its folder)
    validates_on: str    # the validation split, in the header's words

    def split(self, name):
        """The split evaluate names: train, val or test."""
        return {"train": self.train, "val": self.val, "test": self.test}[name]


def load(config, *, batches=True):
    """The RunData of a checked configuration; batches=False: no batch stream (evaluate, predict)."""
    if config.imagenet:
        train, test = imagenet.load_folders(config.data_dir)
        stream = imagenet.Batches(train, batch=config.batch, size=config.image_size, augment=config.augment != "none",
                                  seed=config.seed, workers=config.workers) if batches else None
        size = config.image_size
        return RunData(train, test, test, None, stream, (size, size, 3), train.root, "the val/ folder")
    path = config.data_path()
    train, test = data.load_dataset(path)
    if config.val_split is not None:
        train, val = data.hold_out(train, config.val_split)
        validates_on = f"{config.val_split:g} of the training split ({len(val.labels):,} images), held out"
        if data.has_split(path, "val"):  # never in silence: the header says it, and a warning does
            validates_on += ", instead of the data file's own val split (--val-split overrides it)"
    elif data.has_split(path, "val"):
        val, validates_on = data.load_split(path, "val"), "the data file's val split"
    else:
        val, validates_on = test, ("the test split: the data has no val split (--val-split FRACTION holds one "
                                   "out of the training split)")
    mean = train.pixel_mean()
    stream = Batches(train, batch=config.batch, mean=mean, augment=parse_augment(config.augment),
                          seed=config.seed) if batches else None
    return RunData(train, val, test, mean, stream, train.images.shape[1:], path, validates_on)
