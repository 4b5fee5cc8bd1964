"""Image files (PNG, JPEG, TIFF) as the uint8 arrays a data file holds, decoded by Pillow (the images extra,
which extras.install_command("images") installs): a folder in the common layout for python3 -m minibp.prepare folder and
data.write_folder, and single files for python3 -m minibp.predict. decode and header are the one reading of an
image file: prepare and predict both read through them.

    tree = read_tree("shapes", size=None)       # Tree: the splits of shapes/train/CLASS/*.png (val/, test/)
    image = decode("a.png", size=(32, 32), channels=1)   # (32, 32, 1) uint8
    image = decode("a.png", size=(32, 32), resize="crop")   # scaled to cover 32x32, its centre cut out

The layout: DIR/train/CLASS/*.png|jpg|jpeg|tif|tiff, one folder a class, the classes sorted by name (label i is
the i-th); DIR/val and DIR/test likewise, where present, with classes of train's. A class folder's images are
read at any depth below it; folders that are symbolic links are read as folders (each folder once: a link back
up is not read twice); hidden folders and files (a name that starts with ".") are left out, the folders counted.
Files of other extensions are left out and counted (a TIFF of many pages is read as its first). A file
Pillow cannot read is a one-line ValueError naming it.

Every image is read upright (its EXIF orientation applied, as PIL.ImageOps.exif_transpose applies it: a 64x48
image turned a quarter is 48x64, its header's size too) and at 8 bits a channel, whatever Pillow's mode: 1, L,
P, RGB, CMYK and their alpha forms (LA, PA, RGBA: the alpha dropped, never blended) as Pillow converts them;
16-bit grey (I;16, I;16B, I;16L) by value / 257, rounded (65535 -> 255, and 257 k -> k: an 8-bit image saved
at 16 bits reads back as it was); 32-bit integers (I) as 16-bit values, refused where one lies outside 0 to
65535; floats (F) as values in [0, 1] times 255, rounded, refused where one lies outside [0, 1] or is not a
number. They are grey (C = 1) where every one is, else RGB (C = 3). Every image has one size (H x W), or all
are resized to `size` with Pillow's bilinear filter (antialiased when it shrinks), by one of RESIZES: squash
(the default) stretches it to H x W, the aspect ignored; crop scales it to cover H x W and cuts out the centre
(PIL.ImageOps.fit); pad scales it to fit within H x W and centres it on black (PIL.ImageOps.pad, color 0).
"""
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import backend, extras
from ..arena import format_bytes

EXTENSIONS = (".png", ".jpg", ".jpeg", ".tif", ".tiff")  # what a folder's images are (any case)
SPLITS = ("train", "val", "test")        # the folders read, train required
RESIZES = {"squash": "stretched to it, the aspect ignored", "crop": "scaled to cover it, the centre cut out",
           "pad": "scaled to fit, centred on black"}  # --resize: how an image of another size becomes H x W
RESIZE = "squash"                        # the default: what minibp always did
ORIENTATION = 0x0112                     # the EXIF tag
TURNED = (5, 6, 7, 8)                    # orientations that swap H and W
HIDDEN = "left out {} hidden folder(s) (names that start with '.')"  # what prepare and predict say of them


@dataclass
class Tree:
    """A folder's images, split by split."""
    root: Path
    class_names: list                            # the class folders of train/, sorted: label i is names[i]
    splits: dict = field(default_factory=dict)   # {"train"|"val"|"test": (images (N, H, W, C) uint8, labels (N,))}
    left_out: int = 0                            # files that are not images (by their extension)
    hidden: int = 0                              # hidden folders left out (a name that starts with ".")
    resized: int = 0                             # images of another size than `size`, resized to it


def pillow():
    """Pillow's Image module; a one-line ValueError saying how to install it where it is missing."""
    try:
        from PIL import Image
    except ImportError:
        raise ValueError(extras.missing("images", "reading image files needs Pillow")) from None
    return Image


def is_image(path):
    return Path(path).suffix.lower() in EXTENSIONS and not Path(path).name.startswith(".")


def parse_size(text):
    """'32x48' -> (32, 48), H x W; a one-line ValueError otherwise."""
    height, x, width = str(text).lower().partition("x")
    if not (x and height.isdigit() and width.isdigit() and int(height) > 0 and int(width) > 0):
        raise ValueError(f"--size is HxW in pixels, e.g. 32x32, got {text!r}")
    return int(height), int(width)


def check_resize(resize):
    """A one-line ValueError unless resize is one of RESIZES."""
    if resize not in RESIZES:
        raise ValueError(f"--resize is {', '.join(list(RESIZES)[:-1])} or {list(RESIZES)[-1]}, got {resize!r}")
    return resize


class Refused(ValueError):
    """An image Pillow reads whose pixels minibp has no 8-bit reading for: its message names the file."""


def header(path):
    """((H, W), grey) of an image file as decode reads it (upright), from its header alone (nothing decoded)."""
    Image = pillow()
    try:
        with Image.open(path) as image:
            shape = (image.height, image.width)
            return shape[::-1] if _orientation(image) in TURNED else shape, _grey(image.mode)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:  # what Pillow raises
        raise ValueError(f"{path}: not an image Pillow can read ({e})") from None


def decode(path, *, size=None, channels=3, resize=RESIZE):
    """(H, W, channels) uint8 of an image file, upright, at 8 bits (module docstring), resized to size (H, W) by
    `resize` where that is given and it differs."""
    Image = pillow()
    check_resize(resize)
    try:
        with Image.open(path) as image:
            orientation = _orientation(image)
            image = _eight_bit(image, path).convert("L" if channels == 1 else "RGB")
            if orientation in _TRANSPOSES:
                image = image.transpose(getattr(Image.Transpose, _TRANSPOSES[orientation]))
            if size is not None and (image.height, image.width) != tuple(size):
                image = _resized(image, size, resize)
            pixels = np.asarray(image, np.uint8)
    except Refused:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise ValueError(f"{path}: not an image Pillow can read ({e})") from None
    return pixels.reshape(pixels.shape[:2] + (channels,))


# PIL.ImageOps.exif_transpose's: the EXIF orientation -> the transpose that shows the image upright
_TRANSPOSES = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE", 6: "ROTATE_270",
               7: "TRANSVERSE", 8: "ROTATE_90"}


def _orientation(image):
    """An open image's EXIF orientation (1: upright). Read as Pillow's own getexif reads it but never decoding
    the image (PNG's would, to look for EXIF after the pixels), so header and decode read the same tag."""
    from PIL import Image
    try:
        return int(Image.Image.getexif(image).get(ORIENTATION, 1))
    except Exception:  # a damaged EXIF block is no reason to refuse the image: it is read as stored
        return 1


def _grey(mode):
    from PIL import ImageMode
    return ImageMode.getmode(mode).basemode == "L"  # 1, L, LA, I;16*, I, F


def _eight_bit(image, path):
    """The image with 8-bit channels (module docstring): 16-bit, 32-bit and float grey scaled to 0-255 by their
    type's range (Pillow's own conversion clips them); other modes as they are, for Pillow to convert."""
    from PIL import Image
    if image.mode == "P" and "transparency" in image.info:
        return image.convert("RGBA")  # (converted straight to RGB, Pillow warns that it should go through RGBA)
    if not (image.mode in ("I", "F") or image.mode.startswith("I;16")):
        return image
    values = np.asarray(image)
    if image.mode == "F":
        if np.isnan(values).any():
            raise Refused(f"{path}: holds floating-point pixels that are not numbers (NaN): minibp reads float images "
                          "as values in [0, 1]")
        low, high = float(values.min()), float(values.max())
        if low < 0 or high > 1:
            raise Refused(f"{path}: holds floating-point pixels in [{low:g}, {high:g}]: minibp reads float images "
                          "as values in [0, 1]; scale it to them, or save it at 8 or 16 bits")
        return Image.fromarray(np.rint(values * 255).astype(np.uint8))
    values = values.astype(np.int64)
    if image.mode == "I" and (values.min() < 0 or values.max() > 65535):
        raise Refused(f"{path}: holds 32-bit integer pixels in [{values.min()}, {values.max()}]: minibp reads them "
                      "as 16-bit values (0 to 65535); save it at 8 or 16 bits")
    return Image.fromarray(((values + 128) // 257).astype(np.uint8))  # value / 257, rounded


def _resized(image, size, resize):
    """The image (8-bit, L or RGB) at size (H, W) by resize (RESIZES), with Pillow's bilinear filter."""
    from PIL import Image, ImageOps
    box, bilinear = (size[1], size[0]), Image.Resampling.BILINEAR
    if resize == "crop":
        return ImageOps.fit(image, box, bilinear)
    if resize == "pad":
        return ImageOps.pad(image, box, bilinear, color=0)
    return image.resize(box, bilinear)


def walk(folder):
    """(image files below folder, sorted; other files; hidden folders left out) at any depth: links to folders
    followed, each folder once (a link back up is not read again); hidden files and folders left out."""
    images, others, hidden, seen = [], 0, 0, set()

    def fail(error):  # an unreadable folder fails as reading it would, never silently reads as empty
        raise error
    for top, folders, files in os.walk(folder, followlinks=True, onerror=fail):
        status = os.stat(top)
        if (status.st_dev, status.st_ino) in seen:
            folders[:] = []
            continue
        seen.add((status.st_dev, status.st_ino))
        hidden += sum(name.startswith(".") for name in folders)
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            path = Path(top) / name
            if name.startswith(".") or not path.is_file():  # hidden; a broken link, a FIFO
                continue
            if is_image(path):
                images.append(path)
            else:
                others += 1
    return sorted(images), others, hidden


def read_tree(root, *, size=None, resize=RESIZE, say=print):
    """The Tree of a folder in the common layout (module docstring); size: (H, W) to resize every image to (by
    `resize`, one of RESIZES), None: they must all have one size. say: where progress lines go, the first saying
    what is read and how it is resized."""
    root = Path(root)
    check_resize(resize)
    listing, class_names, left_out, hidden = list_tree(root)
    heads = {path: header(path) for paths in listing.values() for path, _ in paths}
    sizes = {shape for shape, _ in heads.values()}
    if size is None and len(sizes) > 1:
        first = next(iter(heads))
        other = next(path for path, (shape, _) in heads.items() if shape != heads[first][0])
        raise ValueError(f"the images differ in size: {first} is {'x'.join(map(str, heads[first][0]))} (H x W), "
                         f"{other} {'x'.join(map(str, heads[other][0]))}: give --size HxW to resize them all")
    given, size = size, tuple(size or sizes.pop())
    channels = 1 if all(grey for _, grey in heads.values()) else 3
    _check_memory(root, len(heads), size, channels, copies=1 if "test" in listing else 2)
    shown = "x".join(map(str, size))
    how = f"by {resize} " + ("(the default; --resize crop or pad keeps the aspect)" if resize == RESIZE else
                             f"({RESIZES[resize]}; the default is {RESIZE})")
    say(f"reading {root}: {len(heads):,} images of {len(class_names)} classes, " +
        (f"resized to {shown} (H x W) {how}" if given else f"each {shown} (H x W)"), flush=True)
    tree = Tree(root, class_names, left_out=left_out, hidden=hidden,
                resized=sum(shape != size for shape, _ in heads.values()))
    for split, paths in listing.items():
        tree.splits[split] = _decode_all(paths, size, channels, resize, f"{split}/", say)
    return tree


def _check_memory(root, count, size, channels, *, copies):
    """A one-line ValueError, before any image is decoded, where the images at size take more memory than the
    host has free (as the data reader checks a file's splits); copies: 2 where a split is held out of train's."""
    needed = copies * count * int(np.prod(size, dtype=object)) * channels
    free = backend.host_memory()
    if free is not None and needed > free:
        raise ValueError(f"{root}: its {count:,} images at {'x'.join(map(str, size))}x{channels} (H x W x C) take "
                         f"{format_bytes(needed)} in memory, more than the {format_bytes(free)} available: give a "
                         "smaller --size")


def list_tree(root):
    """({split: [(path, label)]}, class names, files left out, hidden folders left out) of a folder in the
    common layout."""
    if not root.is_dir():
        raise FileNotFoundError(f"no folder {root}")
    if not (root / "train").is_dir():
        raise ValueError(f"{root} has no train/ folder: the layout is {root}/train/CLASS/*.png (or .jpg), one folder "
                         "a class, and val/ and test/ alike where you have them")
    class_names = sorted(p.name for p in (root / "train").iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_names) < 2:
        raise ValueError(f"{root}/train holds {len(class_names)} class folder(s): a data set has at least 2 "
                         f"({root}/train/CLASS/*.png)")
    listing, left_out, hidden = {}, 0, 0
    for split in SPLITS:
        if not (root / split).is_dir():
            continue
        folders = sorted(p for p in (root / split).iterdir() if p.is_dir())
        hidden += sum(p.name.startswith(".") for p in folders)
        folders = [p for p in folders if not p.name.startswith(".")]
        unknown = [p.name for p in folders if p.name not in class_names]
        if unknown:
            raise ValueError(f"{root / split / unknown[0]} is not a class of {root}/train ({', '.join(class_names)})")
        listing[split] = []
        for folder in folders:
            images, others, below = walk(folder)
            left_out, hidden = left_out + others, hidden + below
            if not images and split == "train":
                raise ValueError(f"{folder} holds no .png, .jpg or .tif images")
            listing[split] += [(path, class_names.index(folder.name)) for path in images]
        if not listing[split]:
            raise ValueError(f"{root / split} holds no .png, .jpg or .tif images in its class folders")
    return listing, class_names, left_out, hidden


def _decode_all(paths, size, channels, resize, what, say):
    """(images (N, H, W, C) uint8, labels (N,) int64) of [(path, label)], a progress line every 5 seconds."""
    try:
        images = np.empty((len(paths),) + tuple(size) + (channels,), np.uint8)  # (N, H, W, C)
    except MemoryError:  # where the host does not say what it has free
        raise ValueError(f"{len(paths):,} images at {'x'.join(map(str, size))}x{channels} (H x W x C) do not fit in "
                         "memory: give a smaller --size") from None
    labels = np.array([label for _, label in paths], np.int64)               # (N,)
    said = time.monotonic()
    for i, (path, _) in enumerate(paths):
        images[i] = decode(path, size=size, channels=channels, resize=resize)
        if time.monotonic() - said > 5:
            say(f"  {what}: {i + 1:,} of {len(paths):,} images decoded", flush=True)
            said = time.monotonic()
    return images, labels
