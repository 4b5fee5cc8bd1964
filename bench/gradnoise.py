"""RQ4: the gradient error of the approximation next to the noise of SGD itself.

    python bench/gradnoise.py                       # Fashion-MNIST, ResNet-20, points at 0, 100, 400 iterations
    python bench/gradnoise.py --model resnet56 --points 0,1000,4000 --batches 16
    python bench/gradnoise.py --quick               # seconds, random data

An exact-mode net trains with SGD; at each point its weights are copied into nets of modes 8 and 4.
Per layer (each unit's conv weights): the error ||g_k - g_exact|| of the approximate gradient on one
batch, and the SGD noise: the spread sqrt(mean_i ||g_i - mean g||^2) of exact gradients over --batches
other batches. The paper reports the error one to two orders of magnitude below the noise. Prints the
median and worst ratio error/noise per point and mode, and plots the ratio along the net to --plot.
"""
import argparse
import sys

import numpy as np

from minibp import data
from minibp.optim import SGD
from gradients import compile_modes, copy_weights, out_path, pyplot_or_none, weight_gradients

MODES = ("8", "4")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--points", default="0,100,400", help="iterations of training at which to measure")
    parser.add_argument("--batches", type=int, default=8, help="batches the SGD noise is measured over")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", default="bench/results/gradnoise.png")
    parser.add_argument("--quick", action="store_true",
                        help="resnet11, batch 8, points 0 and 2, 3 batches, random data")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.quick:
        args.model, args.batch, args.batches, points = "resnet11", 8, 3, [0, 2]
        images = rng.standard_normal((64, 8, 8, 1)).astype(np.float32)
        split = data.Split((images * 40 + 128).clip(0, 255).astype(np.uint8), rng.integers(0, 10, 64), 10, "random")
    else:
        points = [int(p) for p in args.points.split(",")]
        split = data.load_split(data.dataset_path(args.data_dir, args.data), "train")
    mean = split.pixel_mean()
    shape = split.images.shape[1:]
    nets = compile_modes(args.model, ("exact",) + MODES, input_shape=shape, classes=split.classes,
                         batch=args.batch, seed=args.seed)
    exact = nets["exact"]
    optimizer = SGD(exact)
    train_batches = data.Batches(split, batch=args.batch, mean=mean, augment=True, seed=args.seed)
    probe_batches = data.Batches(split, batch=args.batch, mean=mean, augment=False, seed=args.seed + 1)
    iteration, results = 0, {}
    for point in points:
        while iteration < point:  # train the exact net up to this point
            exact.zero_grad()
            exact.forward(*train_batches.next())
            exact.backward()
            optimizer.step(lr=args.lr)
            iteration += 1
        batches = [probe_batches.next() for _ in range(args.batches + 1)]
        reference = weight_gradients(exact, *batches[0])
        others = [weight_gradients(exact, *b) for b in batches[1:]]
        units = sorted(reference)
        noise = np.array([np.sqrt(np.mean([np.sum((g[u] - np.mean([o[u] for o in others], axis=0)) ** 2)
                                           for g in others])) for u in units])
        for mode in MODES:
            copy_weights(exact, nets[mode])
            approx = weight_gradients(nets[mode], *batches[0])
            error = np.array([np.linalg.norm(approx[u] - reference[u]) for u in units])
            results[point, mode] = error / noise
        print(f"iteration {point}: " + "  ".join(
            f"{m}: median error/noise {np.median(results[point, m]):.4f}" for m in MODES), flush=True)
    print(f"\n{args.model}, batch {args.batch}: ||g_approx - g_exact|| / SGD noise, per layer over "
          f"{len(units)} layers ({args.batches} batches for the noise)")
    print(f"{'iteration':>9}  " + "  ".join(f"{m + ' median':>9}  {m + ' max':>7}" for m in MODES))
    for point in points:
        print(f"{point:9d}  " + "  ".join(f"{np.median(results[point, m]):9.4f}  {np.max(results[point, m]):7.4f}"
                                           for m in MODES))
    plt = pyplot_or_none()
    if plt is not None:
        fig, ax = plt.subplots(figsize=(9, 4))
        for i, point in enumerate(points):
            for mode, style in zip(MODES, ("--", "-")):
                ax.plot(results[point, mode], style, color=f"C{i}", label=f"{mode} bits, iteration {point}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set(xlabel="layer (unit)", ylabel="approximation error / SGD noise", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_path(args.plot), dpi=90)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
