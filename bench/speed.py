"""Time per training iteration in each mode, interleaved in one process, and the convolution GFLOP/s.

    python bench/speed.py --model resnet164 --batch 128   # exact, 8, 4 (default window), 4:fixed; 1 warm-up + 5 rounds
    python bench/speed.py --model resnet20 --batch 64 --rounds 3
    python bench/speed.py --cpu avx2                     # as an AVX2-only CPU would run it (on an AVX-512 one)

Every mode gets its own compiled net (same weights); after one warm-up iteration each, the modes
alternate round by round, so drift of the machine touches them alike. Prints the median, min and max
of each, the ratio of each median to exact's, and the convolution work's GFLOP/s (forward, data and
weight gradients: 3x the forward multiply-adds x 2) beside a float32 GEMM measured here and now: per
iteration ("a step"), and per second spent inside the convolutions ("in convs", timed in one more
iteration with every device call timed: program.timed, the convolutions' calls summed). It names the CPU, the
instruction set minibp's kernels and NumPy's BLAS were limited to, and the convolutions' path (direct at which vector
width, or im2col + BLAS).
"""
import argparse
import collections
import os
import statistics
import sys
import time

import numpy as np

from gradients import store_options
from options import NARROWER_CPU, cpu_model, cpu_option, limit_cpu, modes_option, net_options
from minibp import backend, build, models, program
from minibp.layers import conv_direct
from minibp.layers.conv import CONV_CALLS
from minibp.optim import SGD
from minibp.models import DATA_SHAPES

def describe_machine():
    """What a figure was measured on: the CPU, the instruction sets in use and the convolutions' path."""
    widest = build.usable_cpu_targets()[0]
    limited = [f"{k}={v}" for k, v in NARROWER_CPU.get(build.cpu_target()[0], {}).items() if os.environ.get(k) == v]
    return (f"CPU: {cpu_model()}, {len(os.sched_getaffinity(0))} cores, widest target {widest}"
            + (f", limited to {build.cpu_target()[0]} ({' '.join(limited)})" if limited else "")
            + f"; minibp's float32 convolutions: {conv_direct.path()}")


def gemm_gflops(size=2048, repeats=5):
    """float32 GEMM GFLOP/s of this machine's xp.matmul, best of a few."""
    xp = backend.xp
    a = xp.asarray(np.random.default_rng(0).standard_normal((size, size), dtype=np.float32))
    out = xp.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        backend.synchronize()
        start = time.perf_counter()
        xp.matmul(a, a, out=out)
        backend.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def conv_layers(net):
    """Every Conv2D of the net: each unit's conv (the classifier's FC too) and projection."""
    return [layer for u in net.units for layer in (u.conv, u.projection) if layer is not None]


def conv_flops(net, batch):
    """Multiply-adds x 2 of every conv and FC, forward + data gradient + weight gradient."""
    return 3 * batch * sum(layer.flops_per_image for layer in conv_layers(net))


def conv_seconds(iteration):
    """Seconds spent in the convolutions' device calls (layers.conv.CONV_CALLS) during iteration(), each call timed
    (program.timed: waited for on the GPU)."""
    with program.timed() as spent:
        iteration()
    return sum(spent.get(name, 0.0) for name in CONV_CALLS)


def kernel_seconds(iteration, steps=2):
    """{device call name: seconds a step} over `steps` calls of iteration(): every call timed (program.timed)."""
    spent = collections.Counter()
    for _ in range(steps):
        with program.timed() as one:
            iteration()
        spent.update({name: seconds / steps for name, seconds in one.items()})
    return spent


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet164", batch=128, data="cifar10", data_choices=list(DATA_SHAPES))
    modes_option(parser, "exact,8,4,4:fixed")
    parser.add_argument("--rounds", type=int, default=5)
    cpu_option(parser)
    parser.add_argument("--kernels", action="store_true", help="also time every kernel of two more steps a mode "
                        "and print where each mode's step differs from the first mode's")
    args = parser.parse_args(argv)
    limit_cpu(args.cpu)
    shape, classes = DATA_SHAPES[args.data]
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch,) + shape).astype(np.float32)  # (N, H, W, C)
    labels = rng.integers(0, classes, args.batch)
    modes = args.modes.split(",")
    nets, optimizers = {}, {}
    for mode in modes:
        nets[mode] = models.by_name(args.model, input_shape=shape, classes=classes).compile(
            pass_images=args.batch, seed=0, **store_options(mode))
        optimizers[mode] = SGD(nets[mode])

    def iteration(mode):
        net = nets[mode]
        backend.synchronize()
        start = time.perf_counter()
        net.zero_grad()
        net.forward(images, labels)
        net.backward()
        optimizers[mode].step(lr=0.01)
        backend.synchronize()
        return time.perf_counter() - start

    print(f"{args.model}, batch {args.batch}, {args.data}, device {backend.device}: 1 warm-up + {args.rounds} "
          f"interleaved rounds", flush=True)
    if backend.device == "cpu":
        print(describe_machine(), flush=True)
    for mode in modes:
        iteration(mode)
    times = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode in modes:
            times[mode].append(iteration(mode))
        print(f"  round {round_ + 1}: " + "  ".join(f"{m} {times[m][-1]:.3f}s" for m in modes), flush=True)
    flops = conv_flops(nets[modes[0]], args.batch)
    in_convs = {mode: conv_seconds(lambda: iteration(mode)) for mode in modes}
    peak = gemm_gflops()
    base = statistics.median(times[modes[0]])
    print(f"\n{'mode':>6}  {'median s':>8}  {'min':>7}  {'max':>7}  {'vs ' + modes[0]:>9}  {'conv s':>7}  "
          f"{'conv GFLOP/s: a step':>20}  {'in convs':>8}  {'% of GEMM':>9}")
    for mode in modes:
        median = statistics.median(times[mode])
        rate = flops / in_convs[mode] / 1e9
        print(f"{mode:>6}  {median:8.3f}  {min(times[mode]):7.3f}  {max(times[mode]):7.3f}  {median / base:9.3f}  "
              f"{in_convs[mode]:7.3f}  {flops / median / 1e9:20.1f}  {rate:8.1f}  {100 * rate / peak:8.0f}%")
    print(f"convolution work {flops / 1e9:.1f} GFLOP an iteration; float32 GEMM here: {peak:.1f} GFLOP/s")
    if args.kernels:
        spent = {mode: kernel_seconds(lambda: iteration(mode)) for mode in modes}
        names = sorted(set().union(*spent.values()), key=lambda n: -spent[modes[0]].get(n, 0))
        print(f"\nseconds a step in each device call (2 steps a mode, each call timed)\n{'call':>28}  "
              + "  ".join(f"{m:>9}" for m in modes))
        for name in names + ["all calls"]:
            row = [sum(spent[m].values()) if name == "all calls" else spent[m].get(name, 0.0) for m in modes]
            print(f"{name:>28}  " + "  ".join(f"{v:9.3f}" for v in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
