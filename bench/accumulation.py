"""RQ2: does the approximation's error accumulate with depth? Exact forward (minibp) vs naive.

    python bench/accumulation.py                       # Fashion-MNIST batch, ResNet-11 ... ResNet-164
    python bench/accumulation.py --depths 20,164,1001 --batch 32
    python bench/accumulation.py --quick               # seconds, random data, plot to a temporary folder

For every depth, nets in modes exact, 8 and 4 bits through the windows (gradients.py) and naive
share their initial weights and see the same batch; the relative error ||g - g_exact|| / ||g_exact||
of each unit's weight gradient is taken. Prints mean and first-unit error per depth and mode, and
plots error against depth, and along the deepest net, to --plot.
"""
import argparse
import sys

import numpy as np

from gradients import (compile_modes, label, line_style, out_path, pyplot_or_none, relative_error, sample_batch,
                       weight_gradients)
from minibp.plot import legend_below, save
from options import modes_option, net_options, seed_option

MODES = "8:fixed,8:range,4:fixed,4:range,4:block,naive"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model=None, batch=64, data="fashion-mnist", data_dir=True)
    parser.add_argument("--depths", default="11,20,56,110,164", help="the ResNets' depths (default 11,20,56,110,164)")
    seed_option(parser)
    modes_option(parser, MODES)
    parser.add_argument("--plot", help="default bench/results/accumulation.png (other settings: a temporary folder)")
    parser.add_argument("--quick", action="store_true", help="depths 11 and 20, batch 8, random 8x8 data")
    args = parser.parse_args(argv)
    depths = [11, 20] if args.quick else [int(d) for d in args.depths.split(",")]
    modes = args.modes.split(",")
    batch = 8 if args.quick else args.batch
    images, labels, classes = sample_batch(args.data, args.data_dir, quick=args.quick, batch=batch, seed=args.seed)
    errors = {}  # (depth, mode) -> [error of unit 0, 1, ...]
    for depth in depths:
        nets = compile_modes(f"resnet{depth}", ["exact"] + modes, input_shape=images.shape[1:], classes=classes,
                             batch=batch, seed=args.seed)
        exact = weight_gradients(nets["exact"], images, labels)
        for mode in modes:
            approx = weight_gradients(nets[mode], images, labels)
            errors[depth, mode] = [relative_error(approx[i], exact[i]) for i in sorted(exact)]
        print(f"depth {depth}: " + "  ".join(f"{label(m)} mean {np.mean(errors[depth, m]):.4f}" for m in modes),
              flush=True)
    print(f"\nrelative error of weight gradients vs exact, batch {batch}, seed {args.seed}")
    print(f"{'depth':>5}  " + "  ".join(f"{label(m) + ' mean':>13}  {label(m) + ' unit 0':>15}" for m in modes))
    for depth in depths:
        print(f"{depth:5d}  " + "  ".join(f"{np.mean(errors[depth, m]):13.4f}  {errors[depth, m][0]:15.4f}"
                                           for m in modes))
    plt = pyplot_or_none()
    if plt is not None:  # three panels, a curve per mode in each: the mean and the first unit apart
        fig, (mean, first, by_unit) = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
        for mode in modes:
            style = dict(label=label(mode), **line_style(mode))
            mean.plot(depths, [np.mean(errors[d, mode]) for d in depths], marker="o", **style)
            first.plot(depths, [errors[d, mode][0] for d in depths], marker="s", **style)
            by_unit.plot(errors[depths[-1], mode], lw=1, **style)
        mean.set(title="mean over the units", xlabel="depth", ylabel="relative error of dL/dW", xscale="log",
                 yscale="log")
        first.set(title="unit 0 (the farthest from the loss)", xlabel="depth", xscale="log")
        by_unit.set(title=f"each unit of resnet{depths[-1]}", xlabel="unit")
        for ax in (mean, first):  # the depths themselves as ticks, not powers of ten
            ax.set_xticks(depths, [str(d) for d in depths])
            ax.set_xticks([], minor=True)
        for ax in (mean, first, by_unit):
            ax.grid(alpha=0.3)
        fig.tight_layout()
        legend_below(fig, mean.get_legend_handles_labels()[0], columns=len(modes))
        path = save(fig, out_path(args.plot, default="bench/results/accumulation.png", parser=parser, args=args))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
