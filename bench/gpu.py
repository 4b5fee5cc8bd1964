"""GPU timings and memory: a training step of exact vs 8 vs 4 bits, eager and replayed as one CUDA
graph (CUDA events, medians), minibp kernel launches a step, convolution TFLOP/s beside a cuBLAS
float32 GEMM measured in the same run, device memory against the plan, and the largest batch per store
within the paper's 11 GiB and within this GPU's memory.

    MINIBP_DEVICE=gpu python bench/gpu.py                          # resnet164 and resnet1001, batch 128
    MINIBP_DEVICE=gpu python bench/gpu.py --models resnet164 --rounds 3 --conv cudnn

bench/gpu_check.sh runs it; README, "GPU", says what has run.
"""
import argparse
import statistics
import sys
import time

import numpy as np

from minibp import backend, kernels, models
from minibp.arena import format_bytes
from minibp.optim import SGD
from minibp.quant import Store
from minibp.run.sizing import largest_batch, parse_bytes
from minibp.step import TrainStep


def gemm_tflops(cupy, size=8192, repeats=5):
    """float32 GEMM TFLOP/s of cuBLAS (through cupy.matmul), best of a few."""
    a = cupy.asarray(np.random.default_rng(0).standard_normal((size, size), dtype=np.float32))
    out = cupy.empty_like(a)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    best = float("inf")
    for _ in range(repeats):
        start.record()
        cupy.matmul(a, a, out=out)
        end.record()
        end.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * size**3 / best / 1e12


def conv_flops(net, batch):
    """Multiply-adds x 2 of every conv and FC: forward, data gradient and weight gradient."""
    return 3 * batch * sum(u.conv.flops_per_image + (u.projection.flops_per_image if u.projection else 0)
                           for u in net.units)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--stores", default="exact,8,4", help="the --bits values to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conv", default="gemm", choices=["gemm", "cudnn"])
    parser.add_argument("--budget", default="11GiB", help="for the largest batch per store (the paper's GPU)")
    args = parser.parse_args(argv)
    if backend.device != "gpu":
        print("bench/gpu.py needs a GPU: run it with MINIBP_DEVICE=gpu on a machine with one", file=sys.stderr)
        return 2
    cupy = backend.xp
    pool = cupy.get_default_memory_pool()
    stores = args.stores.split(",")
    device_bytes = cupy.cuda.runtime.memGetInfo()[1]
    print(f"cuBLAS float32 GEMM: {gemm_tflops(cupy):.1f} TFLOP/s; device memory {format_bytes(device_bytes)}")
    for model in args.models.split(","):
        rng = np.random.default_rng(0)
        images = cupy.asarray(rng.standard_normal((args.batch, 32, 32, 3)).astype(np.float32))  # (N, H, W, C)
        labels = rng.integers(0, 10, args.batch)
        rows = []
        for bits in stores:
            for graph in (False, True):
                before = pool.used_bytes()
                net = models.by_name(model).compile(batch=args.batch, bits=bits, seed=0, conv=args.conv)
                arena_bytes = pool.used_bytes() - before
                step = TrainStep(net, SGD(net), graph=graph)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                launches = kernels.launches
                host = time.perf_counter()
                step.run(images, labels, lr=0.01)   # eager (graph mode: teaches its pool)
                step.result()
                launches = kernels.launches - launches
                first = time.perf_counter() - host
                step.run(images, labels, lr=0.01)   # graph mode: the capture
                step.result()
                times = []
                for _ in range(args.rounds):
                    start.record(step.stream if graph else None)
                    step.run(images, labels, lr=0.01)
                    end.record(step.stream if graph else None)
                    end.synchronize()
                    times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
                loss, _ = step.result()
                extra = step.pool.total_bytes() if graph else 0
                rows.append((bits, graph, statistics.median(times), min(times), launches, first,
                             net.arena.plan.allocation_bytes, arena_bytes + extra, loss,
                             conv_flops(net, args.batch) / statistics.median(times) / 1e12))
                del step, net
                pool.free_all_blocks()
        print(f"\n{model}, batch {args.batch}, conv {args.conv}, {args.rounds} rounds, {time.strftime('%Y-%m-%d')}")
        print(f"{'bits':>5} {'step':>6} {'median ms':>9} {'min ms':>7} {'kernels':>8} {'first s':>7} "
              f"{'conv TFLOP/s':>12} {'plan':>10} {'device':>10} {'loss':>7}")
        for bits, graph, median, fastest, launches, first, plan, used, loss, tflops in rows:
            print(f"{bits:>5} {'graph' if graph else 'eager':>6} {median * 1e3:9.1f} {fastest * 1e3:7.1f} "
                  f"{launches if not graph else 1:>8} {first:7.2f} {tflops:12.2f} {format_bytes(plan):>10} "
                  f"{format_bytes(used):>10} {loss:7.4f}", flush=True)
        net = models.by_name(model)
        for name, budget in (("11 GiB", parse_bytes(args.budget)), ("this GPU", device_bytes)):
            print(f"largest batch within {name}: " +
                  ", ".join(f"{b} {largest_batch(net, store=Store(b), budget=budget)}" for b in stores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
