"""Print the memory plan of a training step, without allocating it.

    python3 -m minibp.plan --model resnet1001 --batch 128 --bits 4
    python3 -m minibp.plan --model resnet164 --batch 128 --bits exact --units     # and each unit's store
    python3 -m minibp.plan --model resnet1001 --budget 11GiB                      # largest batch per mode
    python3 -m minibp.plan --model resnet164 --json
    python3 -m minibp.plan --model resnet152 --data imagenet --batch 256 --bits 4   # the ImageNet ResNets
    python3 -m minibp.plan --model resnet1001 --budget 11GiB --device gpu         # the GPU's plan, from a CPU
    python3 -m minibp.plan --model resnet1001 --batch 128 --memory 1.25GiB --units  # a budget solved, unit by unit

The numbers come from Net.plan, the very table the trainer's arena allocates from: a batch "fits"
a budget when the arena's one allocation (every buffer, aligned) is at most the budget (a step of one pass;
with --memory, of the sub-batches it solves, the arena a pass's). The devices' plans differ only in the
convolution workspace (the GPU's im2col covers a whole pass, the CPU works a chunk of images at a time);
--device plans for either, whatever this machine has.

--memory solves a budget as the trainer's --memory does (run/budget.py): the fewest sub-batches and a store a unit,
the process beside the arena measured in this process after a warm-up (on a GPU: the pool alone), plus the data
file's images where one is named. Its errors are a prior's, each unit's values times (2^k - 1)^-2: a run calibrates
them on its data's first images, and may choose other units for the same bytes.
"""
import argparse
import contextlib
import json
import sys

from . import backend, cli, models

PROCESS_DEVICE = backend.device  # this process's device, which --device may plan for instead
from .arena import format_bytes
from .io import data
from .quant import BITS, Store, describe, per_unit
from .run import budget as budget_solver, calibration, config, memory, modelspec
from .run.budget import unit_bits
from .run.options import IMAGENET_DEFAULTS, add_option, default_of, parse_model_arg
from .run.sizing import (MAX_BATCH, Footprint, auto_budget, check_budget, largest_batch, parse_bytes, parse_memory,
                         unit_rows)


def report(net, *, model, pass_images, store, budget=None, optimizer="sgd", grad_norm=False, solution=None):
    """(the plan of a training step's passes of pass_images images at this store, the dict --json prints, whose
    "batch" is pass_images: --batch, or with a solution its sub-batch); with a budget, the largest batch (of one
    pass) of every store's precision, through the same window. store: a quant.Store, or one a unit (a solution's
    mix: solution, the budget.Solution it came from). optimizer, grad_norm: Net.plan's."""
    planned = dict(optimizer=optimizer, grad_norm=grad_norm)
    plan = net.plan(pass_images=pass_images, store=store, **planned)
    stores = per_unit(store, len(net.units))
    kept = {u.index: s.bits for u, s in zip(net.units, stores)}
    result = dict(model=model, batch=pass_images,
                  bits=store.bits if isinstance(store, Store) else unit_bits(net, stores),
                  window=stores[0].window if isinstance(store, Store) else next(
                      (s.window for s in stores if s.has_window), "fixed"),
                  units=len(net.units), parameters=net.num_parameters, categories=plan.bytes_by_category(),
                  total_bytes=plan.total_bytes, allocation_bytes=plan.allocation_bytes,
                  unit_stores=[dict(unit=i, input_shape=list(s), store=kept[i], bytes=b)
                               for i, s, b in unit_rows(net, plan)])
    if solution is not None:
        result["memory"] = dict(budget_bytes=solution.budget, sub_batches=solution.sub_batches,
                                arena_bytes=solution.arena_bytes, overhead_bytes=solution.overhead_bytes)
    if budget is not None:
        result["budget_bytes"] = budget
        result["largest_batch"] = {m: largest_batch(net, store=Store(m, store.window), budget=budget, **planned)
                                   for m in BITS}
    return plan, result


def solve(net, args, *, store, data_bytes, train_images):
    """The budget.Solution of --memory for this net and batch: the process beside the arena measured here after a
    warm-up, with the data file's images (data_bytes), and the prior's errors (the module docstring)."""
    if args.memory is None:
        raise ValueError("--max-sub-batches is --memory's: give the budget too")
    if args.bits is not None:
        raise ValueError("--memory chooses each unit's bits: leave --bits out")
    if args.budget is not None:
        raise ValueError("--budget gives the largest batch of each store; --memory solves the stores for a batch: "
                         "give one")
    costs = budget_solver.Costs(net, store=store, per_process=args.batch)
    footprint = Footprint(net, per_process=args.batch, train_images=train_images)
    budget_bytes = parse_memory(args.memory)
    here = args.device in (None, PROCESS_DEVICE)  # planning for this process's device: it can be measured
    if budget_bytes is None:
        if not here:
            raise ValueError(f"--memory auto reads this machine's memory: give a size to plan for {args.device}")
        budget_bytes = auto_budget()
    footprint.measure(warm_up=(lambda: memory.warm_up(net)) if here else None)
    footprint.measured += data_bytes if not footprint.gpu else 0
    memory.check_least(costs, footprint, budget_bytes)
    cal = calibration.calibration_bytes(net)
    return budget_solver.solve(costs, budget_solver.prior_errors(costs), budget=budget_bytes,
                               overhead=lambda n: footprint.overhead(n, calibration=cal),
                               max_sub_batches=args.max_sub_batches)


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
    add_option(parser, "bits", help=None, default=None)
    add_option(parser, "window", help="the k-bit codes' window")
    add_option(parser, "memory", help="a budget (e.g. 1.25GiB, or auto): the sub-batches and each unit's store "
               "solved for it, as the trainer's --memory does (the errors a prior's: a run calibrates them)")
    add_option(parser, "max_sub_batches")
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
        facts = None
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
        store, solution = Store(args.bits or "4", args.window), None
        with planning_for(args.device or backend.device):
            if args.memory is not None or args.max_sub_batches is not None:
                solution = solve(net, args, store=store, data_bytes=facts.get("held_bytes", 0) if facts else 0,
                                 train_images=facts.get("train_images", 0) if facts else 0)
            plan, result = report(net, model=args.model, pass_images=args.batch if solution is None else
                                  args.batch // solution.sub_batches, store=store if solution is None else
                                  list(solution.stores), budget=budget, solution=solution)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        if not args.units:
            result.pop("unit_stores")
        print(json.dumps(result, indent=1))
        return 0
    described = f"{modelspec.describe(args.model, model_args)} on {args.data} ({len(net.units)} units, " \
                f"{net.num_parameters:,} parameters), batch {args.batch}"
    if solution is None:
        print(described + f", {store}".replace(" (", ", ").rstrip(")"))
    else:
        S, n = solution.sub_batches, args.batch // solution.sub_batches
        print(f"{described} in {S} sub-batch{'es' * (S > 1)} of {n}, memory {args.memory}\n"
              f"stores: {describe([s for u, s in zip(net.units, solution.stores) if u.bn_channels])} "
              f"({format_bytes(solution.total_bytes)} of {format_bytes(solution.budget)}: the arena "
              f"{format_bytes(solution.arena_bytes)}, the process beside it {format_bytes(solution.overhead_bytes)})\n"
              "(the errors are a prior's, each unit's values times (2^k - 1)^-2: a run calibrates them on its data's "
              "first images and may choose other units for the same bytes)")
    print(plan.summary())
    print(f"(one allocation of {format_bytes(plan.allocation_bytes)} with alignment)")
    if args.units:
        print("\nunit  input shape        store   bytes")
        for row in result["unit_stores"]:
            print(f"{row['unit']:4d}  {str(tuple(row['input_shape'])):17s}  {row['store']:>5}  "
                  f"{format_bytes(row['bytes']):>10}")
    if budget is not None:
        print(f"\nlargest batch within {format_bytes(budget)}:")
        for bits, batch in result["largest_batch"].items():
            print(f"  {bits:>6}: {batch}" + (" (the cap)" if batch == MAX_BATCH else ""))
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
