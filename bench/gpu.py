"""GPU timings and memory: a training step of exact vs 8 vs 4 bits, eager and replayed as one CUDA
graph (CUDA events, medians), minibp kernel launches a step, convolution TFLOP/s beside a cuBLAS
float32 GEMM measured in the same run, device memory against the plan, and the largest batch per store
within the paper's 11 GiB and within this GPU's memory.

    MINIBP_DEVICE=gpu python bench/gpu.py                          # resnet164 and resnet1001, batch 128
    MINIBP_DEVICE=gpu python bench/gpu.py --models resnet164 --rounds 3 --conv cudnn
    MINIBP_DEVICE=gpu python bench/gpu.py --steps eager --pytorch  # and PyTorch's exact step beside it

A configuration that fails (a graph capture CuPy refuses, say) prints its one-line reason and the rest
go on. "device" is what CuPy's pool holds after the timed steps less what it held before the net was
built: the pool keeps every block it has handed out, so this is the step's high-water mark. "bwd host"
and "bwd device" time one eager backward pass and SGD step, which never wait for the device: the host's
time to queue them, and the device's to run them (CUDA events). Nearly equal, the device waited for the
host (the step is host-bound); the host's far below, the kernels are the cost. --profile N prints the N
functions with the most host time in one eager step of the last store (cProfile). --pytorch
runs PyTorch's exact step (float32, cuDNN, bench/versus_pytorch.py's net) in a child process on the same
GPU after minibp's rows, with TF32 allowed (PyTorch's default for cuDNN) and off: time a step (CUDA
events, median) and torch.cuda.max_memory_allocated.

bench/gpu_check.sh runs it; README, "GPU", says what has run.
"""
import argparse
import cProfile
import gc
import json
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


PYTORCH_STEP = """
import json, statistics, sys, numpy as np, torch
sys.path.insert(0, {bench!r})
from versus_pytorch import torch_resnet
depth, batch, rounds = {depth}, {batch}, {rounds}
torch.manual_seed(0); torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = {tf32}  # matmul keeps its default: float32
model = torch_resnet(torch, depth, 10).cuda()
decayed = [p for p in model.parameters() if p.ndim > 1]; rest = [p for p in model.parameters() if p.ndim <= 1]
opt = torch.optim.SGD([dict(params=decayed, weight_decay=2e-4), dict(params=rest, weight_decay=0.0)], lr=0.01,
                      momentum=0.9)
rng = np.random.default_rng(0)
images = torch.from_numpy(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)).cuda()
labels = torch.from_numpy(rng.integers(0, 10, batch)).cuda()
def step():
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.cross_entropy(model(images), labels); loss.backward(); opt.step()
    return loss
for _ in range(2):
    step()
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(rounds):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); loss = step(); end.record(); end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
print(json.dumps(dict(median=statistics.median(times), min=min(times), peak=torch.cuda.max_memory_allocated(),
                      loss=float(loss), torch=torch.__version__)))
"""


def pytorch_row(model, batch, rounds, *, tf32):
    """PyTorch's exact step on this GPU, in a child process: {median, min, peak, loss, torch} or None."""
    code = PYTORCH_STEP.format(bench=str(Path(__file__).resolve().parent), depth=models.depth_of(model), tf32=tf32,
                               batch=batch, rounds=rounds)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        print(f"PyTorch: failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model, bits, graph, images, labels, args, cupy, pool, before):
    """(median s, min s, kernels a step, first step s, plan bytes, device bytes, loss, conv TFLOP/s, backward
    host s, backward device s)."""
    net = models.by_name(model).compile(batch=args.batch, bits=bits, seed=0, conv=args.conv)
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
    used = pool.total_bytes() - before + (step.pool.total_bytes() if graph else 0)
    median = statistics.median(times)
    host = device = float("nan")
    if not graph:  # the forward pass ends in a host read of the loss; backward and SGD queue without one
        net.zero_grad()
        net.forward(images, labels)
        start.record()
        host = time.perf_counter()
        net.backward()
        step.opt.step(lr=0.01)
        host = time.perf_counter() - host
        end.record()
        end.synchronize()
        device = cupy.cuda.get_elapsed_time(start, end) / 1e3
    if args.profile and not graph and bits == args.stores.split(",")[-1]:
        profile = cProfile.Profile()
        profile.enable()
        step.run(images, labels, lr=0.01)
        step.result()
        profile.disable()
        print(f"host time of one eager {bits} step, by function (cProfile):")
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(args.profile)
    return (median, min(times), launches, first, net.arena.plan.allocation_bytes, used, loss,
            conv_flops(net, args.batch) / median / 1e12, host, device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--stores", default="exact,8,4", help="the --bits values to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--conv", default="gemm", choices=["gemm", "cudnn"])
    parser.add_argument("--budget", default="11GiB", help="for the largest batch per store (the paper's GPU)")
    parser.add_argument("--steps", default="eager,graph", help="eager, graph or both")
    parser.add_argument("--pytorch", action="store_true", help="PyTorch's exact step beside minibp's")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="the N functions with the most host time in one eager step (cProfile)")
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
        print(f"\n{model}, batch {args.batch}, conv {args.conv}, {args.rounds} rounds, {time.strftime('%Y-%m-%d')}")
        print(f"{'bits':>5} {'step':>6} {'median ms':>9} {'min ms':>7} {'kernels':>8} {'first s':>7} "
              f"{'conv TFLOP/s':>12} {'plan':>10} {'device':>10} {'loss':>7} {'bwd host ms':>11} {'bwd device ms':>13}",
              flush=True)
        rows = []
        for bits in stores:
            for graph in [mode == "graph" for mode in args.steps.split(",")]:
                pool.free_all_blocks()
                before = pool.total_bytes()
                kind = "graph" if graph else "eager"
                try:
                    row = measure(model, bits, graph, images, labels, args, cupy, pool, before)
                except Exception as e:  # one configuration's failure is its row; the others still run
                    reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    print(f"{bits:>5} {kind:>6} not run: {type(e).__name__}: {reason}", flush=True)
                    continue
                finally:
                    gc.collect()  # the net and step of this configuration, before the next is built
                    pool.free_all_blocks()
                rows.append((bits, graph) + row)
                median, fastest, launches, first, plan, used, loss, tflops, host, device = row
                print(f"{bits:>5} {kind:>6} {median * 1e3:9.1f} {fastest * 1e3:7.1f} "
                      f"{launches if not graph else 1:>8} {first:7.2f} {tflops:12.2f} {format_bytes(plan):>10} "
                      f"{format_bytes(used):>10} {loss:7.4f} {host * 1e3:11.1f} {device * 1e3:13.1f}", flush=True)
        if args.pytorch:
            for tf32 in (True, False):  # PyTorch's default lets cuDNN use TF32; minibp's GEMMs are float32
                torch_row = pytorch_row(model, args.batch, args.rounds, tf32=tf32)
                if not torch_row:
                    continue
                print(f"PyTorch {torch_row['torch']} exact (float32, cuDNN, TF32 {'allowed' if tf32 else 'off'}): "
                      f"median {torch_row['median'] * 1e3:.1f} ms, min {torch_row['min'] * 1e3:.1f} ms, peak "
                      f"{format_bytes(torch_row['peak'])}, {args.batch / torch_row['median']:.0f} images/s, "
                      f"loss {torch_row['loss']:.4f}")
                for bits, graph, *row in rows:
                    print(f"  minibp {bits} {'graph' if graph else 'eager'}: time x{row[0] / torch_row['median']:.2f}, "
                          f"memory x{row[5] / torch_row['peak']:.3f} of PyTorch's, {args.batch / row[0]:.0f} images/s")
        net = models.by_name(model)
        for name, budget in (("11 GiB", parse_bytes(args.budget)), ("this GPU", device_bytes)):
            print(f"largest batch within {name}: " +
                  ", ".join(f"{b} {largest_batch(net, store=Store(b), budget=budget)}" for b in stores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
