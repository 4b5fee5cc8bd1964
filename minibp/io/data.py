"""Training data: the prepared HDF5 files (docs/data.md), their one writer and their checks; batches.py deals them out.

    write("data/mine.h5", train=(images, labels), test=(images, labels), classes=10)   # uint8 NHWC, ints
    write("data/mine.h5", train=..., test=..., val=(images, labels), classes=10)        # with a validation split
    write_folder("data/shapes.h5", "shapes")            # shapes/train/CLASS/*.png (and val/, test/), via Pillow
    train, test = load_dataset("data/cifar10.h5")       # Splits: uint8 images (N, H, W, C), labels (N,)
    val = load_split("data/mine.h5", "val")             # a file's own validation split, where it has one
    train, val = hold_out(train, 0.1)                   # or 10% of the training split, the same every time
    mean = train.pixel_mean()                           # (H, W, C) float32, per-pixel mean in [0, 1]

Reading checks the whole file (both splits' groups, dtypes and shapes, the class count, the labels'
range) and each array read against the SHA-256 that `write` stored beside it; anything wrong is a
one-line ValueError naming the file. `load_split(path, "test")` reads one split. `write` is the one
writer of the format (minibp.prepare's converters use it): it refuses, with the same one-line
messages, what the reader would refuse, so a file it writes always loads.

A file's root attribute sha256 covers its name, classes, class names, further attributes and every split's
checksums, so a flipped bit in `classes` is damage, not an 11-class net.
"""
import hashlib
import io
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from .. import backend
from ..arena import format_bytes
from ..integrity import atomic_file, sha256_array, stored_outside
from . import images as image_files

PREPARE = "python3 -m minibp.prepare"
DATASETS = ("cifar10", "cifar100", "fashion-mnist")
SPLITS = ("train", "test", "val")  # val: optional, a file's own validation split
HOLD_OUT_SEED = 0                  # the permutation hold_out takes its validation images from: one for every run


@dataclass
class Split:
    images: np.ndarray   # (N, H, W, C) uint8
    labels: np.ndarray   # (N,) int64
    classes: int
    name: str            # the data set's (the file's name attribute)
    part: str = "train"  # which split: train, test, val, or "held-out" (hold_out's)
    class_names: tuple = None  # the file's class names, if it has them
    sha256: str = None   # the file's root checksum (None: an older file without one)

    def pixel_mean(self):
        """(H, W, C) float32 mean image, in [0, 1] units."""
        total = np.zeros(self.images.shape[1:], np.float64)
        for start in range(0, len(self.images), 4096):
            total += self.images[start:start + 4096].sum(axis=0, dtype=np.float64)
        return (total / (255.0 * len(self.images))).astype(np.float32)


def dataset_path(data_dir, name):
    return Path(data_dir) / f"{name}.h5"


def file_name(path):
    """A data file's own name (its name attribute, else its stem), read without its arrays."""
    return describe(path)["name"]


def describe(path):
    """{name, shape (H, W, C), classes, train_images, held_bytes} of a data file, read without its arrays (the
    planner's, the run folder's name; held_bytes: what a run holds of it in memory, every split's images and
    int64 labels); a FileNotFoundError or a one-line ValueError for a file that is missing or not one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {path}")
    try:
        with h5py.File(path, "r") as f:
            images, classes = f.get("train/images"), f.attrs.get("classes")
            if not isinstance(images, h5py.Dataset) or len(images.shape) != 4 or classes is None:
                raise ValueError(f"{path} is not a data file minibp.io.data.write made (no train/images or classes)")
            problem = _classes_problem(classes)
            if problem:
                raise ValueError(f"{path}: {problem}")
            splits = [f[f"{split}/images"] for split in SPLITS if isinstance(f.get(f"{split}/images"), h5py.Dataset)]
            held = sum(int(np.prod(a.shape)) * a.dtype.itemsize + 8 * int(a.shape[0]) for a in splits)
            return dict(name=_text(f.attrs.get("name", path.stem)) or path.stem, shape=tuple(images.shape[1:]),
                        classes=int(classes), train_images=int(images.shape[0]), held_bytes=held)
    except OSError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path} is not a readable HDF5 file ({why})") from None


def hold_out(split, fraction):
    """(train, validation) Splits of a training split: the validation images are round(fraction * N) of it,
    chosen by a permutation of fixed seed (HOLD_OUT_SEED), so every run, resume and evaluation of the same
    file and fraction holds out the same images; both keep the file's order."""
    n = len(split.labels)
    held = int(round(fraction * n))
    if not (0 < fraction < 1) or not 1 <= held < n:
        raise ValueError(f"--val-split {fraction} holds out {held} of the {n} training images: give a fraction in "
                         "(0, 1) that leaves at least one image on each side")
    chosen = np.zeros(n, bool)
    chosen[np.random.default_rng(HOLD_OUT_SEED).permutation(n)[:held]] = True
    keep = lambda mask, part: Split(split.images[mask], split.labels[mask], split.classes, split.name,  # noqa: E731
                                    part=part, class_names=split.class_names, sha256=split.sha256)
    return keep(~chosen, "train"), keep(chosen, "held-out")


def prepare_command(name, path):
    """The command that writes the data set `name` (one of DATASETS) to the file at path."""
    return f"{PREPARE} {name} --out {Path(path).parent}"


def missing_dataset_message(name, path):
    """One line: what is missing and the command that prepares it."""
    how = f"`{prepare_command(name, path)}`"
    if name == "fashion-mnist":  # from the Debian package where it is installed, else downloaded
        how += " (after apt-get install dataset-fashion-mnist on Debian/Ubuntu; without it, it downloads)"
    return f"no {name} data at {path}: prepare it with {how}"


def split_checksums(images, labels):
    """{images_sha256, labels_sha256}: the SHA-256 of each array's bytes (C order, its own dtype), as `write`
    stores them on a split."""
    return {f"{key}_sha256": sha256_array(array) for key, array in (("images", images), ("labels", labels))}


def write(path, *, train, test, classes, val=None, name=None, class_names=None, attrs=None):
    """Write a prepared data file from arrays: train, test and (optional) val are (images (N, H, W, C) uint8,
    labels (N,) integers in [0, classes)), every split's images of one (H, W, C); val, a validation split
    the trainer selects on instead of the test split. name (default: the file's stem) and
    class_names (a list of strings, one per class) are optional attributes, attrs (a dict) any further ones
    (where the data came from). Labels are stored as int64, each array with its SHA-256 (docs/data.md has the
    layout).

    The file is written to a temporary name and renamed: a failed write leaves the file at path as it was.
    Input the reader would refuse, or HDF5 cannot store, is a one-line ValueError, raised before anything
    is written; a failed write is an OSError saying why."""
    splits = {}
    for split, pair in (("train", train), ("test", test)) + ((("val", val),) if val is not None else ()):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{split} must be a pair (images, labels), got {type(pair).__name__}")
        splits[split] = tuple(np.asarray(array) for array in pair)
    problem = _format_problem(classes, splits) or next(
        filter(None, (_labels_problem(split, labels, classes) for split, (_, labels) in splits.items())), None)
    if problem:
        raise ValueError(problem)
    root = _root_attrs(path, classes=classes, name=name, class_names=class_names, attrs=attrs)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as tmp, h5py.File(tmp, "w") as f:
            checksums = {}
            for split, (images, labels) in splits.items():
                images, labels = np.ascontiguousarray(images), labels.astype(np.int64)
                group = f.create_group(split)
                group.create_dataset("images", data=images, chunks=(min(len(images), 256),) + images.shape[1:])
                group.create_dataset("labels", data=labels)
                checksums[split] = split_checksums(images, labels)
                group.attrs.update(checksums[split])
            f.attrs.update(root, sha256=root_sha256(root, checksums))
    except OSError as e:  # the reason alone: h5py's message runs over lines and names the temporary file
        raise OSError(f"could not write {path}: {os.strerror(e.errno) if e.errno else e}") from None
    return Path(path)


def write_folder(path, folder, *, size=None, resize=image_files.RESIZE, say=print):
    """Write a data file from a folder of image files in the common layout, decoded by Pillow (images.py):
    folder/train/CLASS/*.png|jpg|jpeg|tif|tiff, and folder/val and folder/test where present. size: (H, W) to
    resize every image to, by resize (images.RESIZES: squash, the default, crop or pad); None: they must all have
    one size. Where there is no test/ folder, a tenth of train/'s images (hold_out's fixed choice) is the test
    split, and `say` says so, as it says what it left out and how many images it resized. The file is named after
    the folder, its class names are the class folders' names, and its attrs say where it came from, the image
    size and how images of another size are resized (resize: predict resizes a run's images so). Returns the
    path; a bad folder or image is a one-line ValueError naming it, before anything is written."""
    tree = image_files.read_tree(folder, size=size, resize=resize, say=say)
    splits, classes = dict(tree.splits), len(tree.class_names)
    if "test" not in splits:
        try:
            kept, held = hold_out(Split(*splits["train"], classes=classes, name=tree.root.name), 0.1)
        except ValueError:
            raise ValueError(f"{tree.root} has no test/ folder, and {len(splits['train'][1])} training images are "
                             "too few to hold a tenth out: give it a test/ folder") from None
        splits.update(train=(kept.images, kept.labels), test=(held.images, held.labels))
        say(f"{tree.root} has no test/ folder: {len(held.labels):,} of train/'s {len(held.labels) + len(kept.labels):,}"
            " images (a tenth, the same every time) are the test split")
    if tree.left_out:
        say(f"left out {tree.left_out} file(s) that are not images ({', '.join(image_files.EXTENSIONS)})")
    if tree.hidden:
        say(image_files.HIDDEN.format(tree.hidden))
    height, width, channels = splits["train"][0].shape[1:]
    if size is not None:
        count = sum(len(labels) for _, labels in splits.values())
        say(f"resized {tree.resized:,} of {count:,} images to {height}x{width} (H x W) by {resize}")
    return write(path, train=splits["train"], test=splits["test"], val=splits.get("val"), classes=classes,
                 name=tree.root.resolve().name, class_names=tree.class_names,
                 attrs=dict(source=str(tree.root.resolve()), image_size=f"{height}x{width}", channels=int(channels),
                            resize=resize))


def resize_mode(path, sha256=None):
    """How image files are resized for the data file at path (its resize attribute, write_folder's; a file
    without one, of arrays or of an older minibp: squash, all minibp did), read without its arrays; None where
    no such file is there, or where sha256 is given and the file's root checksum is another (a file changed)."""
    try:
        with h5py.File(path, "r") as f:
            if sha256 is not None and _text(f.attrs.get("sha256", "")) != sha256:
                return None
            return _text(f.attrs.get("resize", image_files.RESIZE))
    except OSError:  # gone, or not an HDF5 file
        return None


def _root_attrs(path, *, classes, name, class_names, attrs):
    """{attribute: value} of a file's root, each checked to be one HDF5 stores as given (a ValueError of one
    line otherwise), so that write refuses bad input before it opens a file instead of failing halfway."""
    if isinstance(class_names, (str, bytes)):  # a str is a sequence of one-letter names: never what was meant
        raise ValueError(f"class_names must be a list of names, one per class, not a {type(class_names).__name__} "
                         f"({class_names[:20]!r})")
    if attrs is not None and not isinstance(attrs, Mapping):
        raise ValueError(f"attrs must be a dict of attribute names to values, got {type(attrs).__name__}")
    attrs = dict(attrs or {})
    clashing = sorted(set(attrs) & {"name", "classes", "class_names"})
    if clashing:
        raise ValueError(f"attrs may not set {', '.join(clashing)}: they are write's own arguments")
    for key, value in attrs.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"attrs has the name {key!r}: attribute names are non-empty strings")
        problem = _string_problem(f"the attrs name {key!r}", key) or _value_problem(f"attrs[{key!r}]", value)
        if problem:
            raise ValueError(problem)
    if name is None or name == "":  # the file's stem, any undecodable bytes in it (surrogates) escaped
        name = Path(path).stem.encode("utf-8", "backslashreplace").decode()
    elif not isinstance(name, str):
        raise ValueError(f"name must be a string, got {type(name).__name__}")
    root = dict(attrs, name=name, classes=int(classes))
    problem = _string_problem("name", name)
    if class_names is not None:
        try:
            names = list(class_names)
        except TypeError:
            raise ValueError(f"class_names must be a list of names, one per class, got "
                             f"{type(class_names).__name__}") from None
        if len(names) != classes:
            raise ValueError(f"class_names has {len(names)} names for {classes} classes")
        for i, text in enumerate(names):
            if not isinstance(text, str):
                raise ValueError(f"class_names[{i}] is {type(text).__name__} {text!r}, not a string")
        problem = problem or next(
            filter(None, (_string_problem(f"class_names[{i}]", text) for i, text in enumerate(names))), None)
        root["class_names"] = np.array(names, dtype=h5py.string_dtype())
    if problem:
        raise ValueError(problem)
    # what no check above foresaw (a dict, an object, a mixed list) fails here, in memory, not in the file
    with h5py.File(io.BytesIO(), "w") as trial:
        for key, value in root.items():
            what = key if key in ("name", "class_names") else f"attrs[{key!r}]"
            try:
                trial.attrs[key] = value
            except Exception as e:  # h5py's TypeError, ValueError, OSError, RuntimeError: all say "cannot"
                why = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ValueError(f"{what} cannot be stored as an HDF5 attribute ({why})") from None
            if _attr_text(trial.attrs[key]) != _attr_text(value):  # the root checksum is of what reads back
                raise ValueError(f"{what} does not read back from HDF5 as given ({value!r}): give a string, a "
                                 "number, or a list of one kind of them")
    return root


def root_sha256(root, checksums):
    """The SHA-256 of a file's root attributes (all but sha256 itself, as their text) and of its splits'
    checksums ({split: split_checksums}): what a run depends on beyond the arrays, under one checksum."""
    text = json.dumps(dict(attrs={k: _attr_text(v) for k, v in sorted(root.items()) if k != "sha256"},
                           splits={k: dict(sorted(v.items())) for k, v in sorted(checksums.items())}))
    return sha256_array(np.frombuffer(text.encode(), np.uint8))


def _attr_text(value):
    """An attribute's value as text, the same whether given to write or read back by h5py (numpy types,
    bytes and object arrays of str included)."""
    if isinstance(value, np.ndarray):
        return [_attr_text(v) for v in value.tolist()] if value.ndim else _attr_text(value.item())
    if isinstance(value, (list, tuple)):
        return [_attr_text(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, np.generic):
        return _attr_text(value.item())
    return repr(value) if isinstance(value, float) else str(value)


def _string_problem(what, text):
    """Why the string text cannot be an HDF5 string (UTF-8, NUL-terminated), in one line, or None."""
    if "\0" in text:
        return f"{what} holds a NUL character (at {text.index(chr(0))}), which HDF5 strings cannot hold"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"{what} is not valid Unicode (a lone surrogate {text[e.start]!r} at {e.start}): HDF5 strings "
                "are UTF-8")
    return None


def _value_problem(what, value):
    """Why an attribute's value cannot be stored, for the values whose own HDF5 error would not say it."""
    if value is None:
        return f"{what} is None, which HDF5 cannot store: leave it out, or give a string or a number"
    return next(filter(None, (_string_problem(what, text) for text in _strings(value))), None)


def _strings(value):
    """The strs in an attribute's value: itself, or those in a list, a tuple or an object array of them."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)) or isinstance(value, np.ndarray) and value.dtype == object:
        for item in np.ravel(value) if isinstance(value, np.ndarray) else value:
            yield from _strings(item)


def load_dataset(path):
    """(train, test) Splits of a prepared HDF5 file, the whole file checked (see load_split)."""
    return _load(path, ("train", "test"))


def load_split(path, split):
    """The train, test or val split of a prepared HDF5 file, read into memory: a Split (images (N, H, W, C)
    uint8, labels (N,) int64, classes, name, part, class_names or None, sha256: the file's root checksum).

    The file's structure is checked whole (every split, shapes, dtypes, the class count, the root checksum);
    this split's labels are checked against the class count and its arrays against their SHA-256. Every
    problem is a one-line ValueError (FileNotFoundError for a missing file) naming the file."""
    if split not in SPLITS:
        raise ValueError(f"{path}: no split {split!r} (train, test or val)")
    return _load(path, (split,))[0]


def has_split(path, split):
    """Whether a prepared file holds the split (val is optional), without reading its arrays."""
    with h5py.File(path, "r") as f:
        return isinstance(f.get(split), h5py.Group)


_unverifiable_warned = set()  # files already reported as carrying no checksums
READ_BYTES = 64 << 20  # the most of a split read at once, its checksum summed as it comes
CHECKSUMS = ("images_sha256", "labels_sha256")  # a split's


def _load(path, splits):
    path = Path(path)
    if not path.is_file():
        name = path.stem
        raise FileNotFoundError(missing_dataset_message(name, path) if name in DATASETS else f"no data file {path}")
    # a file of minibp.prepare's can be prepared again; one of your own is written again
    again = (f"prepare it again with {prepare_command(path.stem, path)}" if path.stem in DATASETS
             else "write it again (minibp.io.data.write)")
    try:
        with h5py.File(path, "r") as f:
            name = _text(f.attrs.get("name", path.stem))
            where = f"{path} ({name})"
            bad = lambda problem: ValueError(f"{where}: {problem}: {again}")  # noqa: E731
            present = _structure(f, splits, where, bad)
            root = {k: f.attrs[k] for k in f.attrs}
            classes, verified = int(root["classes"]), _checked_root(f, root, present, bad)
            class_names, problem = _class_names(root.get("class_names"), classes)
            problem = problem or next(filter(None, (stored_problem(f"{split} {key}", f[split][key])
                                                    for split in splits for key in ("images", "labels"))), None)
            if problem:
                raise bad(problem)
            _check_memory(where, [f[split] for split in splits])
            sha = _text(root["sha256"]) if verified else None
            result = [Split(*_read_split(f[split], split, classes, bad), int(classes), name, part=split,
                            class_names=class_names, sha256=sha) for split in splits]
    except OSError as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path} is not a readable HDF5 file ({why}): {again}") from None
    if not verified and path.resolve() not in _unverifiable_warned:
        _unverifiable_warned.add(path.resolve())
        print(f"warning: {where} has no SHA-256 checksums (written by an older minibp), so damage to it cannot be "
              f"detected; {again}", file=sys.stderr)
    return result


def _structure(f, splits, where, bad):
    """The splits a file holds, once its structure is checked whole (the groups, the datasets' dtypes and shapes,
    the class count) and holds the splits asked for."""
    if "classes" not in f.attrs:
        raise bad("no 'classes' attribute")
    present = [split for split in SPLITS if split != "val" or "val" in f]
    problem = _format_problem(f.attrs["classes"], {split: _datasets(f, split, bad) for split in present})
    if problem:
        raise bad(problem)
    if "val" in splits and "val" not in present:
        raise ValueError(f"{where} has no val split (it holds {', '.join(present)}): write one with "
                         "minibp.io.data.write(..., val=...), or hold one out with --val-split")
    return present


def _checked_root(f, root, present, bad):
    """Whether the file carries its checksums, its root's checked: data.write writes every one (the root's and
    each split's two), so one missing where others are is damage; a file with none is of an older format."""
    have = [k in f[split].attrs for split in present for k in CHECKSUMS] + ["sha256" in root]
    if not any(have):
        return False
    missing = ([] if "sha256" in root else ["the root's sha256"]) + [
        f"{split}'s {k}" for split in present for k in CHECKSUMS if k not in f[split].attrs]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise bad(f"its checksum {missing[0]}{more} is missing though the file carries others; data.write writes "
                  "every one, so the file is damaged (or written by a minibp from before root checksums)")
    if _text(root["sha256"]) != root_sha256(root, {s: {k: _text(f[s].attrs[k]) for k in CHECKSUMS} for s in present}):
        raise bad("its attributes (classes, names, checksums) fail their SHA-256 check (the file is damaged)")
    return True


def _class_names(value, classes):
    """(names or None, problem or None) of a file's class_names attribute, checked as write checks them: a list
    of strings (UTF-8 bytes, as HDF5 may hold them, read as text), one per class."""
    if value is None:
        return None, None
    if not isinstance(value, np.ndarray) or value.ndim != 1:
        text = repr(value)
        return None, (f"class_names must be a list of names, one per class, got "
                      f"{text if len(text) <= 40 else text[:37] + '...'}")
    if len(value) != classes:
        return None, f"class_names has {len(value)} names for {classes} classes"
    names = []
    for i, item in enumerate(value.tolist()):
        if isinstance(item, bytes):
            try:
                item = item.decode("utf-8")
            except UnicodeDecodeError:
                return None, f"class_names[{i}] is not valid UTF-8 ({item[:20]!r})"
        if not isinstance(item, str):
            return None, f"class_names[{i}] is {type(item).__name__} {item!r}, not a string"
        problem = _string_problem(f"class_names[{i}]", item)
        if problem:
            return None, problem
        names.append(item)
    return tuple(names), None


def stored_problem(what, dataset):
    """Why a dataset's values are not all in the file, or None: kept in other files (HDF5's external or virtual
    storage, which would read any file the reader can), or declared and never written (they would read as
    zeros: a file of kilobytes that declares gigabytes)."""
    if stored_outside(dataset):
        return f"{what} are stored outside the file (HDF5 external or virtual storage), which minibp does not read"
    if dataset.id.get_space_status() != h5py.h5d.SPACE_STATUS_ALLOCATED:
        kind = what.split()[-1]
        return (f"{what} declare {len(dataset):,} {kind} ({format_bytes(dataset.nbytes)}) but the file stores "
                f"{format_bytes(dataset.id.get_storage_size())} of them (never written, or cut short)")
    return None


def _check_memory(where, groups):
    """A ValueError where the splits (their HDF5 groups) take more memory than the host has free."""
    needed = sum(g["images"].nbytes + 8 * len(g["labels"]) for g in groups)  # labels read as int64
    free = backend.host_memory()
    if free is not None and needed > free:
        names = " and ".join(g.name.strip("/") for g in groups)
        raise ValueError(f"{where}: its {names} split{'s take' if len(groups) > 1 else ' takes'} "
                         f"{format_bytes(needed)} in memory, more than the {format_bytes(free)} available")


def _read_split(group, split, classes, bad):
    """(images, labels int64) of a split, read a part at a time (READ_BYTES), each array checked against its
    checksum where the file has them, and the labels against the classes."""
    arrays = []
    for key in ("images", "labels"):
        dataset, digest = group[key], hashlib.sha256()
        array = np.empty(dataset.shape, dataset.dtype)
        rows = max(1, READ_BYTES // max(1, array[:1].nbytes))
        for start in range(0, len(array), rows):
            part = np.s_[start:start + rows]
            dataset.read_direct(array, part, part)
            digest.update(array[part].data)  # (rows of a C-order array: its bytes in order)
        if f"{key}_sha256" in group.attrs and _text(group.attrs[f"{key}_sha256"]) != digest.hexdigest():
            raise bad(f"{split} {key} fail their SHA-256 check (the file is damaged)")
        arrays.append(array)
    images, labels = arrays
    problem = _labels_problem(split, labels, classes)
    if problem:
        raise bad(problem)
    return images, labels.astype(np.int64, copy=False)


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _datasets(f, split, bad):
    """(images, labels): the HDF5 datasets of a split, once its group and both datasets are there."""
    group = f.get(split)
    if not isinstance(group, h5py.Group):
        raise bad(f"no '{split}' group (the file has: {', '.join(f) or 'nothing'})")
    for key in ("images", "labels"):
        if not isinstance(group.get(key), h5py.Dataset):
            raise bad(f"the {split} group has no '{key}' dataset (it has: {', '.join(group) or 'nothing'})")
    return group["images"], group["labels"]


def _format_problem(classes, splits):
    """What is wrong with a class count and the dtypes and shapes of {split: (images, labels)}, in one line,
    or None. The arrays may be NumPy arrays or HDF5 datasets: only their dtype and shape are read, so the
    reader checks a file's structure before reading any of it, and the writer refuses what it would refuse."""
    problem = _classes_problem(classes)
    if problem:
        return problem
    for split, (images, labels) in splits.items():
        if images.dtype != np.uint8 or len(images.shape or ()) != 4:
            return f"{split} images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}"
        if len(images) == 0:
            return f"the {split} split is empty"
        if 0 in images.shape[1:]:  # no pixel to train on; HDF5 cannot chunk it either
            return ("{} images are {}x{}x{} (H x W x C): each of H, W and C must be at least 1"
                    .format(split, *images.shape[1:]))
        if not np.issubdtype(labels.dtype, np.integer) or labels.shape != images.shape[:1]:
            return (f"{split} labels must be {len(images)} integers for its {len(images)} images, got {labels.dtype} "
                    f"{labels.shape}")
    train = splits["train"][0].shape[1:]
    for split in ("test", "val"):
        if split in splits and splits[split][0].shape[1:] != train:
            return "{} images are {}x{}x{} (H x W x C), train images {}x{}x{}".format(
                split, *splits[split][0].shape[1:], *train)
    return None


def _classes_problem(classes):
    """What is wrong with a class count, or None."""
    classes = np.asarray(classes)
    if classes.shape != () or not np.issubdtype(classes.dtype, np.integer) or classes < 2:
        return f"'classes' must be an integer of at least 2, got {classes}"
    return None


def _labels_problem(split, labels, classes):
    """What is wrong with a split's labels (an integer array) for this class count, or None."""
    if labels.min() < 0 or labels.max() >= classes:
        return f"{split} labels span [{labels.min()}, {labels.max()}], outside the {classes} classes [0, {classes})"
    return None
