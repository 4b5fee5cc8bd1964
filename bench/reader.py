"""Images per second of the ImageNet reader (minibp/io/imagenet.py) on a generated tree of JPEGs.

    python bench/reader.py                                  # 2000 JPEGs of about 400x350, 1 and 2 workers
    python bench/reader.py --images 20000 --workers 1,2,4,8 --tree /tmp/inet   # the tree is kept for reuse

Generates the tree once (ImageNet's layout, 10 classes; smooth random pictures with some grain, Pillow
quality 90, about ImageNet's mean size and file size), then times: listing it; training batches
(random-resized crop and flip to --size, normalised) through Batches.next() for each worker count,
after a first batch that pays the workers' start; evaluation batches (resize, center crop); and the
same decoding in this process alone, for scale.
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from minibp.io import imagenet


def make_tree(root, *, images, classes=10, seed=0):
    """images JPEGs under root/train/<class>/ and a tenth as many under root/val/<class>/ (kept if there)."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", images), ("val", max(classes, images // 10))):
        for i in range(count):
            path = Path(root) / split / f"n{i % classes:08d}" / f"{split}_{i:07d}.JPEG"
            if path.exists():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            width, height = int(rng.integers(300, 501)), int(rng.integers(250, 451))
            coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)  # smooth shapes, then grain
            picture = np.asarray(Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC), np.int16)
            picture = np.clip(picture + rng.normal(0, 40, picture.shape), 0, 255).astype(np.uint8)
            Image.fromarray(picture).save(path, quality=90)


def rate(count, seconds):
    return f"{count / seconds:8.1f} images/s"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=2000, help="training JPEGs to generate (default 2000)")
    parser.add_argument("--tree", help="where to generate them (default: a temporary folder)")
    parser.add_argument("--workers", default="1,2", help="worker counts to time (default 1,2)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.tree or scratch)
        start = time.perf_counter()
        make_tree(root, images=args.images)
        print(f"tree {root}: {args.images} training JPEGs ({time.perf_counter() - start:.1f} s to generate or check)")
        start = time.perf_counter()
        train, val = imagenet.load_folders(root)
        listing = time.perf_counter() - start
        sizes = [(root / "train" / f.decode()).stat().st_size for f in train.files[:200]]
        files = len(train) + len(val)
        print(f"listing {files} files: {listing * 1e3:.0f} ms, {listing / files * 1e6:.1f} us a file; "
              f"mean JPEG {np.mean(sizes) / 1e3:.0f} kB")

        batches_timed = max(1, len(train) // args.batch - 1)
        for workers in (int(w) for w in args.workers.split(",")):
            with imagenet.Batches(train, batch=args.batch, size=args.size, seed=0, workers=workers) as batches:
                start = time.perf_counter()
                batches.next()
                first = time.perf_counter() - start
                start = time.perf_counter()
                for _ in range(batches_timed):
                    batches.next()
                seconds = time.perf_counter() - start
            print(f"train, {workers} worker{'s' if workers > 1 else ' '}: {rate(batches_timed * args.batch, seconds)} "
                  f"({batches_timed} batches of {args.batch} at {args.size}x{args.size}; the first batch, with the "
                  f"workers' start: {first:.2f} s)")
            start = time.perf_counter()
            count = sum(len(labels) for _, labels in imagenet.evaluation_batches(val, batch=args.batch, size=args.size,
                                                                               workers=workers))
            print(f"val,   {workers} worker{'s' if workers > 1 else ' '}: {rate(count, time.perf_counter() - start)} "
                  f"({count} images, the workers' start included)")

        items = [(f, (0, 0, i)) for i, f in enumerate(train.files[:max(1, min(len(train), 4 * args.batch))].tolist())]
        start = time.perf_counter()
        imagenet.decode_chunk(train.root, args.size, items)
        print(f"decoding in this process alone: {rate(len(items), time.perf_counter() - start)}")


if __name__ == "__main__":
    main()
