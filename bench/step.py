"""What one training step costs the host: device calls a step and a unit, Python function calls, and the host's
time to issue the step beside the step's whole time; eager steps and the replayed one (step.py), side by side.

    python3 bench/step.py                                   # resnet164 and resnet1001, batch 128, 4 bits
    python3 bench/step.py --models resnet164 --batch 16 --conv gemm --rounds 1
    python3 bench/step.py --quick                           # resnet11, batch 8 (the tests' smoke run)
    python3 bench/step.py --gpu-paths                       # the calls a unit of the GPU's convolution paths

Each model is compiled once a mode (same weights), warmed up by one step, then timed over --rounds steps, the
modes alternating round by round. For each it prints:
- device calls: what one step performs (program.device_calls: kernels, GEMMs, cuDNN executes and array
  operations alike), and that over the net's units;
- Python calls: the Python function calls of one step as TrainStep.run makes them (cProfile's count, the C
  functions it calls included);
- step: the median wall time of a step (the device's time on the CPU, where the host runs the kernels too);
- host: the same step with every kernel an empty function (kernels.empty_twins: the same calls with the same
  arguments, no work; NumPy's few array operations a unit, copies and fills, still run), the host's share of the
  step. On a GPU the calls cannot be timed so; bench/gpu.py times the host and the device there.
Then it checks that the replayed step equals the eager one bit for bit (CPU): the losses, the weights and the
stores after the same steps from the same weights.

--gpu-paths counts, without running them, the device calls of the step a GPU records: the GEMM path with the GPU's
chunking (a whole batch a GEMM) and the cuDNN path with a stand-in for each conv's graphs that issues one call an
execute, as cuDNN's does (building real graphs needs a GPU). The counts are the recorded programs' lengths.
"""
import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time

import numpy as np

from options import cpu_model
from minibp import backend, kernels, models, program
from minibp.models import DATA_SHAPES
from minibp.optim import SGD
from minibp.step import TrainStep

MODES = ("eager", "replayed")


def build(model, *, mode, batch, bits, conv, seed=0):
    """A TrainStep of its own net: eager (graph=False: the passes' programs one by one, on a GPU too) or the
    replayed whole step (graph=True: a CUDA graph on a GPU)."""
    shape, classes = DATA_SHAPES["cifar10"]
    net = models.by_name(model, input_shape=shape, classes=classes).compile(pass_images=batch, bits=bits, seed=seed,
                                                                              conv=conv)
    return TrainStep(net, SGD(net), graph=mode == "replayed")


def one_step(step, images, labels, iteration):
    step.run(images, labels, lr=0.01, iteration=iteration)
    return step.result()


def empty_kernels(step):
    """Swap every recorded kernel launch of this step's programs for its empty twin; returns how to swap them back."""
    net, opt = step.net, step.opt
    empty = lambda function: kernels.empty_twins.get(id(function), function)  # noqa: E731
    saved = dict(net._programs), opt._recorded, step._program
    net._programs = {key: p.substituted(empty) for key, p in net._programs.items()}
    opt._recorded = (opt._recorded[0], opt._recorded[1].substituted(empty))
    if step._program is not None:
        step._program = step._program.substituted(empty)

    def restore():
        net._programs, opt._recorded, step._program = saved
    return restore


def measure(model, args, rng):
    """{mode: row} for one model: each mode's own net from the same weights, the modes alternating."""
    shape = DATA_SHAPES["cifar10"][0]
    steps = {mode: build(model, mode=mode, batch=args.batch, bits=args.bits, conv=args.conv) for mode in MODES}
    images = rng.standard_normal((args.rounds + 3, args.batch) + shape).astype(np.float32)
    labels = rng.integers(0, 10, (args.rounds + 3, args.batch))
    rows = {mode: dict(times=[], hosts=[]) for mode in MODES}
    for mode, step in steps.items():  # the warm-up: every pass recorded, every kernel loaded
        one_step(step, images[0], labels[0], 0)
        calls = program.device_calls
        one_step(step, images[1], labels[1], 1)
        rows[mode]["calls"] = program.device_calls - calls
        profile = cProfile.Profile()
        profile.runcall(one_step, step, images[2], labels[2], 2)
        rows[mode]["python"] = pstats.Stats(profile).total_calls
        rows[mode]["units"] = len(step.net.units)
    for r in range(args.rounds):
        for mode, step in steps.items():
            backend.synchronize()
            start = time.perf_counter()
            one_step(step, images[3 + r], labels[3 + r], 3 + r)
            backend.synchronize()
            rows[mode]["times"].append(time.perf_counter() - start)
            if backend.device == "cpu":
                restore = empty_kernels(step)
                start = time.perf_counter()
                one_step(step, images[3 + r], labels[3 + r], 3 + r)
                rows[mode]["hosts"].append(time.perf_counter() - start)
                restore()
    return rows, steps


def gpu_path_calls(model, args):
    """{conv path: (calls a step, units, {call name: calls})} of the replayed step recorded as a GPU records it."""
    from minibp.layers import conv, conv_cudnn

    class StandIn:  # a conv's three cuDNN graphs: one issued call an execute
        workspace_bytes = 1

        def __init__(self, pass_images):
            self.pass_images = pass_images

        def _execute(self, name):
            program.issue(f"cudnn {name}", lambda: None)

        forward = lambda self, *a, **k: self._execute("fprop")            # noqa: E731
        backward_data = lambda self, *a, **k: self._execute("dgrad")      # noqa: E731
        backward_weights = lambda self, *a, **k: self._execute("wgrad")   # noqa: E731

    saved = conv.Conv2D._images_per_chunk, conv_cudnn.net_graphs
    conv.Conv2D._images_per_chunk = lambda self, n: n  # the GPU's: one chunk, one GEMM
    conv_cudnn.net_graphs = lambda units, *, pass_images, dtype, tf32: {
        c: StandIn(pass_images) for u in units if not u.is_classifier for c in u.convs()}
    counts = {}
    try:
        for path in ("gemm", "cudnn"):
            step = build(model, mode="replayed", batch=args.batch, bits=args.bits, conv=path)
            step._images[...] = 0
            recorded = step._step_program()
            counts[path] = (len(recorded), len(step.net.units), collections.Counter(recorded.names))
    finally:
        conv.Conv2D._images_per_chunk, conv_cudnn.net_graphs = saved
    return counts


def same_steps(steps):
    """Whether the replayed net's state and stores equal the eager one's (both took the same steps)."""
    eager, replayed = (steps[mode].net for mode in MODES)
    if backend.device != "cpu":
        return "not checked (GPU: bench/gpu.py)"
    a, b = eager.state(), replayed.state()
    stores = [name for name in eager.arena.views if name.endswith((".x_copy", ".codes", ".windows", ".stats"))]
    same = all(np.array_equal(a[k], b[k]) for k in a) and all(
        np.array_equal(eager.arena[k], replayed.arena[k]) for k in stores)
    return "bit for bit" if same else "DIFFERENT"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001",
                        help="comma-separated (default resnet164,resnet1001)")
    parser.add_argument("--batch", type=int, default=128, help="images a step (default 128)")
    parser.add_argument("--bits", default="4", help="the store (default 4, the block window)")
    parser.add_argument("--conv", default="auto", help="the convolutions' path (default auto)")
    parser.add_argument("--rounds", type=int, default=2, help="timed steps a mode (default 2)")
    parser.add_argument("--quick", action="store_true", help="resnet11, batch 8, 1 round")
    parser.add_argument("--gpu-paths", action="store_true", help="count the calls of the GPU's recorded steps")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batch, args.rounds = "resnet11", 8, 1
    if args.gpu_paths:
        print(f"bench/step.py --gpu-paths, {time.strftime('%Y-%m-%d')}: the replayed step as a GPU records it (not "
              f"run), batch {args.batch}, bits {args.bits}")
        for model in args.models.split(","):
            for path, (calls, units, names) in gpu_path_calls(model, args).items():
                top = ", ".join(f"{name} {n / units:.2f}" for name, n in names.most_common(8))
                print(f"{model:<11} {path:<6} {calls:>6,} device calls, {calls / units:.2f} a unit: {top}")
        return
    print(f"bench/step.py, {time.strftime('%Y-%m-%d')}: {backend.device}, {cpu_model()}; batch {args.batch}, bits "
          f"{args.bits}, conv {args.conv}, {args.rounds} rounds")
    print(f"{'model':<11} {'mode':<9} {'device calls':>12} {'a unit':>7} {'Python calls':>12} {'step ms':>9} "
          f"{'host ms':>9} {'host/step':>9}")
    rng = np.random.default_rng(0)
    for model in args.models.split(","):
        rows, steps = measure(model, args, rng)
        for mode in MODES:
            row = rows[mode]
            step = statistics.median(row["times"]) * 1e3
            host = statistics.median(row["hosts"]) * 1e3 if row["hosts"] else float("nan")
            print(f"{model:<11} {mode:<9} {row['calls']:>12,} {row['calls'] / row['units']:>7.2f} {row['python']:>12,} "
                  f"{step:>9.1f} {host:>9.1f} {host / step:>9.3f}")
        print(f"{model:<11} replayed step against eager: {same_steps(steps)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
