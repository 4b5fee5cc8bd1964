"""Print the memory plan of a training step, without allocating it.

    python -m minibp.plan --model resnet1001 --batch 128 --bits 4
    python -m minibp.plan --model resnet164 --batch 128 --bits exact --units     # and each unit's store
    python -m minibp.plan --model resnet1001 --budget 11GiB                      # largest batch per mode
    python -m minibp.plan --model resnet164 --json

The numbers come from Net.plan, the very table the trainer's arena allocates from: a batch "fits"
a budget when the arena's one allocation (every buffer, aligned) is at most the budget.
"""
import argparse
import json
import re
import sys

from . import models
from .arena import format_bytes
from .net import MODE_BITS

SHAPES = {"cifar10": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100), "fashion-mnist": ((28, 28, 1), 10)}
UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_bytes(text):
    """'11GiB', '11 GB', '512MiB', '1e9' -> bytes."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"a size is a number and a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), got {text!r}")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def largest_batch(net, *, mode, budget):
    """The largest batch whose arena fits the budget (0 if not even one image fits).

    Every buffer but the parameters grows linearly with the batch, so two plans predict the answer;
    real plans then confirm it (alignment padding makes the growth only nearly linear)."""
    allocation = lambda batch: net.plan(batch=batch, mode=mode).allocation_bytes  # noqa: E731
    one, two = allocation(1), allocation(2)
    if one > budget:
        return 0
    batch = max(1, (budget - (2 * one - two)) // max(two - one, 1))
    while allocation(batch) > budget:
        batch -= 1
    while allocation(batch + 1) <= budget:
        batch += 1
    return batch


def unit_rows(net, plan):
    """[(unit index, input shape, store bytes)] of the units that keep a store."""
    return [(u.index, u.in_shape, plan[f"store{u.index}"].nbytes) for u in net.units if f"store{u.index}" in plan]


def report(net, *, model, batch, mode, budget=None):
    plan = net.plan(batch=batch, mode=mode)
    result = dict(model=model, batch=batch, mode=mode, units=len(net.units), parameters=net.num_parameters,
                  categories=plan.bytes_by_category(), total_bytes=plan.total_bytes,
                  allocation_bytes=plan.allocation_bytes,
                  unit_stores=[dict(unit=i, input_shape=list(s), bytes=b) for i, s, b in unit_rows(net, plan)])
    if budget is not None:
        result["budget_bytes"] = budget
        result["largest_batch"] = {m: largest_batch(net, mode=m, budget=budget) for m in MODE_BITS}
    return plan, result


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m minibp.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet164")
    parser.add_argument("--data", choices=list(SHAPES), default="cifar10", help="input shape and classes")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--bits", choices=list(MODE_BITS), default="4")
    parser.add_argument("--units", action="store_true", help="also list every unit's store")
    parser.add_argument("--budget", help="e.g. 11GiB: print the largest batch that fits, for each mode")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        input_shape, classes = SHAPES[args.data]
        net = models.by_name(args.model, input_shape=input_shape, classes=classes)
        budget = parse_bytes(args.budget) if args.budget else None
        if args.batch < 1:
            raise ValueError("--batch must be positive")
        plan, result = report(net, model=args.model, batch=args.batch, mode=args.bits, budget=budget)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        if not args.units:
            result.pop("unit_stores")
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.model} on {args.data} ({len(net.units)} units, {net.num_parameters:,} parameters), "
          f"batch {args.batch}, mode {args.bits}")
    print(plan.summary())
    print(f"(one allocation of {format_bytes(plan.allocation_bytes)} with alignment)")
    if args.units:
        print("\nunit  input shape        store")
        for index, shape, nbytes in unit_rows(net, plan):
            print(f"{index:4d}  {str(shape):17s}  {format_bytes(nbytes):>10}")
    if budget is not None:
        print(f"\nlargest batch within {format_bytes(budget)}:")
        for mode, batch in result["largest_batch"].items():
            print(f"  {mode:>6}: {batch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
