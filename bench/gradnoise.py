"""RQ4: the gradient error of the approximation next to the noise of SGD itself.

    python bench/gradnoise.py                       # Fashion-MNIST, ResNet-20, points 0, 100, 400, 800
    python bench/gradnoise.py --model resnet56 --points 0,1000,4000 --batches 16
    python bench/gradnoise.py --quick               # seconds, random data, plot to a temporary folder
    python bench/gradnoise.py --modes 4:range,2:range --points 0,100,400 --clip 4:3,2:2.5   # other clips
    python bench/gradnoise.py --modes 4:block --points 0,400 --below-weight 1     # half the bins below zero
    python bench/gradnoise.py --modes 4:block,2:block,2:fixed --points 0,400 --systematic   # is the error a bias?

An exact-mode net trains with SGD on bench/accuracy.py's schedule (800 iterations: the last point is the
end of that schedule); at each point its weights are copied into nets of every mode (k bits through
the fixed, range or block window: gradients.py). Per layer (each unit's conv weights): the error
||g_k - g_exact|| of the approximate gradient on one batch, and the SGD noise: the spread
sqrt(mean_i ||g_i - mean g||^2) of exact gradients over --batches other batches. The paper reports the
error one to two orders of magnitude below the noise. Prints, per point and mode, the median and worst
ratio error/noise over the layers as norms and as variances (the squares: the share of gradient
variance the approximation adds), and plots the ratio along the net to --plot.

--systematic also takes each mode's error e_i on every one of the batches (the noise's and the first) and
prints, per layer, the share of it that every batch repeats: ||mean_i e_i|| / sqrt(mean_i ||e_i||^2), which is
1 for an error that is the same on every batch (a bias, which SGD does not average away) and
1/sqrt(batches + 1) for errors independent from batch to batch.
"""
import argparse
import sys

import numpy as np

from accuracy import DEFAULT_SCHEDULE
from options import modes_option, net_options, seed_option
from gradients import compile_modes, copy_weights, label, line_style, out_path, pyplot_or_none, weight_gradients
from minibp import quant
from minibp.io import data
from minibp.io.batches import Batches
from minibp.plot import legend_below, save
from minibp.optim import SGD
from minibp.run.schedule import parse_schedule

MODES = "8:fixed,8:range,8:block,4:fixed,4:range,4:block,2:fixed,2:range,2:block"


def repeated_share(errors):
    """||mean_i e_i|| / sqrt(mean_i ||e_i||^2) of the errors e_i (vectors) of one layer on several batches."""
    errors = np.asarray(errors, np.float64)
    return float(np.linalg.norm(errors.mean(axis=0)) / max(np.sqrt(np.mean(np.sum(errors ** 2, axis=1))), 1e-300))


def print_table(title, values, columns):
    """A row per (point, mode) of values {(point, mode): per-layer array}: columns are (name, f, format)."""
    print(title)
    print(f"{'iteration':>9}  {'mode':>8}  " + "  ".join(f"{name:>9}" for name, _, _ in columns))
    for (point, mode), r in values.items():
        print(f"{point:9d}  {label(mode):>8}  " + "  ".join(f"{f(r):9{spec}}" for _, f, spec in columns))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet20", batch=128, data="fashion-mnist", data_dir=True)
    modes_option(parser, MODES)
    parser.add_argument("--points", default="0,100,400,800", help="iterations of training at which to measure")
    parser.add_argument("--batches", type=int, default=8, help="batches the SGD noise is measured over")
    parser.add_argument("--lr-schedule", default=DEFAULT_SCHEDULE)
    seed_option(parser)
    parser.add_argument("--clip", help="K:SIGMA,...: the range and block windows' clip at k bits for this run, in "
                        f"place of minibp's choices (quant.RANGE_CLIP: {quant.RANGE_CLIP}, "
                        f"quant.BLOCK_CLIP: {quant.BLOCK_CLIP})")
    parser.add_argument("--below-weight", type=float, help="the range and block windows' weight of the coding error "
                        f"below zero for this run, in place of quant.BELOW_WEIGHT ({quant.BELOW_WEIGHT:.4g}; 1 splits "
                        "a symmetric channel's bins in half)")
    parser.add_argument("--systematic", action="store_true",
                        help="also the share of the error that repeats from batch to batch (--batches + 1 more "
                        "approximate gradients a mode and point)")
    parser.add_argument("--plot", help="default bench/results/gradnoise.png (other settings: a temporary folder)")
    parser.add_argument("--quick", action="store_true",
                        help="resnet11, batch 8, points 0 and 2, 3 batches, random data")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    modes = args.modes.split(",")
    for item in args.clip.split(",") if args.clip else []:  # an experiment: the kernels read the table each step
        k, clip = item.split(":")
        quant.RANGE_CLIP[int(k)] = quant.BLOCK_CLIP[int(k)] = float(clip)
    if args.below_weight is not None:
        quant.BELOW_WEIGHT = args.below_weight
    if args.quick:
        args.model, args.batch, args.batches, points = "resnet11", 8, 3, [0, 2]
        images = rng.standard_normal((64, 8, 8, 1)).astype(np.float32)
        split = data.Split((images * 40 + 128).clip(0, 255).astype(np.uint8), rng.integers(0, 10, 64), 10, "random")
    else:
        points = [int(p) for p in args.points.split(",")]
        split = data.load_split(data.dataset_path(args.data_dir, args.data), "train")
    schedule = parse_schedule(args.lr_schedule, iters=max(max(points), 1))
    mean = split.pixel_mean()
    shape = split.images.shape[1:]
    nets = compile_modes(args.model, ["exact"] + modes, input_shape=shape, classes=split.classes,
                         batch=args.batch, seed=args.seed)
    exact = nets["exact"]
    optimizer = SGD(exact)
    train_batches = Batches(split, batch=args.batch, mean=mean, augment=True, seed=args.seed)
    probe_batches = Batches(split, batch=args.batch, mean=mean, augment=False, seed=args.seed + 1)
    iteration, ratios, repeats = 0, {}, {}  # (point, mode) -> error/noise, and the repeated share, of each layer
    for point in points:
        while iteration < point:  # train the exact net up to this point
            exact.zero_grad()
            exact.forward(*train_batches.next())
            exact.backward()
            optimizer.step(lr=schedule.rate(iteration))
            iteration += 1
        batches = [probe_batches.next() for _ in range(args.batches + 1)]
        reference = weight_gradients(exact, *batches[0])
        others = [weight_gradients(exact, *b) for b in batches[1:]]
        units = sorted(reference)
        noise = np.array([np.sqrt(np.mean([np.sum((g[u] - np.mean([o[u] for o in others], axis=0)) ** 2)
                                           for g in others])) for u in units])
        for mode in modes:
            copy_weights(exact, nets[mode])
            approx = weight_gradients(nets[mode], *batches[0])
            ratios[point, mode] = np.array([np.linalg.norm(approx[u] - reference[u]) for u in units]) / noise
            if args.systematic:
                approximations = [approx] + [weight_gradients(nets[mode], *b) for b in batches[1:]]
                repeats[point, mode] = np.array([repeated_share([a[u] - g[u] for a, g in zip(
                    approximations, [reference] + others)]) for u in units])
        print(f"iteration {point}: " + "  ".join(
            f"{label(m)}: median {np.median(ratios[point, m]):.4f}" for m in modes), flush=True)
    print_table(f"\n{args.model}, batch {args.batch}: ||g_approx - g_exact|| / SGD noise per layer, over {len(units)} "
                f"layers ({args.batches} batches for the noise); as norms, and squared (variances)", ratios,
                [("median", np.median, ".4f"), ("max", np.max, ".4f"), ("median^2", lambda r: np.median(r) ** 2, ".5f"),
                 ("max^2", lambda r: np.max(r) ** 2, ".5f")])
    if args.systematic:
        independent = 1 / np.sqrt(args.batches + 1)
        print_table(f"\nthe share of the error every batch repeats, ||mean_i e_i|| / rms_i ||e_i|| over "
                    f"{args.batches + 1} batches, per layer (independent errors: {independent:.3f}; a bias: 1)",
                    repeats, [("median", np.median, ".3f"), ("min", np.min, ".3f"), ("max", np.max, ".3f")])
    plt = pyplot_or_none()
    if plt is not None:
        fig, axes = plt.subplots(1, len(points), figsize=(4 * len(points), 3.6), sharey=True, squeeze=False)
        for ax, point in zip(axes[0], points):
            for mode in modes:
                ax.plot(ratios[point, mode], label=f"{label(mode)}", **line_style(mode))
            ax.axhline(1.0, color="k", lw=0.8, label="the SGD noise (1)")
            ax.axhline(0.1, color="k", lw=0.5, ls=(0, (1, 4)), label="a tenth of it (0.1)")
            ax.set(title=f"iteration {point}", xlabel="layer (unit)", yscale="log")
            ax.grid(alpha=0.3)
        axes[0][0].set(ylabel="approximation error / SGD noise")
        fig.tight_layout()
        legend_below(fig, axes[0][0].get_legend_handles_labels()[0], columns=6)
        path = save(fig, out_path(args.plot, default="bench/results/gradnoise.png", parser=parser, args=args))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
