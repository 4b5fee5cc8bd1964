"""RQ1: test accuracy of the same net, seeds and schedule trained with every activation store.

    python bench/accuracy.py                          # Fashion-MNIST, ResNet-20, 800 iterations, seeds 0 and 1
    python bench/accuracy.py --modes exact,8:range,naive --seeds 0,1,2
    python bench/accuracy.py --data cifar10 --model resnet164 --iters 64000 \
        --lr-schedule 0:0.01,400:0.1,32000:0.01,48000:0.001
    python bench/accuracy.py --quick --data-dir DIR   # seconds: the CI check that the script runs

A mode is a store as gradients.py names it: exact, naive, or k bits through a window ("4:range",
"4:fixed"), rounded at random with a third part ("2:block:stochastic"), or a memory budget ("memory=323MiB": the
trainer's --memory, which solves each unit's store). Each mode and seed trains with
python3 -m minibp.train into OUT/<data>-<model>-<mode>-seed<s> (resumable: an interrupted bench continues
the runs it finds); the table prints each mode's final test accuracy per seed, their mean, standard
deviation and spread (largest minus smallest), and the mean's difference to exact's (or --baseline's) with
a 95% interval (Student's t over the seeds' paired differences: a seed gives every mode the same initial
weights and data order, so the pairs share most of a seed's luck).
Data: python3 -m minibp.prepare fashion-mnist (or cifar10).

--ledger FILE keeps finished runs across machines: a run whose settings (data, model, iterations, batch,
schedule, augmentation, mode, seed) FILE holds is read from it rather than trained, and every run that
finishes here is added to it, with its validations, the CPU it trained on and minibp's commit. minibp
trains the same weights on any CPU, so a ledger filled over several sessions gives the same table as one
long session would. bench/results/accuracy_ledger.jsonl is the repository's (docs/results.md).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gradients import label, store_options
from options import cpu_model, modes_option, net_options
from minibp import train
from minibp.quant import Store
from minibp.run import checkpoint

DEFAULT_SCHEDULE = "0:0.02,50:0.1,400:0.01,650:0.001"  # warm-up, then steps at 1/2 and 13/16 of 800
# Student's t at 97.5% for 1 to 30 degrees of freedom (a two-sided 95% interval), then the normal's 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def interval(values):
    """(mean, half-width of its 95% interval) of a sample; the half-width is nan for one value."""
    values = np.asarray(values, np.float64)
    if len(values) < 2:
        return float(values.mean()), float("nan")
    t = T_975[len(values) - 2] if len(values) - 1 <= len(T_975) else 1.96
    return float(values.mean()), float(t * values.std(ddof=1) / np.sqrt(len(values)))
MODES = "exact,4:fixed,4:range,4:block,2:fixed,2:range,2:block"


def validations(run):
    """The run's validation records, oldest first (none before its first)."""
    path = Path(run) / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return [r for r in records if r["kind"] == "val"]


def last_validation(run):
    return validations(run)[-1]


# What makes two runs the same run: the settings a ledger record is looked up by.
LEDGER_KEY = ("data", "model", "iters", "batch", "lr_schedule", "augment", "mode", "seed")


def read_ledger(path):
    """The ledger's records by their key; none for a file not there yet. A line that is not a record is an
    error naming the file and line (a hand edit gone wrong), not a run to train again silently."""
    records = {}
    if not path.exists():
        return records
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            key = tuple(record[k] for k in LEDGER_KEY)
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"bench/accuracy.py: {path} line {number} is not a ledger record ({e})") from None
        records[key] = record
    return records


def append_ledger(path, record):
    """Adds a record: the file is written whole to a temporary and renamed, so a full disk or a stop
    leaves the ledger as it was."""
    old = path.read_text() if path.exists() else ""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(old + json.dumps(record) + "\n")
    os.replace(tmp, path)


def commit():
    """minibp's commit, with "+changes" where the checkout has uncommitted ones; "unknown" outside git."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty else "")


def mean_minutes(minutes, mode, seeds):
    """The mean minutes of the mode's runs that trained in this call ("-" when every one had finished before:
    resuming a finished run takes no time). A run interrupted and resumed counts its last part only."""
    trained = [minutes[mode, s] for s in seeds if (mode, s) in minutes]
    return f"{np.mean(trained):.1f}" if trained else "-"


def trainer_store(store):
    """The trainer's options of a mode (gradients.store_options'): --memory, or --bits and its window, rounding and
    clip."""
    if "memory" in store:
        return ["--memory", store["memory"]]
    return ["--bits", store["bits"], *(["--window", store["window"]] if Store(store["bits"]).has_window else []),
            *(["--rounding", store["rounding"]] if store["rounding"] != "nearest" else []),
            *(["--clip", str(store["clip"])] if "clip" in store else [])]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet20", batch=128, data="fashion-mnist", data_dir=True)
    modes_option(parser, MODES)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--iters", type=int, default=800)
    parser.add_argument("--lr-schedule", default=DEFAULT_SCHEDULE)
    parser.add_argument("--augment", default=None, metavar="LIST",
                        help="the runs' --augment (default: the trainer's default for the data)")
    parser.add_argument("--baseline", default="exact", metavar="MODE",
                        help="the mode the paired differences are taken against, one of --modes (default exact)")
    parser.add_argument("--out", default="runs/accuracy")
    parser.add_argument("--ledger", type=Path, default=None, metavar="FILE",
                        help="read finished runs from FILE and add the runs that finish here (not with --quick)")
    parser.add_argument("--quick", action="store_true", help="resnet11, batch 16, 4 iterations: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.iters, args.batch, args.lr_schedule = "resnet11", 4, 16, "0:0.05"
        if args.ledger is not None:
            parser.error("--ledger keeps full runs; a --quick run writes none")
    ledger = read_ledger(args.ledger) if args.ledger is not None else {}
    modes, seeds = args.modes.split(","), [int(s) for s in args.seeds.split(",")]
    if args.baseline not in modes and args.baseline != "exact":
        parser.error(f"--baseline {args.baseline} is not one of --modes {args.modes}")
    accuracy, minutes = {}, {}  # (mode, seed) -> final test accuracy, minutes the run took (if it trained)
    for mode in modes:
        store = store_options(mode)
        for seed in seeds:
            run = Path(args.out) / f"{args.data}-{args.model}-{label(mode).replace(' ', '-')}-seed{seed}"
            settings = dict(data=args.data, model=args.model, iters=args.iters, batch=args.batch,
                            lr_schedule=args.lr_schedule, augment=args.augment or "default", mode=mode, seed=seed)
            known = ledger.get(tuple(settings[k] for k in LEDGER_KEY))
            if known is not None:
                accuracy[mode, seed] = known["accuracy"]
                print(f"=== {label(mode)}, seed {seed}: {100 * known['accuracy']:.2f}% from {args.ledger} "
                      f"(trained {known['date']} on {known['cpu']}, minibp {known['commit']}"
                      + (f"; {known['source']}" if known.get("source") else "") + ")", flush=True)
                continue
            common = ["--out", str(run), "--iters", str(args.iters)]
            if (run / "checkpoint.h5").exists():  # (the data may have moved since: a run keeps its folder's path)
                argv = common + ["--resume", "--data-dir", args.data_dir]
            else:
                argv = common + ["--overwrite",  # a run stopped before its first checkpoint starts again
                                 "--data", args.data, "--data-dir", args.data_dir, "--model", args.model,
                                 "--batch", str(args.batch), *trainer_store(store),
                                 "--lr-schedule", args.lr_schedule, "--seed", str(seed),
                                 *(["--augment", args.augment] if args.augment else []),
                                 "--val-every", str(max(args.iters // 4, 1)),
                                 "--log-every", str(max(args.iters // 40, 1))]
            finished = any(r["iter"] >= args.iters for r in validations(run))
            print(f"=== {label(mode)}, seed {seed}: python3 -m minibp.train {' '.join(argv)}", flush=True)
            start = time.perf_counter()
            # a memory budget counts its whole process: such a run trains in a process of its own
            status = (subprocess.run([sys.executable, "-m", "minibp.train", *argv]).returncode if "memory" in store
                      else train.main(argv))
            if status != 0:
                return status
            accuracy[mode, seed] = last_validation(run)["accuracy"]
            if not finished:  # a run trained before and only resumed at its end says nothing of the time a run takes
                minutes[mode, seed] = (time.perf_counter() - start) / 60
            if args.ledger is not None:
                saved = checkpoint.load(run / "checkpoint.h5").config
                append_ledger(args.ledger, dict(
                    settings, accuracy=accuracy[mode, seed], resolved_augment=saved["augment"],
                    validations=[[r["iter"], r["accuracy"]] for r in validations(run)],
                    cpu=cpu_model(), commit=commit(), date=datetime.date.today().isoformat(),
                    minutes_trained_here=round(minutes[mode, seed], 1) if (mode, seed) in minutes else None))
                print(f"    added to {args.ledger}", flush=True)
    base = args.baseline
    baseline = np.array([100 * accuracy[base, s] for s in seeds]) if base in modes else None
    width = max(11, *(len(label(m)) for m in modes))
    print(f"\n{args.model} on {args.data}, {args.iters} iterations at batch {args.batch}, seeds "
          f"{', '.join(map(str, seeds))}: test accuracy (%); vs {label(base)}: the mean paired difference and its 95% "
          "interval")
    print(f"{'mode':>{width}}  " + "  ".join(f"{'seed ' + str(s):>7}" for s in seeds)
          + f"  {'mean':>6}  {'std':>5}  {'spread':>6}  {'vs ' + label(base):>16}  {'minutes a run':>13}")
    for mode in modes:
        values = np.array([100 * accuracy[mode, s] for s in seeds])
        if baseline is not None and mode != base:
            diff, half = interval(values - baseline)
            versus = f"{diff:+6.2f} +- {half:4.2f}" if half == half else f"{diff:+6.2f}"
        else:
            versus = "-"
        std = values.std(ddof=1) if len(values) > 1 else float("nan")
        print(f"{label(mode):>{width}}  " + "  ".join(f"{v:7.2f}" for v in values)
              + f"  {values.mean():6.2f}  {std:5.2f}  {np.ptp(values):6.2f}  {versus:>16}  "
              + f"{mean_minutes(minutes, mode, seeds):>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
