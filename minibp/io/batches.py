"""A split dealt out in batches: shuffled every epoch, augmented, normalised (the prepared files are data.py's).

    batches = Batches(train, batch=128, mean=train.pixel_mean(), augment=("crop", "flip"), seed=0)
    images, labels = batches.next()                     # float32 NHWC on the active device, int64 labels
    for images, labels in evaluation_batches(test, batch=500, mean=mean): ...   # in order, unaugmented

Augmentation is chosen transform by transform (AUGMENTS, in the order applied; parse_augment reads
"crop,flip" or "none"). On the image scaled to [0, 1], before the mean image is subtracted: resized-crop, a
box of a random 35-100% of the image's area (RESIZED_AREA) and width/height in [3/4, 4/3] (RESIZED_RATIO,
log-uniform), at a random place, resized back to H x W bilinearly; jitter, brightness, contrast and (RGB only)
saturation each by a random factor in [0.8, 1.2] (JITTER). After it: crop, the reference's zero-pad of 4
pixels (so the pad is the mean image) and a random window of the original size; shift, a move by a random
whole number of pixels up to a tenth of each side (SHIFT; at least 1), zero-filled as crop is; flip,
horizontally with probability 1/2. The order and the augmentation come from one seeded generator whose state
is part of `state()`, so a resumed run sees exactly the batches an uninterrupted one would.
"""
import json

import numpy as np

from .. import backend

# the transforms, in the order they are drawn and applied: the first two on the image in [0, 1], the rest after
# the mean is subtracted (their zero fill is the mean image)
AUGMENTS = ("resized-crop", "jitter", "crop", "shift", "flip")
BUILT_IN = ("crop", "flip")        # the paper's (Batches' augment=True), and all ImageNet's reader does
RESIZED_AREA = (0.35, 1.0)         # resized-crop's share of the image's area: a small image has little to lose
RESIZED_RATIO = (3 / 4, 4 / 3)     # ... and its box's width / height
JITTER = (0.8, 1.2)                # jitter's range of each factor: brightness, contrast, saturation
GREY = np.array([0.299, 0.587, 0.114], np.float32)  # an RGB pixel's grey (luma, ITU-R BT.601): saturation's 0
SHIFT = 0.1                        # shift's largest move, a share of each side


def parse_augment(text):
    """'crop,flip', 'flip,jitter', 'none' -> the transforms, in AUGMENTS' order; a ValueError naming the choices."""
    words = [] if text == "none" else str(text).split(",")
    unknown = [w for w in words if w not in AUGMENTS]
    if unknown or len(set(words)) != len(words) or (not words and text != "none"):
        raise ValueError(f"--augment is none or a comma-separated list of {', '.join(AUGMENTS)}, got {text!r}")
    return tuple(a for a in AUGMENTS if a in words)


def augment_text(transforms):
    """The transforms as --augment writes them: 'crop,flip', 'none'."""
    return ",".join(transforms) or "none"


class Batches:
    """Endless batches of a split: reshuffled every epoch, augmented, normalised."""

    def __init__(self, split, *, batch, mean, augment, seed, shuffle=True):
        """augment: the transforms (a tuple of AUGMENTS' names; True: BUILT_IN, crop and flip; False or ():
        none)."""
        if not 1 <= batch <= len(split.images):
            raise ValueError(f"batch {batch} must be between 1 and the split's {len(split.images)} images")
        augment = BUILT_IN if augment is True else () if augment is False else tuple(augment)
        if any(a not in AUGMENTS for a in augment):
            raise ValueError(f"augment takes {', '.join(AUGMENTS)}, got {augment}")
        self.split, self.batch, self.augment, self.shuffle = split, int(batch), augment, shuffle
        self.mean = np.asarray(mean, np.float32)  # (H, W, C)
        self.rng = np.random.default_rng(seed)
        self.epoch, self.position = 0, 0
        self.order = self._new_order()
        H, W, C = split.images.shape[1:]
        self.out = np.empty((batch, H, W, C), np.float32)              # (B, H, W, C) the batch handed out
        self.padded = {}   # (rows, columns) of zero border: (B, H + 2 rows, W + 2 columns, C), only its middle written
        self.shift = tuple(min(max(1, round(SHIFT * side)), side - 1) for side in (H, W))  # shift's most, per axis

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
        # Each transform draws from self.rng only when it is on, in AUGMENTS' order: crop and flip draw as they
        # always have, so a run from before the others resumes onto the same batches.
        on, B = self.augment, self.batch
        if "resized-crop" in on:
            out[...] = resized_crops(out, self.rng.random((B, 4)))
        # jitter acts on light, before the mean goes: scaling x - mean would change the contrast about the mean
        # image, not the brightness, and [0, 1], where it clips, is the range of light a pixel holds
        if "jitter" in on:
            jitter(out, self.rng.uniform(*JITTER, size=(B, 3)))
        out -= self.mean
        if "crop" in on:
            windows(self._bordered(out, 4, 4), self.rng.integers(0, 9, size=(B, 2)), out=out)
        if "shift" in on:  # a move of (dy, dx): the window that starts (dy, dx) before the border's corner
            most = np.array(self.shift)
            windows(self._bordered(out, *self.shift), most - self.rng.integers(-most, most + 1, size=(B, 2)), out=out)
        if "flip" in on:
            flips = self.rng.random(B) < 0.5
            out[flips] = out[flips, :, ::-1]
        return backend.xp.asarray(out), self.split.labels[index]

    def _bordered(self, images, rows, columns):
        """images (B, H, W, C) inside a zero border of `rows` and `columns` pixels (a buffer kept per border)."""
        B, H, W, C = images.shape
        if (rows, columns) not in self.padded:
            self.padded[rows, columns] = np.zeros((B, H + 2 * rows, W + 2 * columns, C), np.float32)
        padded = self.padded[rows, columns]
        padded[:, rows:rows + H, columns:columns + W] = images
        return padded

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


def windows(padded, starts, *, out):
    """out (B, H, W, C) set to each image of padded (B, H', W', C)'s H x W window from its starts (B, 2), its
    first row and column. (A loop of slices: copies of whole rows, ten times faster than NumPy's gather.)"""
    H, W = out.shape[1:3]
    for image, window, (row, column) in zip(out, padded, starts.tolist()):
        image[...] = window[row:row + H, column:column + W]


def resized_crops(images, draws):
    """(B, H, W, C) float32: of each of images (B, H, W, C) a box resized back to H x W bilinearly. draws (B, 4),
    uniform in [0, 1), place it: its area a share of the image's in RESIZED_AREA, its width / height in
    RESIZED_RATIO (log-uniform, as scale is), a side longer than the image's cut to it, then its top and left
    anywhere that keeps it inside. Output pixel i reads at top + (i + 0.5) h / H - 0.5 (pixel centres)."""
    B, H, W, _ = images.shape
    (small, large), (narrow, wide) = RESIZED_AREA, RESIZED_RATIO
    area = (small + (large - small) * draws[:, 0]) * H * W
    ratio = np.exp(np.log(narrow) + np.log(wide / narrow) * draws[:, 1])
    height, width = np.minimum(np.sqrt(area / ratio), H), np.minimum(np.sqrt(area * ratio), W)
    rows = _resampled_rows(images, draws[:, 2] * (H - height), height)
    # the columns as rows of the transposed images: whole rows are gathered several times faster than pixels
    columns = _resampled_rows(np.ascontiguousarray(rows.transpose(0, 2, 1, 3)), draws[:, 3] * (W - width), width)
    return columns.transpose(0, 2, 1, 3)


def _resampled_rows(images, start, length):
    """images (B, H, ...) resampled along their rows from each image's stretch [start, start + length) to H
    rows: linearly between the two nearest rows, clamped at the edges. A constant stays exactly constant
    (a + w (b - a))."""
    B, size = images.shape[:2]
    at = np.clip(start[:, None] + (np.arange(size) + 0.5) * (length / size)[:, None] - 0.5, 0, size - 1)
    low = np.floor(at).astype(np.int64)  # (B, H)
    weight = (at - low).astype(np.float32).reshape((B, size) + (1,) * (images.ndim - 2))
    flat, first = images.reshape(B * size, -1), (np.arange(B) * size)[:, None]  # row r of image b: b H + r
    a, b = (np.take(flat, (first + rows).ravel(), axis=0).reshape(images.shape)
            for rows in (low, np.minimum(low + 1, size - 1)))
    return a + weight * (b - a)


def jitter(images, factors):
    """Jitter images (B, H, W, C) in [0, 1] in place by factors (B, 3): brightness (scaled by the first), then
    contrast (moved from the image's mean grey by the second), then saturation (from each pixel's grey by the
    third: RGB only; other channel counts take brightness and contrast, their grey the channels' mean), each
    clipped to [0, 1], the range of light a pixel holds."""
    brightness, contrast, saturation = (factors[:, k].astype(np.float32).reshape(-1, 1, 1, 1) for k in range(3))
    images *= brightness
    np.clip(images, 0, 1, out=images)
    _scale_about(images, _grey(images).mean(axis=(1, 2, 3), keepdims=True), contrast)
    if images.shape[3] == 3:
        _scale_about(images, _grey(images), saturation)


def _grey(images):
    """(B, H, W, 1): each pixel's grey, GREY's luma of RGB, else the mean of its channels."""
    return images @ GREY[:, None] if images.shape[3] == 3 else images.mean(axis=3, keepdims=True)


def _scale_about(images, centre, factor):
    """images moved from centre by factor, in place, then clipped to [0, 1]."""
    images -= centre
    images *= factor
    images += centre
    np.clip(images, 0, 1, out=images)


def evaluation_batches(split, *, batch, mean):
    """(images, labels) of the whole split in order, in batches of at most `batch`, normalised."""
    for start in range(0, len(split.images), batch):
        images = split.images[start:start + batch].astype(np.float32) * np.float32(1 / 255) - mean
        yield backend.xp.asarray(images), split.labels[start:start + batch]
