"""RQ1: test accuracy of the same net, seed and schedule trained in every activation mode.

    python bench/accuracy.py                          # Fashion-MNIST, ResNet-20, 800 iterations a mode
    python bench/accuracy.py --data cifar10 --model resnet164 --iters 64000 \
        --lr-schedule 0:0.01,400:0.1,32000:0.01,48000:0.001
    python bench/accuracy.py --quick --data-dir DIR   # seconds: the CI check that the script runs

Each mode trains with python -m minibp.train into OUT/<mode> (resumable: an interrupted bench
continues the runs it finds), then the table prints the final test accuracy of each mode and its
difference to exact. Data: python datasets/prepare.py fashion-mnist (or cifar10).
"""
import argparse
import json
import sys
import time
from pathlib import Path

from minibp import train

DEFAULT_SCHEDULE = "0:0.02,50:0.1,400:0.01,650:0.001"  # warm-up, then steps at 1/2 and 13/16 of 800


def last_validation(run):
    records = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r["kind"] == "val"][-1]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--model", default="resnet20")
    parser.add_argument("--modes", default="exact,8,4,2,naive")
    parser.add_argument("--iters", type=int, default=800)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--lr-schedule", default=DEFAULT_SCHEDULE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/accuracy")
    parser.add_argument("--quick", action="store_true", help="resnet11, batch 16, 4 iterations: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.iters, args.batch, args.lr_schedule = "resnet11", 4, 16, "0:0.05"
    modes = args.modes.split(",")
    rows = []
    for mode in modes:
        run = Path(args.out) / f"{args.data}-{args.model}-{mode}"
        common = ["--out", str(run), "--iters", str(args.iters)]
        if (run / "checkpoint.h5").exists():
            argv = common + ["--resume"]
        else:
            argv = common + ["--overwrite",  # a run stopped before its first checkpoint starts again
                             "--data", args.data, "--data-dir", args.data_dir, "--model", args.model, "--bits", mode,
                             "--batch", str(args.batch), "--lr-schedule", args.lr_schedule, "--seed", str(args.seed),
                             "--val-every", str(max(args.iters // 4, 1)), "--log-every", str(max(args.iters // 40, 1))]
        print(f"=== mode {mode}: python -m minibp.train {' '.join(argv)}", flush=True)
        start = time.perf_counter()
        status = train.main(argv)
        if status != 0:
            return status
        val = last_validation(run)
        rows.append((mode, val["iter"], val["accuracy"], time.perf_counter() - start))
    exact = {mode: accuracy for mode, _, accuracy, _ in rows}.get("exact")
    print(f"\n{args.model} on {args.data}, {args.iters} iterations at batch {args.batch}, seed {args.seed}")
    print(f"{'mode':>6}  {'test accuracy':>13}  {'vs exact':>9}  {'minutes':>7}")
    for mode, _, accuracy, seconds in rows:
        diff = f"{100 * (accuracy - exact):+8.2f}" if exact is not None else "        -"
        print(f"{mode:>6}  {100 * accuracy:12.2f}%  {diff} pt  {seconds / 60:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
