"""Predict with a trained run: the classes of raw images, from the command line (minibp.load from Python).

    python3 -m minibp.predict runs/mine images.npy                  # uint8 (N, H, W, C), or one (H, W, C)
    python3 -m minibp.predict runs/mine data/mine.h5 --split val    # a data file's split: also its accuracy
    python3 -m minibp.predict runs/mine images.npy --out preds.csv  # index,class,name,probability per image
    python3 -m minibp.predict runs/mine images.npy --out preds.npz  # classes (N,), probabilities (N, classes)

The run's best.h5 is used where it has one (--which last: its checkpoint.h5). Images go in raw, as the
data file holds them; the run's own preprocessing is applied (run/trained.py). Exit status: 0 done, 1 a write
failed, 2 a bad option or input file.
"""
import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from .io import data
from .kernels import KernelError
from .run.trained import load


def read_images(path, split):
    """(images, labels or None) of an .npy file of raw images or a data file's split."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False), None
        except (ValueError, OSError) as e:
            raise ValueError(f"{path} is not a NumPy array file ({e})") from None
    if path.suffix == ".h5":
        chosen = data.load_split(path, split)
        return chosen.images, chosen.labels
    raise ValueError(f"{path}: give an .npy file of uint8 images (N, H, W, C) or an .h5 data file")


def write_predictions(path, classes, probabilities, names):
    """--out: a CSV (index, class, name, probability of that class) or an .npz (classes, probabilities)."""
    path = Path(path)
    if path.suffix == ".npz":
        np.savez(path, classes=classes, probabilities=probabilities)
    elif path.suffix == ".csv":
        with open(path, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["index", "class", "name", "probability"])
            for i, (c, p) in enumerate(zip(classes, probabilities)):
                out.writerow([i, int(c), names[c] if names else "", f"{p[c]:.6f}"])
    else:
        raise ValueError(f"--out {path}: give a .csv or an .npz file")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m minibp.predict", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder, or a checkpoint file")
    parser.add_argument("file", help="an .npy of raw uint8 images (N, H, W, C), or an .h5 data file")
    parser.add_argument("--split", choices=data.SPLITS, default="test", help="the data file's split (default test)")
    parser.add_argument("--which", choices=["best", "last"], help="best.h5 or checkpoint.h5 (default: best.h5 where "
                                                                  "the run has one)")
    parser.add_argument("--out", help="write the predictions: .csv (one row an image) or .npz (default: none)")
    parser.add_argument("--batch", type=int, default=256, help="images a forward pass (default 256)")
    args = parser.parse_args(argv)
    try:
        if args.batch < 1:
            raise ValueError(f"--batch must be positive, got {args.batch}")
        if args.out and Path(args.out).suffix not in (".csv", ".npz"):
            raise ValueError(f"--out {args.out}: give a .csv or an .npz file")
        images, labels = read_images(args.file, args.split)
        model = load(args.run, which=args.which, batch=min(args.batch, max(len(images), 1)))
        classes, probabilities = model.predict(images)
    except (ValueError, FileNotFoundError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    names = model.class_names
    counts = np.bincount(classes, minlength=model.net.classes)
    print(f"{model.path} (iteration {model.iteration}): {len(classes):,} images; predicted "
          + ", ".join(f"{names[c] if names else c} {n}" for c, n in enumerate(counts) if n))
    if labels is not None:
        print(f"accuracy {np.mean(classes == labels):.4f} on the {args.split} split of {args.file}")
    if args.out:
        try:
            write_predictions(args.out, classes, probabilities, names)
        except OSError as e:
            print(f"error: cannot write {args.out} ({e.strerror or e})", file=sys.stderr)
            return 1
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
