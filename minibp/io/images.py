"""Image files (PNG, JPEG) as the uint8 arrays a data file holds, decoded by Pillow (the imagenet extra:
pip install 'minibp[imagenet]'): a folder in the common layout for python3 -m minibp.prepare folder and
data.write_folder, and single files for python3 -m minibp.predict.

    tree = read_tree("shapes", size=None)       # Tree: the splits of shapes/train/CLASS/*.png (val/, test/)
    image = decode("a.png", size=(32, 32), channels=1)   # (32, 32, 1) uint8

The layout: DIR/train/CLASS/*.png|jpg|jpeg, one folder a class, the classes sorted by name (label i is the
i-th); DIR/val and DIR/test likewise, where present, with classes of train's. Every image has one size (H x W),
or all are resized to `size` with Pillow's bilinear filter (antialiased when it shrinks); they are grey (C = 1)
where every one is, else RGB (C = 3; an alpha channel is dropped). A file Pillow cannot read is a one-line
ValueError naming it; files of other extensions are left out and counted.
"""
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

EXTENSIONS = (".png", ".jpg", ".jpeg")   # what a folder's images are (any case)
SPLITS = ("train", "val", "test")        # the folders read, train required
GREY = ("1", "L", "LA", "I", "I;16", "F")  # Pillow's modes of one channel (LA: grey with alpha)


@dataclass
class Tree:
    """A folder's images, split by split."""
    root: Path
    class_names: list                            # the class folders of train/, sorted: label i is names[i]
    splits: dict = field(default_factory=dict)   # {"train"|"val"|"test": (images (N, H, W, C) uint8, labels (N,))}
    left_out: int = 0                            # files that are not .png, .jpg or .jpeg


def pillow():
    """Pillow's Image module; a one-line ValueError saying how to install it where it is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("reading image files needs Pillow: pip install 'minibp[imagenet]' (or pip install "
                         "Pillow)") from None
    return Image


def is_image(path):
    return Path(path).suffix.lower() in EXTENSIONS and not Path(path).name.startswith(".")


def parse_size(text):
    """'32x48' -> (32, 48), H x W; a one-line ValueError otherwise."""
    height, x, width = str(text).lower().partition("x")
    if not (x and height.isdigit() and width.isdigit() and int(height) > 0 and int(width) > 0):
        raise ValueError(f"--size is HxW in pixels, e.g. 32x32, got {text!r}")
    return int(height), int(width)


def header(path):
    """((H, W), grey) of an image file, read from its header alone (nothing decoded)."""
    Image = pillow()
    try:
        with Image.open(path) as image:
            return (image.height, image.width), image.mode in GREY
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # what Pillow raises
        raise ValueError(f"{path}: not an image Pillow can read ({e})") from None


def decode(path, *, size=None, channels=3):
    """(H, W, channels) uint8 of an image file, resized to size (H, W) where that is given and it differs."""
    Image = pillow()
    try:
        with Image.open(path) as image:
            image = image.convert("L" if channels == 1 else "RGB")
            if size is not None and (image.height, image.width) != tuple(size):
                image = image.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            pixels = np.asarray(image, np.uint8)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: not an image Pillow can read ({e})") from None
    return pixels.reshape(pixels.shape[:2] + (channels,))


def read_tree(root, *, size=None, say=print):
    """The Tree of a folder in the common layout (module docstring); size: (H, W) to resize every image to,
    None: they must all have one size. say: where progress lines go."""
    root = Path(root)
    listing, class_names, left_out = list_tree(root)
    heads = {path: header(path) for paths in listing.values() for path, _ in paths}
    sizes = {shape for shape, _ in heads.values()}
    if size is None and len(sizes) > 1:
        first = next(iter(heads))
        other = next(path for path, (shape, _) in heads.items() if shape != heads[first][0])
        raise ValueError(f"the images differ in size: {first} is {'x'.join(map(str, heads[first][0]))} (H x W), "
                         f"{other} {'x'.join(map(str, heads[other][0]))}: give --size HxW to resize them all")
    size = size or sizes.pop()
    channels = 1 if all(grey for _, grey in heads.values()) else 3
    tree = Tree(root, class_names, left_out=left_out)
    for split, paths in listing.items():
        tree.splits[split] = _decode_all(paths, size, channels, f"{split}/", say)
    return tree


def list_tree(root):
    """({split: [(path, label)]}, class names, files left out) of a folder in the common layout."""
    if not root.is_dir():
        raise FileNotFoundError(f"no folder {root}")
    if not (root / "train").is_dir():
        raise ValueError(f"{root} has no train/ folder: the layout is {root}/train/CLASS/*.png (or .jpg), one folder "
                         "a class, and val/ and test/ alike where you have them")
    class_names = sorted(p.name for p in (root / "train").iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_names) < 2:
        raise ValueError(f"{root}/train holds {len(class_names)} class folder(s): a data set has at least 2 "
                         f"({root}/train/CLASS/*.png)")
    listing, left_out = {}, 0
    for split in SPLITS:
        if not (root / split).is_dir():
            continue
        folders = sorted(p for p in (root / split).iterdir() if p.is_dir() and not p.name.startswith("."))
        unknown = [p.name for p in folders if p.name not in class_names]
        if unknown:
            raise ValueError(f"{root / split / unknown[0]} is not a class of {root}/train ({', '.join(class_names)})")
        listing[split] = []
        for folder in folders:
            files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))
            images = [p for p in files if is_image(p)]
            left_out += len(files) - len(images)
            if not images and split == "train":
                raise ValueError(f"{folder} holds no .png or .jpg images")
            listing[split] += [(path, class_names.index(folder.name)) for path in images]
        if not listing[split]:
            raise ValueError(f"{root / split} holds no .png or .jpg images in its class folders")
    return listing, class_names, left_out


def _decode_all(paths, size, channels, what, say):
    """(images (N, H, W, C) uint8, labels (N,) int64) of [(path, label)], a progress line every 5 seconds."""
    images = np.empty((len(paths),) + tuple(size) + (channels,), np.uint8)  # (N, H, W, C)
    labels = np.array([label for _, label in paths], np.int64)               # (N,)
    said = time.monotonic()
    for i, (path, _) in enumerate(paths):
        images[i] = decode(path, size=size, channels=channels)
        if time.monotonic() - said > 5:
            say(f"  {what}: {i + 1:,} of {len(paths):,} images decoded", flush=True)
            said = time.monotonic()
    return images, labels
