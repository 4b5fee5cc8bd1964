"""Batches of a split (io/batches.py): --augment's words, each transform doing what it says, and the same seed giving
the same batches, a resume the uninterrupted ones."""
import json

import numpy as np
import pytest

from conftest import host
from minibp.io import data
from minibp.io.batches import AUGMENTS, Batches, augment_text, parse_augment, resized_crops
from runs import make_file


@pytest.mark.parametrize("text,transforms,written", [
    ("crop,flip", ("crop", "flip"), "crop,flip"), ("flip,crop", ("crop", "flip"), "crop,flip"),
    ("flip", ("flip",), "flip"), ("crop", ("crop",), "crop"), ("none", (), "none"),
    ("flip,shift,jitter,resized-crop", ("resized-crop", "jitter", "shift", "flip"), "resized-crop,jitter,shift,flip")])
def test_augment_names_its_transforms_in_the_order_they_are_applied(text, transforms, written):
    assert parse_augment(text) == transforms and augment_text(transforms) == written


@pytest.mark.parametrize("bad", ["", "crop,crop", "mirror", "none,flip", "crop,", "rotate"])
def test_augment_refuses_what_it_does_not_know(bad):
    with pytest.raises(ValueError, match="--augment is none or a comma-separated list of resized-crop, jitter, crop, "
                                         "shift, flip, got"):
        parse_augment(bad)


def test_each_transform_alone_does_what_it_says(tmp_path):
    train, _ = data.load_dataset(make_file(tmp_path / "cifar10.h5"))
    mean = np.zeros(train.images.shape[1:], np.float32)
    plain = Batches(train, batch=6, mean=mean, augment=(), seed=0, shuffle=False).next()[0]
    flipped = Batches(train, batch=6, mean=mean, augment=("flip",), seed=0, shuffle=False).next()[0]
    for a, b in zip(host(plain), host(flipped)):  # each image as it is or mirrored, nothing else
        assert np.array_equal(a, b) or np.array_equal(a[:, ::-1], b)
    cropped = host(Batches(train, batch=6, mean=mean, augment=("crop",), seed=0, shuffle=False).next()[0])
    assert not np.array_equal(cropped, host(plain))
    both = [host(Batches(train, batch=6, mean=mean, augment=a, seed=3).next()[0])
            for a in (True, ("crop", "flip"))]
    assert np.array_equal(*both)  # True is the paper's two transforms, drawn as before


def images_split(images):
    return data.Split(images, np.zeros(len(images), np.int64), 2, "made")


def batch_of(images, augment, *, mean=None, seed=0):
    """The first batch of all the images, in order: its transforms draw first from default_rng(seed)."""
    mean = np.zeros(images.shape[1:], np.float32) if mean is None else mean
    batches = Batches(images_split(images), batch=len(images), mean=mean, augment=augment, seed=seed,
                           shuffle=False)
    return host(batches.next()[0])


def test_a_resized_crop_of_a_constant_image_is_the_constant_and_of_a_ramp_the_box_it_drew():
    constant = np.full((5, 9, 7, 3), 77, np.uint8)
    assert np.array_equal(batch_of(constant, ("resized-crop",)), batch_of(constant, ()))  # exactly
    # an affine image resamples to itself at the sampled points: y + 10 x + 100 c where pixel i of a box of
    # height h from top reads (clamped to the image) top + (i + 0.5) h / H - 0.5
    H, W = 9, 7
    y, x, c = np.meshgrid(np.arange(H), np.arange(W), np.arange(3), indexing="ij")
    ramp = np.broadcast_to((y + 10 * x + 100 * c).astype(np.float32), (4, H, W, 3))
    draws = np.array([[0.0, 0.0, 0.0, 0.0], [0.99, 0.5, 0.5, 0.5], [0.3, 0.9, 1.0, 0.2], [0.6, 0.1, 0.7, 1.0]])
    area = (0.35 + 0.65 * draws[:, 0]) * H * W  # RESIZED_AREA, and RESIZED_RATIO log-uniform
    ratio = np.exp(np.log(3 / 4) + np.log(16 / 9) * draws[:, 1])
    height, width = np.minimum(np.sqrt(area / ratio), H), np.minimum(np.sqrt(area * ratio), W)
    assert np.all((0.35 * H * W - 1e-9 <= height * width) & (height * width <= H * W))

    def reads(start, length, size):  # (B, size)
        return np.clip(start[:, None] + (np.arange(size) + 0.5) * (length / size)[:, None] - 0.5, 0, size - 1)
    rows, columns = reads(draws[:, 2] * (H - height), height, H), reads(draws[:, 3] * (W - width), width, W)
    expected = rows[:, :, None, None] + 10 * columns[:, None, :, None] + 100 * np.arange(3)
    assert np.allclose(resized_crops(ramp, draws), expected, rtol=0, atol=1e-3)
    square, whole = ramp[:1, :7], np.array([[1.0, 0.5, 0.3, 0.6]])  # all its area at ratio 1: the image itself
    assert np.allclose(resized_crops(square, whole), square, rtol=0, atol=1e-3)


def jittered(image, factors):
    """One image (H, W, C) in [0, 1] jittered as the docs say, in float64: brightness, contrast about the mean
    grey, saturation about each pixel's grey for RGB, each clipped to [0, 1]."""
    def grey(x):
        return (x @ [0.299, 0.587, 0.114])[..., None] if x.shape[2] == 3 else x.mean(axis=2, keepdims=True)
    x = np.clip(image * factors[0], 0, 1)
    centre = grey(x).mean()
    x = np.clip(centre + factors[1] * (x - centre), 0, 1)
    if image.shape[2] == 3:
        x = np.clip(grey(x) + factors[2] * (x - grey(x)), 0, 1)
    return x


@pytest.mark.parametrize("channels", [3, 1])
def test_jitter_scales_brightness_contrast_and_saturation_as_stated_before_the_mean_goes(channels):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 5, 4, channels), dtype=np.uint8)
    factors = np.random.default_rng(4).uniform(0.8, 1.2, (6, 3))  # jitter draws first (no shuffle)
    expected = [jittered(image / np.float32(255), f) for image, f in zip(images.astype(np.float32), factors)]
    assert np.allclose(batch_of(images, ("jitter",), seed=4), expected, rtol=0, atol=1e-5)
    mean = rng.random(images.shape[1:], dtype=np.float32)  # subtracted after: jitter scales light, not x - mean
    assert np.array_equal(batch_of(images, ("jitter",), seed=4, mean=mean),
                          batch_of(images, ("jitter",), seed=4) - mean)
    black, grey = np.zeros((8, 3, 3, channels), np.uint8), np.full((8, 3, 3, channels), 100, np.uint8)
    assert np.array_equal(batch_of(black, ("jitter",)), black.astype(np.float32))  # zero stays zero
    scaled = batch_of(grey, ("jitter",)) / np.float32(100 / 255)  # a plain grey: brightness alone acts
    assert np.allclose(scaled, scaled[:, :1, :1, :1], atol=1e-5) and np.all((scaled > 0.8 - 1e-5) & (scaled < 1.2))


def test_shift_moves_each_image_by_whole_pixels_up_to_a_tenth_of_a_side_and_fills_with_the_mean():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (40, 20, 30, 3), dtype=np.uint8)
    mean = rng.random(images.shape[1:], dtype=np.float32)
    plain, shifted = batch_of(images, (), mean=mean), batch_of(images, ("shift",), mean=mean, seed=2)
    moves = np.random.default_rng(2).integers([-2, -3], [3, 4], size=(40, 2))  # 10% of 20 and of 30
    assert {tuple(m) for m in moves} > {(0, 0)}
    for before, after, (dy, dx) in zip(plain, shifted, moves):
        expected = np.zeros_like(before)  # zero after the mean is subtracted: the mean image
        expected[max(dy, 0):20 + min(dy, 0), max(dx, 0):30 + min(dx, 0)] = \
            before[max(-dy, 0):20 + min(-dy, 0), max(-dx, 0):30 + min(-dx, 0)]
        assert np.array_equal(after, expected)
    assert Batches(images_split(images[:, :1, :8]), batch=2, mean=0, augment=("shift",), seed=0).shift == (0, 1)


@pytest.mark.parametrize("augment", [("resized-crop",), ("jitter",), ("shift",), AUGMENTS])
def test_the_same_seed_gives_the_same_batches_and_a_resume_the_uninterrupted_ones(augment):
    rng = np.random.default_rng(3)
    split = data.Split(rng.integers(0, 256, (10, 8, 6, 3), dtype=np.uint8), rng.integers(0, 2, 10), 2, "made")
    mean = split.pixel_mean()
    stream = lambda seed: Batches(split, batch=4, mean=mean, augment=augment, seed=seed)  # noqa: E731
    straight, again, other = stream(7), stream(7), stream(8)
    batches = [host(straight.next()[0]).copy() for _ in range(6)]  # 3 epochs of 2 batches (2 images dropped)
    assert all(np.array_equal(a, host(again.next()[0])) for a in batches)
    assert not np.array_equal(batches[0], host(other.next()[0]))
    first = stream(7)
    for _ in range(3):
        first.next()
    state = json.loads(json.dumps({k: v.tolist() if isinstance(v, np.ndarray) else v
                                   for k, v in first.state().items()}))
    resumed = stream(99)  # as a checkpoint holds it: the generator's state, not the seed, carries on
    resumed.restore(state)
    assert all(np.array_equal(a, host(resumed.next()[0])) for a in batches[3:])
