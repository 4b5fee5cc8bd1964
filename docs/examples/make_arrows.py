"""The README's own-images example data: folders of drawn arrows, in the layout python3 -m minibp.prepare folder reads.

    python3 docs/examples/make_arrows.py [FOLDER]     # default: the current folder

writes, under FOLDER:
    arrows/train|val|test/CLASS/*.png|jpg    4 classes (left, right, up, down): 32x32 RGB arrows of random colour,
                                             size and place on a noisy background; a fifth of them JPEGs
    arrows5/train|val|test/CLASS/...         the same 4 and a fifth class, cross: the fine-tune's other data
    new/CLASS/...                            20 more images, sorted by class, to predict (with their accuracy)

Every image is drawn from one seed, so the folders are the same on every machine. Needs Pillow (the images extra).
"""
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

SIZE = 32
CLASSES = ("left", "right", "up", "down")
COUNTS = dict(train=200, val=40, test=40)  # images a class in each split


def arrow(rng, direction):
    """One SIZE x SIZE RGB image of an arrow pointing `direction` (or a cross)."""
    background = rng.integers(0, 90, 3)
    pixels = np.clip(background + rng.normal(0, 12, (SIZE, SIZE, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    draw = ImageDraw.Draw(image)
    colour = tuple(int(c) for c in rng.integers(140, 256, 3))
    half = int(rng.integers(7, 12))                  # half the arrow's length
    cx, cy = (int(c) for c in rng.integers(half + 2, SIZE - half - 2, 2))
    width = int(rng.integers(2, 4))
    if direction == "cross":
        draw.line([(cx - half, cy - half), (cx + half, cy + half)], fill=colour, width=width)
        draw.line([(cx - half, cy + half), (cx + half, cy - half)], fill=colour, width=width)
        return image
    dx, dy = dict(left=(-1, 0), right=(1, 0), up=(0, -1), down=(0, 1))[direction]
    tip = (cx + dx * half, cy + dy * half)
    draw.line([(cx - dx * half, cy - dy * half), tip], fill=colour, width=width)
    head = half // 2 + 2  # the head's two strokes, back from the tip and out to each side
    for side in (-1, 1):
        draw.line([tip, (tip[0] - dx * head + dy * side * head, tip[1] - dy * head + dx * side * head)],
                  fill=colour, width=width)
    return image


def write_folder(root, classes, counts, rng):
    """root/SPLIT/CLASS/NNNN.png (a fifth .jpg), counts: {split: images a class} ('' : no split folder)."""
    for split, count in counts.items():
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                image = arrow(rng, name)
                if i % 5 == 4:
                    image.save(folder / f"{i:04d}.jpg", quality=90)
                else:
                    image.save(folder / f"{i:04d}.png")


def main(argv):
    out = Path(argv[0]) if argv else Path(".")
    rng = np.random.default_rng(0)
    write_folder(out / "arrows", CLASSES, COUNTS, rng)
    write_folder(out / "arrows5", CLASSES + ("cross",), COUNTS, rng)
    write_folder(out / "new", CLASSES, {"": 5}, rng)
    print(f"wrote {out / 'arrows'}, {out / 'arrows5'} and {out / 'new'}")


if __name__ == "__main__":
    main(sys.argv[1:])
