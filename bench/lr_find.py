"""Does the rate python3 -m minibp.lr_find suggests train as well as a hand grid of rates?

    python bench/lr_find.py            # Fashion-MNIST (ResNet-20) and drawn shapes (ResNet-11), seeds 0 and 1
    python bench/lr_find.py --quick    # seconds: tiny shapes, one seed; the check that the script runs
    python bench/lr_find.py --shapes shapes.h5   # only write the drawn shapes the bench trains on, to look closer

For each data set and seed, the range test (python3 -m minibp.lr_find, both optimizers, its default 200 steps)
suggests a cosine schedule for SGD and one for AdamW; each trains for ITERS iterations at batch BATCH, and so does
each rate of a hand grid (SGD 0.03, 0.1, 0.3; AdamW 3e-4, 1e-3, 3e-3; the same cosine with a warm-up over 5% of
the run), every run with python3 -m minibp.train in a process of its own, in a temporary folder, and scored by
python3 -m minibp.evaluate on the test split (its best.h5: the run validates once, at its end, on a validation
split: Fashion-MNIST's is --val-split 0.1, the shapes' their file's own). The table gives each run's test
accuracy, and the suggestion against the grid's best rate of the same optimizer (and of either optimizer): the
goal is within 1 point of it, or better.

The shapes: 5 classes (circle, square, triangle, line, cross) drawn on 32x32 RGB images, each at a random place
and size, in a random colour on a random background with noise; 5,000 training images, 500 validation, 1,000
test, written with minibp.io.data.write into the temporary folder.

Without --quick the table is written to bench/results/lr_find.txt (docs/results.md).
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from options import cpu_model
from minibp.io import data
from minibp.lr_find import WARMUP

ROOT = Path(__file__).resolve().parent.parent
ITERS, BATCH, SEEDS = 200, 64, (0, 1)
GRID = dict(sgd=(0.03, 0.1, 0.3), adamw=(3e-4, 1e-3, 3e-3))
SHAPES = ("circle", "square", "triangle", "line", "cross")
GOAL = 1.0  # points: the suggestion within this of the grid's best
SHAPES_SIZE = dict(train=5000, val=500, test=1000)  # the shapes' splits


def draw_shapes(n, *, size=32, rng):
    """(images (n, size, size, 3) uint8, labels (n,)): a shape of SHAPES a label, at a random place and size, in a
    random colour on a random background, with noise."""
    labels = rng.integers(0, len(SHAPES), n)
    y, x = np.mgrid[:size, :size].astype(np.float32)
    images = np.empty((n, size, size, 3), np.uint8)
    for i, label in enumerate(labels):
        r = rng.uniform(0.16, 0.3) * size
        cx, cy = rng.uniform(r + 1, size - r - 1, 2)
        dx, dy = x - cx, y - cy
        if SHAPES[label] == "circle":
            mask = dx ** 2 + dy ** 2 <= r ** 2
        elif SHAPES[label] == "square":
            mask = (abs(dx) <= 0.8 * r) & (abs(dy) <= 0.8 * r)
        elif SHAPES[label] == "triangle":  # pointing up
            mask = (dy >= -r) & (dy <= r) & (abs(dx) <= (dy + r) / 2)
        elif SHAPES[label] == "line":  # at any angle
            angle = rng.uniform(0, np.pi)
            along, across = dx * np.cos(angle) + dy * np.sin(angle), -dx * np.sin(angle) + dy * np.cos(angle)
            mask = (abs(across) <= 1.2) & (abs(along) <= r)
        else:  # a cross
            mask = ((abs(dx) <= 1.2) & (abs(dy) <= r)) | ((abs(dy) <= 1.2) & (abs(dx) <= r))
        colour = rng.integers(0, 256, 3)
        background = (colour + 128 + rng.integers(-60, 61, 3)) % 256  # apart from the colour in every channel
        image = np.where(mask[..., None], colour, background) + rng.normal(0, 20, (size, size, 3))
        images[i] = np.clip(image, 0, 255).astype(np.uint8)
    return images, labels


def write_shapes(path, *, train, val, test, size=32, seed=0):
    rng = np.random.default_rng(seed)
    data.write(path, train=draw_shapes(train, size=size, rng=rng), val=draw_shapes(val, size=size, rng=rng),
               test=draw_shapes(test, size=size, rng=rng), classes=len(SHAPES), class_names=list(SHAPES),
               name="shapes")
    return path


def python(*argv):
    """stdout of python3 argv in the checkout; exits with its output where it fails."""
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"error: {' '.join(argv[:3])} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def suggested(options, *, seed, iters, steps):
    """{optimizer: peak} of lr_find's suggestion for a run of these options."""
    out = python("-m", "minibp.lr_find", *options, "--seed", str(seed), "--iters", str(iters), "--steps", str(steps))
    peaks = dict(re.findall(r"--optimizer (\w+) --iters \d+ --lr-schedule cosine:([0-9.e+-]+):warmup=", out))
    if set(peaks) != set(GRID):
        sys.exit(f"error: lr_find suggested rates for {sorted(peaks)}, not for {sorted(GRID)}:\n{out[-3000:]}")
    return {k: float(v) for k, v in peaks.items()}


def accuracy(options, *, optimizer, peak, seed, iters, out):
    """Test accuracy (%) of a run of these options, this optimizer and cosine peak, trained and evaluated in
    processes of their own."""
    schedule = f"cosine:{peak:g}:warmup={max(1, round(WARMUP * iters))}"
    python("-m", "minibp.train", *options, "--seed", str(seed), "--optimizer", optimizer, "--iters", str(iters),
           "--lr-schedule", schedule, "--val-every", str(iters), "--checkpoint-every", str(iters), "--log-every",
           str(iters), "--out", str(out))
    return 100 * json.loads(python("-m", "minibp.evaluate", str(out), "--json"))["accuracy"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one seed, a few iterations; writes nothing")
    parser.add_argument("--data-dir", default=str(ROOT / "data"), help="where fashion-mnist.h5 is (default data)")
    parser.add_argument("--shapes", metavar="FILE", help="write the bench's shapes (its full size) to FILE, and stop")
    args = parser.parse_args(argv)
    if args.shapes:
        print(f"wrote {write_shapes(Path(args.shapes), **SHAPES_SIZE)}")
        return 0
    iters, batch, seeds, steps = (10, 16, (0,), 40) if args.quick else (ITERS, BATCH, SEEDS, 200)
    rows, began = [], time.time()
    with tempfile.TemporaryDirectory(prefix="lr_find_bench.") as tmp:
        shapes = write_shapes(Path(tmp) / "shapes.h5", **(dict(train=256, val=16, test=32, size=16) if args.quick else
                                                          SHAPES_SIZE))
        sets = [("shapes", "resnet11", ["--data-file", str(shapes)])]
        if not args.quick:
            fm = Path(args.data_dir) / "fashion-mnist.h5"
            if not fm.is_file():
                sys.exit(f"error: no {fm}: python3 -m minibp.prepare fashion-mnist")
            sets.insert(0, ("fashion-mnist", "resnet20", ["--data", "fashion-mnist", "--data-dir", args.data_dir,
                                                          "--augment", "none", "--val-split", "0.1"]))
        for name, model, options in sets:
            options = options + ["--model", model, "--batch", str(batch)]
            for seed in seeds:
                peaks = suggested(options, seed=seed, iters=iters, steps=steps)
                for optimizer, grid in GRID.items():
                    scores = {}
                    for peak in grid + (peaks[optimizer],):
                        scores[peak] = accuracy(options, optimizer=optimizer, peak=peak, seed=seed, iters=iters,
                                                out=Path(tmp) / f"{name}-{seed}-{optimizer}-{peak:g}")
                        print(f"{name} seed {seed} {optimizer} {peak:g}: {scores[peak]:.2f}% "
                              f"({(time.time() - began) / 60:.1f} min)", flush=True)
                    rows.append(dict(data=name, model=model, seed=seed, optimizer=optimizer, peak=peaks[optimizer],
                                     grid=[scores[p] for p in grid], suggested=scores[peaks[optimizer]]))
    text = report(rows, iters=iters, batch=batch, minutes=(time.time() - began) / 60)
    print(text)
    if not args.quick:
        out = ROOT / "bench" / "results" / "lr_find.txt"
        out.write_text(text + "\n")
        print(f"wrote {out.relative_to(ROOT)}")
    return 0


def report(rows, *, iters, batch, minutes):
    """The markdown table of the runs, and the count of suggestions within GOAL of the grid's best."""
    lines = [f"Test accuracy (%) after {iters} iterations at batch {batch} (cosine, warm-up {WARMUP:.0%}), the "
             f"suggested peak against a grid; {cpu_model()}, {minutes:.0f} min.", "",
             "| data (net) | seed | optimizer | " + " | ".join(f"grid {i + 1}" for i in range(3)) +
             " | suggested | vs its optimizer's best | vs the best of both |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    within = within_both = 0
    for row in rows:
        both = max(max(r["grid"]) for r in rows if (r["data"], r["seed"]) == (row["data"], row["seed"]))
        mine = row["suggested"] - max(row["grid"])
        ours = max(r["suggested"] for r in rows if (r["data"], r["seed"]) == (row["data"], row["seed"])) - both
        within += mine >= -GOAL
        within_both += ours >= -GOAL
        grid = " | ".join(f"{p:g}: {a:.2f}" for p, a in zip(GRID[row["optimizer"]], row["grid"]))
        lines.append(f"| {row['data']} ({row['model']}) | {row['seed']} | {row['optimizer']} | {grid} | "
                     f"{row['peak']:.2g}: {row['suggested']:.2f} | {mine:+.2f} | {ours:+.2f} |")
    pairs = len({(r["data"], r["seed"]) for r in rows})
    lines += ["", f"within {GOAL:g} point of its optimizer's best grid rate, or better: {within} of {len(rows)}; the "
              f"better of the two suggestions within {GOAL:g} point of the best grid run of either optimizer: "
              f"{within_both // len(GRID)} of {pairs}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
