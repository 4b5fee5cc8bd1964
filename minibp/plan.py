"""Print the memory plan of a training step, without allocating it.

    python3 -m minibp.plan --model resnet1001 --batch 128 --bits 4
    python3 -m minibp.plan --model resnet164 --batch 128 --bits exact --units     # and each unit's store
    python3 -m minibp.plan --model resnet1001 --budget 11GiB                      # largest batch per mode
    python3 -m minibp.plan --model resnet164 --json
    python3 -m minibp.plan --model resnet152 --data imagenet --batch 256 --bits 4   # the ImageNet ResNets
    python3 -m minibp.plan --model resnet1001 --budget 11GiB --device gpu         # the GPU's plan, from a CPU

The numbers come from Net.plan, the very table the trainer's arena allocates from: a batch "fits"
a budget when the arena's one allocation (every buffer, aligned) is at most the budget. The devices'
plans differ only in the convolution workspace (the GPU's im2col covers the whole batch, the CPU works
a chunk of images at a time); --device plans for either, whatever this machine has.
"""
import contextlib
import argparse
import json
import sys

from . import backend, cli, models
from .arena import format_bytes
from .io import data
from .quant import BITS, Store
from .run import config, modelspec
from .run.options import IMAGENET_DEFAULTS, add_option, default_of, parse_model_arg
from .run.sizing import MAX_BATCH, check_budget, largest_batch, parse_bytes, unit_rows


def report(net, *, model, batch, store, budget=None, optimizer="sgd", grad_norm=False):
    """(the plan of a training step at this batch and store, the dict --json prints); with a budget, the
    largest batch of every store's precision, through the same window. optimizer, grad_norm: Net.plan's."""
    planned = dict(optimizer=optimizer, grad_norm=grad_norm)
    plan = net.plan(batch=batch, store=store, **planned)
    result = dict(model=model, batch=batch, bits=store.bits, window=store.window, units=len(net.units),
                  parameters=net.num_parameters, categories=plan.bytes_by_category(), total_bytes=plan.total_bytes,
                  allocation_bytes=plan.allocation_bytes,
                  unit_stores=[dict(unit=i, input_shape=list(s), bytes=b) for i, s, b in unit_rows(net, plan)])
    if budget is not None:
        result["budget_bytes"] = budget
        result["largest_batch"] = {m: largest_batch(net, store=Store(m, store.window), budget=budget, **planned)
                                   for m in BITS}
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


def command_line():
    """python3 -m minibp.plan's parser."""
    parser = argparse.ArgumentParser(prog="python3 -m minibp.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # the trainer's options (run/options.py), read the planner's way: ResNets by name only, the default model
    # following --data, no ImageNet defaults beyond it
    add_option(parser, "model", default=None, help="resnet<9n+2> (default resnet164); with --data imagenet "
               "resnet50, resnet101 or resnet152 (default); or your own net, FILE.py:FUNCTION or "
               "package.module:FUNCTION, as the trainer takes it")
    parser.add_argument("--model-arg", dest="model_args", metavar="NAME=VALUE", type=parse_model_arg,
                        action="append", default=[], help="a keyword argument for your own net's function")
    add_option(parser, "data", choices=list(models.DATA_SHAPES),
               help="input shape and classes; imagenet: 224x224x3, 1000 classes and the ImageNet ResNets")
    parser.add_argument("--data-file", metavar="PATH", help="the input shape and classes of a data file of your own")
    add_option(parser, "batch", metavar=None, help=None)
    add_option(parser, "bits", help=None)
    add_option(parser, "window", help="the k-bit codes' window")
    parser.add_argument("--units", action="store_true", help="also list every unit's store")
    parser.add_argument("--budget", help="e.g. 11GiB: print the largest batch that fits, for each store")
    parser.add_argument("--device", choices=["cpu", "gpu"], help="plan for this device's code paths "
                        f"(default: this process's, {backend.device})")
    parser.add_argument("--json", action="store_true")
    return parser


def main(argv=None):
    args = command_line().parse_args(argv)
    try:
        input_shape, classes = models.DATA_SHAPES[args.data]
        if args.data_file is not None:
            facts = data.describe(args.data_file)
            args.data, input_shape, classes = facts["name"], facts["shape"], facts["classes"]
        if not args.model:  # the trainer's default for the data
            args.model = IMAGENET_DEFAULTS["model"] if args.data == "imagenet" else default_of("model")
        model_args = config.model_args(args.model_args)
        modelspec.check_spec(args.model, model_args, imagenet=args.data == "imagenet")
        net = modelspec.build(args.model, model_args=model_args, imagenet=args.data == "imagenet",
                           input_shape=input_shape, classes=classes)
        budget = check_budget(parse_bytes(args.budget)) if args.budget is not None else None
        if args.batch < 1:
            raise ValueError("--batch must be positive")
        store = Store(args.bits, args.window)
        with planning_for(args.device or backend.device):
            plan, result = report(net, model=args.model, batch=args.batch, store=store, budget=budget)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        if not args.units:
            result.pop("unit_stores")
        print(json.dumps(result, indent=1))
        return 0
    print(f"{modelspec.describe(args.model, model_args)} on {args.data} ({len(net.units)} units, {net.num_parameters:,} parameters), "
          f"batch {args.batch}, bits {args.bits}" + (f", {store.window} window" if store.has_window else ""))
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


if __name__ == "__main__":
    sys.exit(cli.run(main))
