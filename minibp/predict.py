"""Predict with a trained run: the classes of raw images, from the command line (minibp.load from Python).

    python3 -m minibp.predict runs/mine images.npy                  # uint8 (N, H, W, C), or one (H, W, C)
    python3 -m minibp.predict runs/mine data/mine.h5 --split val    # a data file's split: also its accuracy
    python3 -m minibp.predict runs/mine a.png b.jpg                 # image files (Pillow: the imagenet extra)
    python3 -m minibp.predict runs/mine shapes/test                 # a folder of them; CLASS/ subfolders: accuracy
    python3 -m minibp.predict runs/mine images.npy --out preds.csv  # index,class,name,probability per image
    python3 -m minibp.predict runs/mine images.npy --out preds.npz  # classes (N,), probabilities (N, classes)
    python3 -m minibp.predict runs/mine images.npy --out preds.csv --overwrite   # replace the file written before

The run's best.h5 is used where it has one (--which last: its checkpoint.h5), as evaluate does. Images go in
raw, as the data file holds them; the run's own preprocessing is applied (run/trained.py). Image files
(.png, .jpg, .tif) are decoded as python3 -m minibp.prepare folder decodes them (io/images.py's decode):
upright (EXIF), at 8 bits, grey or RGB as the run's images are, and resized to the run's H x W where they
differ, by the --resize its data file was made with (said, with how many). A folder's images are read with its
subfolders' (links followed, hidden folders left out and counted, as prepare reads a class folder); where
every one lies below a subfolder named after one of the run's classes, that is its label, and the accuracy is
printed, else one line says why there is none. --which chooses among a run folder's checkpoints, and is
refused with a checkpoint file. An .npy
file is checked from its header before it is read (uint8 images, a size the file holds and the memory takes);
nothing is ever unpickled. --out is written whole (a temporary file renamed), never over an existing file
unless --overwrite, and never through a symbolic link. Exit status: 0 done, 1 a write failed, 2 a bad option or
input file.
"""
import argparse
import csv
import os
import sys
from pathlib import Path

import numpy as np

from . import backend, cli
from .arena import format_bytes
from .integrity import atomic_file, check_own
from .io import data
from .io import images as image_files
from .kernels import KernelError
from .run.modelspec import MODEL_HELP
from .run.trained import load

SHOWN_FILES = 20  # image files up to this many get a line each


def read_arrays(path, split):
    """(images, labels or None) of an .npy file of raw images or a data file's split."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    if path.suffix == ".npy":
        return read_npy(path), None
    chosen = data.load_split(path, split)
    return chosen.images, chosen.labels


IMAGES = "give raw uint8 images (N, H, W, C) or one image (H, W, C)"


def read_npy(path):
    """The uint8 images (N, H, W, C) or image (H, W, C) of an .npy file, its header checked before anything else
    is read: a ValueError of one line for a file that is not one, or holds no such images, or declares more than
    it holds or than the memory takes."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ValueError(f"{path} is not a NumPy array file (.npy: {e.strerror or e})") from None
    with f:  # the very file checked is the one read
        shape, dtype, held = _npy_header(path, f)
        _check_npy(path, shape, dtype, held)
        f.seek(0)
        return np.lib.format.read_array(f, allow_pickle=False)


def _npy_header(path, f):
    """(shape, dtype, bytes after the header) of the .npy file open as f; a ValueError where it is not one."""
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"format {version[0]}.{version[1]}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(f)
        return shape, dtype, os.fstat(f.fileno()).st_size - f.tell()
    except (ValueError, OSError, EOFError) as e:  # (never numpy's advice on pickles: nothing is unpickled here)
        why = str(e).split(";")[0].split("\n")[0]
        raise ValueError(f"{path} is not a NumPy array file (.npy: {why})") from None


def _check_npy(path, shape, dtype, held):
    """A ValueError for a header that declares no uint8 images, more than the file holds, or more than the
    memory takes."""
    if dtype.hasobject:
        raise ValueError(f"{path} holds Python objects ({dtype}), which minibp never reads: {IMAGES}")
    if dtype != np.uint8:
        raise ValueError(f"{path} holds {dtype} values: {IMAGES}, as the data file holds them")
    if len(shape) not in (3, 4):
        what = "a single value" if not shape else f"an array of {len(shape)} dimension{'s' * (len(shape) > 1)} {shape}"
        raise ValueError(f"{path} holds {what}, not images: {IMAGES}")
    declared = int(np.prod(shape, dtype=object))
    if declared > held:
        raise ValueError(f"{path} declares {shape} uint8 ({format_bytes(declared)}) but holds {format_bytes(held)}: "
                         "it is cut short or damaged")
    free = backend.host_memory()
    if free is not None and declared > free:
        raise ValueError(f"{path} holds {format_bytes(declared)} of images, more than the {format_bytes(free)} of "
                         "memory available: predict them in parts")


def list_images(inputs):
    """([(image file, the folder below a given folder it lies under, or None)], hidden folders left out) of image
    files and folders of them, in order: a folder read as prepare reads a class folder (images.walk)."""
    found, hidden = [], 0
    for given in map(Path, inputs):
        if given.is_dir():
            files, _, below = image_files.walk(given)
            hidden += below
            if not files:
                raise ValueError(f"{given} holds no .png, .jpg or .tif images")
            found += [(p, p.relative_to(given).parts[0] if p.parent != given else None) for p in files]
        elif given.is_file() and image_files.is_image(given):
            found.append((given, None))
        else:
            raise (FileNotFoundError if not given.exists() else ValueError)(
                f"{given}: give an .npy file of uint8 images (N, H, W, C), an .h5 data file, or image files "
                f"({', '.join(image_files.EXTENSIONS)}) and folders of them")
    return found, hidden


def read_images(found, shape, class_names, resize=image_files.RESIZE):
    """(images (N, H, W, C) uint8 of the run's shape, labels or None, resized count, why there are no labels or
    None) of list_images' files, resized by resize; the labels where every file lies under a folder named after
    one of the run's classes (why: where files lie in folders, but not so)."""
    images = np.stack([image_files.decode(p, size=shape[:2], channels=shape[2], resize=resize) for p, _ in found])
    resized = sum(image_files.header(p)[0] != tuple(shape[:2]) for p, _ in found)
    folders = [folder for _, folder in found]
    loose = sum(folder is None for folder in folders)
    unknown = sorted({folder for folder in folders if folder is not None and folder not in (class_names or ())})
    if loose == len(folders):  # image files, or a folder of them: no classes to read
        return images, None, resized, None
    if loose:
        why = f"{loose} of the {len(folders)} images lie{'s' * (loose == 1)} in no class folder"
    elif not class_names:
        why = "the run's data has no class names to match the folders against"
    elif unknown:
        why = (f"folder class{'es' * (len(unknown) > 1)} {', '.join(unknown)} {'are' if len(unknown) > 1 else 'is'} "
               f"not the run's ({', '.join(class_names)})")
    else:
        return images, np.array([class_names.index(folder) for folder in folders]), resized, None
    return images, None, resized, f"no accuracy: {why}"


def check_out(path, *, overwrite):
    """A ValueError, before any work, for an --out that is not .csv or .npz, is a link or not a file, or exists
    where overwrite is not given."""
    if Path(path).suffix not in (".csv", ".npz"):
        raise ValueError(f"--out {path}: give a .csv or an .npz file")
    check_own(path)
    if os.path.lexists(path) and not overwrite:
        raise ValueError(f"--out {path} exists: give --overwrite to replace it, or another file")


def write_predictions(path, classes, probabilities, names, files=None, *, overwrite=False):
    """--out: a CSV (index, class, name, probability of that class, and for image files the file) or an .npz
    (classes, probabilities, and for image files files), written whole (integrity.atomic_file); FileExistsError
    where overwrite is not given and a file is there."""
    path = Path(path)
    named = {} if files is None else dict(files=np.array(files))
    with atomic_file(path, replace=overwrite) as tmp:
        if path.suffix == ".npz":
            with open(tmp, "wb") as f:  # (a file: np.savez would add .npz to a name)
                np.savez(f, classes=classes, probabilities=probabilities, **named)
        else:
            with open(tmp, "w", newline="") as f:
                out = csv.writer(f)
                out.writerow(["index", "class", "name", "probability"] + ["file"] * bool(named))
                for i, (c, p) in enumerate(zip(classes, probabilities)):
                    out.writerow([i, int(c), names[c] if names else "", f"{p[c]:.6f}"] + ([files[i]] if files else []))


def parser():
    p = argparse.ArgumentParser(prog="python3 -m minibp.predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a run folder, or a checkpoint file")
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="an .npy of raw uint8 images (N, H, W, C), an .h5 data "
                                                              "file, or image files and folders of them")
    p.add_argument("--split", choices=data.SPLITS, default="test", help="an .h5 data file's split (default test)")
    p.add_argument("--which", choices=["best", "last"], help="best.h5 or checkpoint.h5 (default: best.h5 where "
                                                             "the run has one)")
    p.add_argument("--out", help="write the predictions: .csv (one row an image) or .npz (default: none)")
    p.add_argument("--overwrite", action="store_true", help="replace an --out file that exists (default: refused)")
    p.add_argument("--batch", type=int, default=256, help="images a forward pass (default 256)")
    p.add_argument("--model", metavar="SPEC", help=MODEL_HELP)
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    arrays = [p for p in args.inputs if Path(p).suffix in (".npy", ".h5")]
    files = None
    try:
        if args.batch < 1:
            raise ValueError(f"--batch must be positive, got {args.batch}")
        if args.out:
            check_out(args.out, overwrite=args.overwrite)
        if arrays and len(args.inputs) > 1:
            raise ValueError(f"give one .npy or .h5 file alone, or image files and folders ({arrays[0]} is among "
                             f"{len(args.inputs)} inputs)")
        found, hidden = (None, 0) if arrays else list_images(args.inputs)
        images, labels = read_arrays(arrays[0], args.split) if arrays else (None, None)
        count = len(images) if arrays else len(found)
        model = load(args.run, which=args.which, batch=min(args.batch, max(count, 1)), model=args.model)
        why = None
        if not arrays:
            resize = model.resize or image_files.RESIZE
            images, labels, resized, why = read_images(found, model.input_shape, model.class_names, resize)
            files = [str(p) for p, _ in found]
            if hidden:
                print(image_files.HIDDEN.format(hidden))
            if resized:
                print(f"resized {resized} of {len(found)} images to the run's "
                      f"{'x'.join(map(str, model.input_shape[:2]))} (H x W) by {resize} " +
                      ("(as its data file's were)" if model.resize else f"(the default: the run's data file "
                       f"{model.data_path}, which says how its images were resized, is gone or changed)"))
        classes, probabilities = model.predict(images)
    except (ValueError, FileNotFoundError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report(model, classes, probabilities, labels, files, args)
    if why:
        print(why)
    if args.out:
        try:
            write_predictions(args.out, classes, probabilities, model.class_names, files, overwrite=args.overwrite)
        except FileExistsError:
            print(f"error: --out {args.out} appeared while predict ran: nothing written over it (--overwrite "
                  "replaces it)", file=sys.stderr)
            return 2
        except OSError as e:
            print(f"error: cannot write {args.out} ({e.strerror or e})", file=sys.stderr)
            return 1
        print(f"wrote {args.out}")
    return 0


def report(model, classes, probabilities, labels, files, args):
    """What predict prints: the checkpoint, the count of each class predicted, a line an image file (up to
    SHOWN_FILES), the accuracy where the labels are known."""
    names = model.class_names
    name = (lambda c: names[c]) if names else str
    counts = np.bincount(classes, minlength=model.net.classes)
    print(f"{model.path} (iteration {model.iteration}): {len(classes):,} image{'s' * (len(classes) != 1)}; "
          "predicted " + ", ".join(f"{name(c)} {n}" for c, n in enumerate(counts) if n))
    if files and len(files) <= SHOWN_FILES:
        for file, c, p in zip(files, classes, probabilities):
            print(f"  {file}: {name(c)} ({p[c]:.3f})")
    if labels is not None:
        where = f"the {args.split} split of {args.inputs[0]}" if files is None else "the images' class folders"
        print(f"accuracy {np.mean(classes == labels):.4f} on {where}")


if __name__ == "__main__":
    sys.exit(cli.run(main))
