"""GPU timings and memory: time per iteration of exact vs 8 vs 4 (CUDA events, medians), CuPy's pool
beside the plan, and the largest batch per mode within a budget.

    MINIBP_DEVICE=gpu python bench/gpu.py                          # resnet164 and resnet1001, batch 128
    MINIBP_DEVICE=gpu python bench/gpu.py --models resnet164 --rounds 3 --conv cudnn

Not yet run on a GPU (see README, "GPU"); bench/gpu_check.sh runs it.
"""
import argparse
import statistics
import sys

import numpy as np

from minibp import backend, models
from minibp.arena import format_bytes
from minibp.optim import SGD
from minibp.plan import largest_batch, parse_bytes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--modes", default="exact,8,4")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conv", default="gemm", choices=["gemm", "cudnn"])
    parser.add_argument("--budget", default="11GiB", help="for the largest batch per mode (the paper's GPU)")
    args = parser.parse_args(argv)
    if backend.device != "gpu":
        print("bench/gpu.py needs a GPU: run it with MINIBP_DEVICE=gpu on a machine with one", file=sys.stderr)
        return 2
    cupy = backend.xp
    pool = cupy.get_default_memory_pool()
    modes = args.modes.split(",")
    for model in args.models.split(","):
        rng = np.random.default_rng(0)
        images = rng.standard_normal((args.batch, 32, 32, 3)).astype(np.float32)  # (N, H, W, C)
        labels = rng.integers(0, 10, args.batch)
        nets, times, pool_bytes = {}, {m: [] for m in modes}, {}
        for mode in modes:
            before = pool.used_bytes()
            nets[mode] = models.by_name(model).compile(batch=args.batch, bits=mode, seed=0, conv=args.conv)
            pool_bytes[mode] = pool.used_bytes() - before
        optimizers = {m: SGD(nets[m]) for m in modes}
        start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def iteration(mode):
            start.record()
            nets[mode].zero_grad()
            nets[mode].forward(images, labels)
            nets[mode].backward()
            optimizers[mode].step(lr=0.01)
            end.record()
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end) / 1e3

        for mode in modes:  # warm-up: kernel compilation, cuBLAS/cuDNN set-up
            iteration(mode)
            iteration(mode)
        for _ in range(args.rounds):
            for mode in modes:
                times[mode].append(iteration(mode))
        base = statistics.median(times[modes[0]])
        print(f"\n{model}, batch {args.batch}, conv {args.conv}, {args.rounds} interleaved rounds")
        print(f"{'mode':>6}  {'median ms':>9}  {'min':>7}  {'max':>7}  {'vs ' + modes[0]:>9}  {'plan':>10}  "
              f"{'pool':>10}")
        for mode in modes:
            median = statistics.median(times[mode])
            print(f"{mode:>6}  {median * 1e3:9.1f}  {min(times[mode]) * 1e3:7.1f}  {max(times[mode]) * 1e3:7.1f}  "
                  f"{median / base:9.3f}  {format_bytes(nets[mode].arena.plan.allocation_bytes):>10}  "
                  f"{format_bytes(pool_bytes[mode]):>10}", flush=True)
        budget = parse_bytes(args.budget)
        net = models.by_name(model)
        print(f"largest batch within {format_bytes(budget)}: " +
              ", ".join(f"{m} {largest_batch(net, bits=m, budget=budget)}" for m in modes))
        nets.clear()
        optimizers.clear()
        pool.free_all_blocks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
