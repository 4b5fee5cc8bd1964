"""ImageNet from its standard folder layout, streamed: JPEGs decoded by worker processes (workers.py) into seeded,
resumable batches, with a few batches in memory at a time.

    DIR/train/<class>/*.JPEG            the class folders' sorted names give the labels 0..K-1
    DIR/val/<class>/*.JPEG              the same class names (a subset of them is allowed)

    train, val = load_folders("data/imagenet")            # listings only: nothing is decoded yet
    batches = Batches(train, batch=256, size=224, seed=0, workers=8)
    images, labels = batches.next()     # float32 (256, 224, 224, 3) on the active device, int64 (256,) host
    state = batches.state()             # {epoch, position, order, rng}: what a checkpoint keeps
    batches.restore(state)              # the same batches again, bit for bit, whatever the workers
    for images, labels in evaluation_batches(val, batch=256, size=224, workers=8): ...
    batches.close()                     # stops the workers (so do exit, Ctrl-C and garbage collection)

Training images get torchvision's random-resized crop (8-100% of the area, aspect ratio 3/4-4/3, ten
tries, then the central crop of the clamped ratio) resized to size x size, and a horizontal flip with
probability 1/2; evaluation images the central size x size crop of the image resized to a shorter side
of size*256/224 (256 for 224). Resizing is Pillow's bilinear (antialiased when it shrinks); a JPEG is
decoded at 1/2, 1/4 or 1/8 scale (`Image.draft`) when the crop keeps at least size pixels a side there.
The main process turns the uint8 batch into float32 on the device, (x/255 - mean) / std per channel
with the usual ImageNet statistics.

Order and augmentation are functions of the seed: epoch e's order is a permutation drawn from
(seed, e), and the image at position p of it is cropped and flipped by a generator seeded with
(seed, e, p), so a batch does not depend on which worker decodes it, and `state()` (epoch, position,
the epoch's order) resumes a run exactly. Workers ignore Ctrl-C (the main process handles it and
closes them), exit when the main process dies, and a dead worker or an undecodable file is a one-line
error naming it, never a silently skipped image.
"""
import importlib.util
import itertools
import json
import math
import os
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import extras
from ..integrity import sha256_bytes
from .workers import Pool, default_count

MEAN = (0.485, 0.456, 0.406)   # per-channel mean and std of ImageNet's training images, in [0, 1] units
STD = (0.229, 0.224, 0.225)
EXTENSIONS = (".jpeg", ".jpg", ".png")
READER = "minibp.imagenet"     # marks this reader's data state in a checkpoint: a name, kept when the module
                               # moved to minibp.io.imagenet, so checkpoints read and write as before
LAYOUT = "it must hold train/<class>/*.JPEG and val/<class>/*.JPEG"


# ----------------------------------------------------------------------------- the listing

@dataclass
class Folder:
    """One split's listing: files (N,) paths relative to root (bytes), labels (N,) int64."""
    root: Path
    class_names: tuple
    files: np.ndarray
    labels: np.ndarray
    name: str

    classes = property(lambda self: len(self.class_names))

    def __len__(self):
        return len(self.files)

    def sha256(self):
        """A digest of the class names and the file list: which images a data state's order refers to."""
        return sha256_bytes("\n".join(self.class_names).encode(), b"\0" + b"\n".join(self.files.tolist()))


def load_folders(data_dir):
    """(train, val) Folders of an ImageNet folder, listed once (no image is opened)."""
    if importlib.util.find_spec("PIL") is None:  # the workers decode with it: say so before anything runs
        raise ValueError(extras.missing("imagenet", "the ImageNet reader decodes JPEGs with Pillow"))
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"no ImageNet folder at {data_dir}: {LAYOUT}")
    train = list_split(data_dir, "train")
    return train, list_split(data_dir, "val", class_names=train.class_names)


def list_split(data_dir, split, *, class_names=None):
    """The Folder of data_dir/split: class folders (sorted names -> labels; with class_names, these
    labels, which must hold every folder's name) and their image files (sorted names). Other entries of a
    class folder (files not named as images, folders, broken links) are left out with a warning; a missing
    folder, no classes or an empty training class is a ValueError."""
    root = Path(data_dir) / split
    if not root.is_dir():
        raise FileNotFoundError(f"no {split}/ folder in {data_dir}: {LAYOUT}")
    found = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))  # not hidden
    if not found:
        raise ValueError(f"{root} holds no class folders: {LAYOUT}")
    label_of = {name: i for i, name in enumerate(class_names or found)}
    unknown = [name for name in found if name not in label_of]
    if unknown:
        raise ValueError(f"{root / unknown[0]} is not one of the {len(label_of)} classes of train/ "
                         f"({len(unknown)} such folders)")
    files, labels, ignored = [], [], []
    for name in found:
        entries = sorted((entry.name, entry.is_file()) for entry in os.scandir(root / name))  # is_file: a link's target
        images = [n for n, is_file in entries if is_file and n.lower().endswith(EXTENSIONS)]
        ignored += [f"{name}/{n}" for n, is_file in entries if not (is_file and n.lower().endswith(EXTENSIONS))]
        if not images and split == "train":
            raise ValueError(f"{root / name} holds no images ({', '.join(EXTENSIONS)})")
        files += [os.fsencode(f"{name}/{n}") for n in images]
        labels += [label_of[name]] * len(images)
    if not files:
        raise ValueError(f"{root} holds no images ({', '.join(EXTENSIONS)}) in its class folders")
    if ignored:
        print(f"warning: {root}: left out {len(ignored)} entries that are not image files (named otherwise, folders "
              f"or broken links: {', '.join(ignored[:3])}{', ...' if len(ignored) > 3 else ''})", file=sys.stderr)
    return Folder(root, tuple(class_names or found), np.array(files, dtype=bytes), np.array(labels, np.int64),
                  f"imagenet {split}")


# ----------------------------------------------------------------------------- decoding (in the workers)

def crop_box(width, height, rng):
    """torchvision's RandomResizedCrop box (left, top, right, bottom) of a width x height image."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * ratio)), round(math.sqrt(target / ratio))
        if 0 < w <= width and 0 < h <= height:
            top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            return left, top, left + w, top + h
    ratio = width / height  # ten misses: the central crop of the ratio clamped to [3/4, 4/3]
    w, h = (round(height * 4 / 3), height) if ratio > 4 / 3 else \
        (width, round(width * 4 / 3)) if ratio < 3 / 4 else (width, height)
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def center_box(width, height, size):
    """The box, in the image's pixels, of torchvision's Resize(size*256/224) then CenterCrop(size): the
    same integer sizes and offsets, as one crop-and-resize."""
    short = round(size * 256 / 224)
    resized = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    left, top = (round((side - size) / 2) for side in resized)
    x, y = width / resized[0], height / resized[1]
    return left * x, top * y, (left + size) * x, (top + size) * y


def decode(path, size, key):
    """One image as uint8 (size, size, 3): key (seed, epoch, position) crops and flips it at random;
    key None takes the evaluation crop. Any failure is a ValueError naming the file."""
    from PIL import Image
    try:
        with Image.open(path) as im:
            width, height = im.size
            rng = np.random.default_rng((key[0], 1) + tuple(key[1:])) if key is not None else None
            box = crop_box(width, height, rng) if rng is not None else center_box(width, height, size)
            shrink = min(box[2] - box[0], box[3] - box[1]) / size
            if im.format == "JPEG" and shrink >= 2:  # decode at a DCT scale that keeps >= size pixels
                drafted = im.draft("RGB", (math.ceil(width / shrink), math.ceil(height / shrink)))
                if drafted is not None:
                    scale = drafted[1][2] / width
                    box = tuple(c * scale for c in box)
            out = im.convert("RGB").resize((size, size), Image.Resampling.BILINEAR, box=box)
            if rng is not None and rng.random() < 0.5:
                out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            return np.asarray(out)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # what Pillow raises
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: cannot decode it as an image ({why}); replace the file and start again "
                         "(a run resumes with --resume)") from None


def decode_chunk(root, size, items):
    """(len(items), size, size, 3) uint8 of items [(relative path, key)] under root."""
    out = np.empty((len(items), size, size, 3), np.uint8)
    for i, (path, key) in enumerate(items):
        out[i] = decode(os.path.join(root, os.fsdecode(path)), size, key)
    return out


# ----------------------------------------------------------------------------- the workers

def start_workers(count=None):
    """The pool of image-decoding processes: count of them (None: one a core, less one for the trainer)."""
    count = default_count() if count is None else count
    if count < 1:
        raise ValueError(f"the reader needs at least 1 worker process, got {count}")
    return Pool(count, "minibp.io.imagenet:decode_chunk", what="an image-decoding worker")


def _normalised(images):
    """uint8 (N, H, W, 3) host -> float32 (x/255 - mean) / std on the device."""
    from .. import backend  # here, not at the top: the workers import this module and need no device
    xp = backend.xp
    out = xp.asarray(images).astype(np.float32)
    out *= xp.asarray(1 / (255 * np.array(STD)), np.float32)
    out -= xp.asarray(np.array(MEAN) / np.array(STD), np.float32)
    return out


def _stream(workers, folder, size, batches, *, prefetch):
    """(uint8 batch, info) for each (indices, keys, info) of batches, with at most prefetch batches
    submitted ahead of the one being collected; batches is consumed lazily."""
    pending = deque()

    def fill():
        for indices, keys, info in itertools.islice(batches, prefetch - len(pending)):
            items = list(zip(folder.files[indices].tolist(), keys))
            pending.append((workers.submit(items, str(folder.root), size), info))

    try:
        fill()
        while pending:
            ticket, info = pending.popleft()
            images = workers.collect(ticket)
            fill()  # before handing the batch out: the workers decode while the caller computes
            yield images, info
    finally:
        for ticket, _ in pending:
            workers.discard(ticket)


# ----------------------------------------------------------------------------- batches

def epoch_order(seed, epoch, n):
    """Epoch `epoch`'s order of n training images: a function of (seed, epoch) alone."""
    return np.random.default_rng((seed, 0, epoch)).permutation(n)


class Batches:
    """Endless training batches of a Folder: reshuffled every epoch, augmented (augment=False: the
    evaluation crop), normalised; the ragged end of an epoch is dropped, as Batches does."""

    def __init__(self, folder, *, batch, size=224, augment=True, seed=0, workers=None, prefetch=2):
        if not 1 <= batch <= len(folder):
            raise ValueError(f"batch {batch} must be between 1 and the {len(folder)} images of {folder.root}")
        if size < 8:
            raise ValueError(f"the image size must be at least 8 pixels, got {size}")
        self.folder, self.batch, self.size, self.augment, self.seed = folder, int(batch), int(size), augment, seed
        self.prefetch, self.workers = prefetch, workers if workers is not None else default_count()
        self.epoch, self.position, self.order = 0, 0, epoch_order(seed, 0, len(folder))
        self._listing = folder.sha256()
        self.pool, self._stream = None, None

    def _batches(self, epoch, position, order):
        """(indices, keys, (epoch, position after, order)) of every batch from a point on."""
        while True:
            if position + self.batch > len(order):
                epoch, position, order = epoch + 1, 0, epoch_order(self.seed, epoch + 1, len(order))
            indices = order[position:position + self.batch]
            keys = [(self.seed, epoch, p) if self.augment else None
                    for p in range(position, position + self.batch)]
            position += self.batch
            yield indices, keys, (epoch, position, order)

    def next(self):
        """(images (B, size, size, 3) float32 on the device, labels (B,) int64 on the host)."""
        if self._stream is None:
            if self.pool is None or self.pool.closed:
                self.pool = start_workers(self.workers)
            self._stream = _stream(self.pool, self.folder, self.size,
                                   self._batches(self.epoch, self.position, self.order), prefetch=self.prefetch)
        try:
            images, (epoch, position, order) = next(self._stream)
        except BaseException:  # the stream ended with the error: a later call starts afresh from the state
            self._stream = None
            raise
        start = position - self.batch
        self.epoch, self.position, self.order = epoch, position, order
        return _normalised(images), self.folder.labels[order[start:position]]

    def state(self):
        """{epoch, position, order (N,) int64, rng (JSON)}: the fields Batches gives a checkpoint;
        rng names this reader, the seed and a digest of the listing the order indexes."""
        rng = dict(reader=READER, state=dict(seed=self.seed, listing_sha256=self._listing))
        return dict(epoch=self.epoch, position=self.position, order=self.order.copy(), rng=json.dumps(rng))

    def restore(self, state):
        try:
            rng = json.loads(state["rng"])
        except (TypeError, json.JSONDecodeError):
            rng = None
        if not isinstance(rng, dict) or rng.get("reader") != READER or not isinstance(rng.get("state"), dict):
            raise ValueError("the saved data state is not an ImageNet reader's (a run on another data set?)")
        if rng["state"].get("listing_sha256") != self._listing:
            raise ValueError(f"the saved data order is for another listing of {self.folder.root} than this one "
                             f"({len(self.folder):,} images now): images were added, removed or renamed")
        if rng["state"].get("seed") != self.seed or len(state["order"]) != len(self.folder):
            raise ValueError("the saved data state was drawn with another seed or for another number of images")
        if self._stream is not None:
            self._stream.close()  # the batches decoded ahead belong to the old position
            self._stream = None
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.order = np.asarray(state["order"], np.int64)

    def close(self):
        """Stop the workers (the next next() starts new ones)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if self.pool is not None:
            self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def evaluation_batches(folder, *, batch, size=224, workers=None, prefetch=2):
    """(images, labels) of the whole Folder in order, evaluation-cropped, in batches of at most
    `batch`, normalised; its worker processes stop when the iteration ends or is abandoned."""
    pool = start_workers(workers)
    spans = (np.arange(start, min(start + batch, len(folder))) for start in range(0, len(folder), batch))
    try:
        for images, indices in _stream(pool, folder, size, ((i, [None] * len(i), i) for i in spans),
                                       prefetch=prefetch):
            yield _normalised(images), folder.labels[indices]
    finally:
        pool.close()
