"""Plots: training and validation curves of runs, and the per-unit memory of a plan.

    python -m minibp.plot runs/fm-exact runs/fm-4bit --out curves.png      # from each RUN/metrics.jsonl
    python -m minibp.plot --plan resnet164 --batch 128 --bits 4 --out plan.png

Needs matplotlib: pip install 'minibp[plot]'.
"""
import argparse
import json
import sys
from pathlib import Path


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("minibp.plot needs matplotlib: pip install 'minibp[plot]' (or pip install matplotlib)")
    return plt


def read_metrics(run):
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics at {path}: is {run} a run folder of python -m minibp.train?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_runs(runs, out, *, labels=None):
    """Loss and accuracy against iteration: training (thin) and validation (markers) of every run."""
    plt = _pyplot()
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for i, run in enumerate(runs):
        records = read_metrics(run)
        label = labels[i] if labels else Path(run).name
        for kind, style in (("train", dict(lw=1, alpha=0.7)), ("val", dict(marker="o", lw=2))):
            rows = [r for r in records if r["kind"] == kind]
            if rows:
                color = f"C{i}"
                its = [r["iter"] for r in rows]
                loss_ax.plot(its, [r["loss"] for r in rows], color=color, label=f"{label} {kind}", **style)
                acc_ax.plot(its, [r["accuracy"] for r in rows], color=color, label=f"{label} {kind}", **style)
    for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    loss_ax.set_yscale("log")
    acc_ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def plot_plan(model, *, batch, bits, out, data="cifar10"):
    """Each unit's store, and the shared buffers as one bar, in MiB."""
    from . import models
    from .plan import SHAPES, unit_rows
    plt = _pyplot()
    shape, classes = SHAPES[data]
    net = models.by_name(model, input_shape=shape, classes=classes)
    plan = net.plan(batch=batch, bits=bits)
    rows = unit_rows(net, plan)
    fig, ax = plt.subplots(figsize=(11, 3.5))
    ax.bar([i for i, _, _ in rows], [b / 2**20 for _, _, b in rows], width=1.0, color="C0")
    ax.set_xlabel("unit")
    ax.set_ylabel("store (MiB)")
    categories = plan.bytes_by_category()
    ax.set_title(f"{model}, batch {batch}, bits {bits}: stores {categories['activation stores'] / 2**30:.2f} GiB "
                 f"of {plan.total_bytes / 2**30:.2f} GiB planned")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minibp.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="run folders with metrics.jsonl")
    parser.add_argument("--out", required=True, help="the PNG to write")
    parser.add_argument("--labels", help="comma-separated legend names, one per run")
    parser.add_argument("--plan", metavar="MODEL", help="plot the per-unit stores of this model's plan instead")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--bits", default="4")
    args = parser.parse_args(argv)
    try:
        if args.plan:
            plot_plan(args.plan, batch=args.batch, bits=args.bits, out=args.out)
        elif args.runs:
            labels = args.labels.split(",") if args.labels else None
            if labels and len(labels) != len(args.runs):
                raise ValueError(f"{len(labels)} labels for {len(args.runs)} runs")
            plot_runs(args.runs, args.out, labels=labels)
        else:
            raise ValueError("give run folders to plot, or --plan MODEL")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
