"""Plots: training and validation curves of runs, and the per-unit memory of a plan.

    python3 -m minibp.plot runs/fm-4bit                      # writes runs/fm-4bit/curves.png
    python3 -m minibp.plot runs/fm-exact runs/fm-4bit        # several runs: writes ./curves.png
    python3 -m minibp.plot --plan resnet164 --batch 128 --bits 4          # writes ./plan-resnet164-4.png
    python3 -m minibp.plot runs/a runs/b --labels exact,4 --out fig.png  # a file and legend names of your own

Curves come from each RUN/metrics.jsonl. A run's store, read from its checkpoint, gives its colour
(its bits) and line style (its window), so that many runs stay apart; runs that share a store, or whose
checkpoint cannot be read, get a colour each instead. Legends sit below the axes, never over data.
Needs matplotlib: the plot extra (or the images extra), as extras.install_command says.
"""
import argparse
import os
import sys
from pathlib import Path

from . import cli, extras
from .integrity import atomic_file
from .run.options import add_option
from .run.folder import numbered_records

BITS_COLORS = {"exact": "k", "naive": "C3", "8": "C0", "4": "C1", "2": "C2"}
WINDOW_STYLES = {"fixed": ":", "range": "--", "block": "-"}
INSTALL = extras.install_command("plot")  # how to get matplotlib, in this environment


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit(extras.missing("plot", "minibp.plot needs matplotlib"))
    return plt


def store_style(bits, window):
    """Line colour and style of a store: a colour per precision, a line style per window (exact and naive
    have one store each: solid)."""
    return dict(color=BITS_COLORS[str(bits)], ls="-" if str(bits) in ("exact", "naive") else WINDOW_STYLES[window])


def run_styles(runs):
    """A line style per run: its store's (store_style), if every run's checkpoint names a store of its own;
    otherwise a colour per run, and a line style per ten runs."""
    from .run import checkpoint
    stores = []
    for run in runs:
        try:
            config = checkpoint.load(Path(run) / "checkpoint.h5").config
            stores.append((str(config["bits"]), config["window"]))
        except (OSError, ValueError, KeyError):  # no checkpoint yet, or one this minibp cannot read
            stores.append(None)
    if None not in stores and len(set(stores)) == len(stores):
        return [store_style(*store) for store in stores]
    return [dict(color=f"C{i % 10}", ls=("-", "--", ":", "-.")[i // 10 % 4]) for i in range(len(runs))]


def legend_below(fig, handles, *, columns=4):
    """One legend for the figure, under its axes: it covers no data however many entries it has (savefig
    with bbox_inches="tight" makes room for it)."""
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(columns, len(handles)),
               fontsize=8, frameon=False, handlelength=3.5)  # long enough to show a dotted or dashed line


def plot_runs(runs, *, out, labels=None):
    """Write the curves of runs (curves_figure) to out; the path written (save)."""
    return save(curves_figure(runs, labels=labels), out)


def curve_records(path):
    """The train and val records of a metrics file, each checked to have the iteration, loss and accuracy
    a curve needs: anything else is a ValueError naming the file's line, so no curve is drawn from a guess.
    A validation that failed (its loss not finite: the trainer logs it with an "error") has no point to draw."""
    path = Path(path)
    kept = []
    for number, record in numbered_records(path):
        where = f"{path}:{number}"
        if "kind" not in record:
            raise ValueError(f"{where} is a record without 'kind': the metrics file is damaged")
        kind = record["kind"]
        if kind not in ("train", "val") or (kind == "val" and "error" in record):  # resume records, failures
            continue
        for key in ("iter", "loss", "accuracy"):
            if key not in record:
                raise ValueError(f"{where} is a {kind} record without {key!r}: the metrics file is damaged")
            value = record[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):  # NaN and inf are numbers: drawn
                raise ValueError(f"{where} is a {kind} record whose {key} is {value!r}, not a number: the "
                                 "metrics file is damaged")
        kept.append(record)
    return kept


def curves_figure(runs, *, labels=None):
    """Loss and accuracy against iteration: training (thin) and validation (thick, with markers) of every
    run, a style per run (run_styles), one legend below the axes."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    every = [curve_records(Path(run) / "metrics.jsonl") for run in runs]  # all checked before a figure is made
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    handles = []
    for i, (run, style, records) in enumerate(zip(runs, run_styles(runs), every)):
        for kind, width in (("train", dict(lw=0.8, alpha=0.5)), ("val", dict(marker="o", ms=4, lw=2))):
            rows = [r for r in records if r["kind"] == kind]
            its = [r["iter"] for r in rows]
            loss_ax.plot(its, [r["loss"] for r in rows], **style, **width)
            acc_ax.plot(its, [r["accuracy"] for r in rows], **style, **width)
        handles.append(Line2D([], [], lw=2, label=labels[i] if labels else Path(run).name, **style))
    handles += [Line2D([], [], color="grey", lw=0.8, alpha=0.5, label="training (thin)"),
                Line2D([], [], color="grey", lw=2, marker="o", ms=4, label="validation (markers)")]
    for ax, name in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        ax.set_xlabel("iteration")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    loss_ax.set_yscale("log")
    fig.tight_layout()
    legend_below(fig, handles)
    return fig


def with_suffix(out):
    """out as save writes it: a name without a suffix gets .png (as matplotlib would, but said here, so that the
    path returned and printed is the file's)."""
    return out if os.path.splitext(out)[1][1:] else Path(os.fspath(out).rstrip(".") + ".png")


def save(fig, out, *, replace=True):
    """Write fig to out whole (integrity.atomic_file), with room for a legend outside its axes, and close it;
    the path written. Its format is out's suffix's (with_suffix). replace=False: FileExistsError where out is
    there, whenever it appeared."""
    out = with_suffix(out)
    try:  # whole, never through a link (a run folder may be shared)
        with atomic_file(out, replace=replace) as tmp, open(tmp, "wb") as f:
            fig.savefig(f, format=os.path.splitext(out)[1][1:].lower(), dpi=90, bbox_inches="tight")
    finally:
        pyplot().close(fig)
    return out


def plot_plan(model, *, batch, bits, out, data="cifar10"):
    """Each unit's store, and the shared buffers as one bar, in MiB, of a training step at this batch in one pass."""
    from . import models
    from .run.sizing import unit_rows
    plt = pyplot()
    shape, classes = models.DATA_SHAPES[data]
    net = models.by_name(model, input_shape=shape, classes=classes)
    plan = net.plan(pass_images=batch, bits=bits)
    rows = unit_rows(net, plan)
    fig, ax = plt.subplots(figsize=(11, 3.5))
    ax.bar([i for i, _, _ in rows], [b / 2**20 for _, _, b in rows], width=1.0, color="C0")
    ax.set_xlabel("unit")
    ax.set_ylabel("store (MiB)")
    categories = plan.bytes_by_category()
    ax.set_title(f"{model}, batch {batch}, bits {bits}: stores {categories['activation stores'] / 2**30:.2f} GiB "
                 f"of {plan.total_bytes / 2**30:.2f} GiB planned")
    fig.tight_layout()
    return save(fig, out)


def default_out(args):
    """Where a plot goes without --out: beside a single run's metrics, else in the current folder."""
    if args.plan:
        return Path(f"plan-{args.plan}-{args.bits}.png")
    return Path(args.runs[0]) / "curves.png" if len(args.runs) == 1 else Path("curves.png")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m minibp.plot", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="run folders with metrics.jsonl")
    parser.add_argument("--out", help="the PNG to write, .png added to a name without a suffix (default: "
                                      "RUN/curves.png for one run, curves.png for several, plan-MODEL-BITS.png for "
                                      "--plan; the last two in the current folder)")
    parser.add_argument("--labels", help="comma-separated legend names, one per run (default: the folders' names)")
    parser.add_argument("--plan", metavar="MODEL", help="plot the per-unit stores of this model's plan instead")
    add_option(parser, "batch", help="--plan's batch (default 128)")
    add_option(parser, "bits", help="--plan's store (default 4)")
    args = parser.parse_args(argv)
    try:
        if not args.plan and not args.runs:
            raise ValueError("give run folders to plot, or --plan MODEL")
        out = Path(args.out) if args.out else default_out(args)
        if args.plan:
            out = plot_plan(args.plan, batch=args.batch, bits=args.bits, out=out)
        else:
            for run in args.runs:  # every run checked before anything is drawn
                if not (Path(run) / "metrics.jsonl").is_file():
                    raise FileNotFoundError(f"no metrics at {Path(run) / 'metrics.jsonl'}: is {run} a run folder of "
                                            "python3 -m minibp.train?")
            labels = args.labels.split(",") if args.labels else None
            if labels and len(labels) != len(args.runs):
                raise ValueError(f"{len(labels)} labels for {len(args.runs)} runs")
            out = plot_runs(args.runs, out=out, labels=labels)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
