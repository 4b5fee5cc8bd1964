"""Print the memory plan of a training step, without allocating it.

    python -m minibp.plan --model resnet1001 --batch 128 --bits 4
    python -m minibp.plan --model resnet164 --batch 128 --bits exact --units     # and each unit's store
    python -m minibp.plan --model resnet1001 --budget 11GiB                      # largest batch per mode
    python -m minibp.plan --model resnet164 --json
    python -m minibp.plan --model resnet152 --data imagenet --batch 256 --bits 4   # the ImageNet ResNets
    python -m minibp.plan --model resnet1001 --budget 11GiB --device gpu         # the GPU's plan, from a CPU

The numbers come from Net.plan, the very table the trainer's arena allocates from: a batch "fits"
a budget when the arena's one allocation (every buffer, aligned) is at most the budget. The devices'
plans differ only in the convolution workspace (the GPU's im2col covers the whole batch, the CPU works
a chunk of images at a time); --device plans for either, whatever this machine has.
"""
import contextlib
import argparse
import json
import math
import os
import re
import signal
import sys

from . import backend, models
from .arena import format_bytes
from .params import key
from .quant import BITS, DEFAULT_WINDOW, WINDOWS

SHAPES = {"cifar10": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100), "fashion-mnist": ((28, 28, 1), 10),
          "imagenet": ((224, 224, 3), 1000)}
UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40,
         "p": 2**50, "pb": 10**15, "pib": 2**50}
MAX_BUDGET = 2**50      # 1 PiB: beyond any machine, and every buffer size stays far inside int64
MAX_BATCH = 2**31 - 1   # the largest batch the search reports
FAR = 2**20             # a batch far enough from 1 that alignment padding barely tilts the predicted slope


def parse_bytes(text):
    """'11GiB', '11 GB', '512MiB', '1e9' -> bytes (int)."""
    match = re.fullmatch(r"\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"a size is a number and a unit (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB), "
                         f"got {text!r}")
    value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if not math.isfinite(value):
        raise ValueError(f"size {text!r} is not a finite number of bytes")
    return int(value)


def check_budget(budget):
    """A budget in bytes as an int; ValueError unless it is positive and at most MAX_BUDGET."""
    if not budget > 0:  # NaN too
        raise ValueError(f"a budget must be a positive number of bytes, got {budget}")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget:.3g} bytes is beyond any machine (at most 1 PiB)")
    return int(budget)


def largest_batch(net, *, bits, budget, training=True, window=DEFAULT_WINDOW):
    """The largest batch (at most MAX_BATCH) whose arena fits the budget; 0 if not even one image fits.

    The arena grows with the batch, monotonically and nearly linearly (alignment padding and reduction
    chunks aside): plans at batch 1 and FAR predict the answer, a bracket widened from the prediction by
    doubling steps and then a bisection pin it down in O(log(error)) more plans, whatever the budget."""
    budget = check_budget(budget)
    allocation = lambda batch: net.plan(batch=batch, bits=bits, window=window,  # noqa: E731
                                        training=training).allocation_bytes
    fits = lambda batch: allocation(batch) <= budget  # noqa: E731
    one = allocation(1)
    if one > budget:
        return 0
    per_image = max(1, (allocation(FAR) - one) / (FAR - 1))
    guess = int(min(MAX_BATCH, max(1, 1 + (budget - one) // per_image)))
    lo, hi, step = 1, MAX_BATCH + 1, 1  # lo fits; hi does not (beyond the cap counts as not fitting)
    if fits(guess):
        lo = guess
        while lo + step < hi and fits(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(hi, lo + step)
    else:
        hi = guess
        while hi - step > lo and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(lo, hi - step)
    while hi - lo > 1:
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if fits(middle) else (lo, middle)
    return lo


def unit_rows(net, plan):
    """[(unit index, input shape, store bytes)] of the units that keep a store (the block window's windows
    included)."""
    return [(u.index, u.in_shape, sum(plan[key(u.index, role)].nbytes for role in ("store", "windows")
                                      if key(u.index, role) in plan))
            for u in net.units if key(u.index, "store") in plan]


def report(net, *, model, batch, bits, window=DEFAULT_WINDOW, budget=None):
    plan = net.plan(batch=batch, bits=bits, window=window)
    result = dict(model=model, batch=batch, bits=bits, window=window, units=len(net.units),
                  parameters=net.num_parameters, categories=plan.bytes_by_category(), total_bytes=plan.total_bytes,
                  allocation_bytes=plan.allocation_bytes,
                  unit_stores=[dict(unit=i, input_shape=list(s), bytes=b) for i, s, b in unit_rows(net, plan)])
    if budget is not None:
        result["budget_bytes"] = budget
        result["largest_batch"] = {m: largest_batch(net, bits=m, window=window, budget=budget) for m in BITS}
    return plan, result


@contextlib.contextmanager
def planning_for(device):
    """Plans made inside follow that device's code paths (layers read backend.device to size workspaces);
    nothing is allocated, so no such device is needed."""
    actual, backend.device = backend.device, device
    try:
        yield
    finally:
        backend.device = actual


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minibp.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="resnet<9n+2> (default resnet164); with --data imagenet resnet50, "
                        "resnet101 or resnet152 (default)")
    parser.add_argument("--data", choices=list(SHAPES), default="cifar10",
                        help="input shape and classes; imagenet: 224x224x3, 1000 classes and the ImageNet ResNets")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--bits", choices=list(BITS), default="4")
    parser.add_argument("--window", choices=list(WINDOWS), default=DEFAULT_WINDOW, help="the k-bit codes' window")
    parser.add_argument("--units", action="store_true", help="also list every unit's store")
    parser.add_argument("--budget", help="e.g. 11GiB: print the largest batch that fits, for each store")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="plan for this device's code paths "
                        f"(default: this process's, {backend.device})")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        input_shape, classes = SHAPES[args.data]
        args.model = args.model or ("resnet152" if args.data == "imagenet" else "resnet164")
        net = models.by_name(args.model, imagenet=args.data == "imagenet", input_shape=input_shape, classes=classes)
        budget = check_budget(parse_bytes(args.budget)) if args.budget is not None else None
        if args.batch < 1:
            raise ValueError("--batch must be positive")
        with planning_for(args.device or backend.device):
            plan, result = report(net, model=args.model, batch=args.batch, bits=args.bits, window=args.window,
                                  budget=budget)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        if not args.units:
            result.pop("unit_stores")
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.model} on {args.data} ({len(net.units)} units, {net.num_parameters:,} parameters), "
          f"batch {args.batch}, bits {args.bits}" + (f", {args.window} window" if BITS[args.bits] else ""))
    print(plan.summary())
    print(f"(one allocation of {format_bytes(plan.allocation_bytes)} with alignment)")
    if args.units:
        print("\nunit  input shape        store")
        for index, shape, nbytes in unit_rows(net, plan):
            print(f"{index:4d}  {str(shape):17s}  {format_bytes(nbytes):>10}")
    if budget is not None:
        print(f"\nlargest batch within {format_bytes(budget)}:")
        for bits, batch in result["largest_batch"].items():
            print(f"  {bits:>6}: {batch}" + (" (the cap)" if batch == MAX_BATCH else ""))
    return 0


def run():
    """main() as a command: a reader that stops reading (`| head`) ends it quietly, with the status a program
    killed by SIGPIPE has."""
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here, not in the flush at exit
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit writes there
        status = 128 + signal.SIGPIPE
    return status


if __name__ == "__main__":
    sys.exit(run())
