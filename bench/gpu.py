"""GPU timings and memory beside PyTorch's, on one card in one run: a training step of each store, replayed as one
CUDA graph (the GPU's default) and eager, through GEMM or cuDNN convolutions; device calls a step, the host's
time against the device's, device memory against the plan; the replayed step against the eager one; and the
largest batch within the paper's 11 GiB, run.

    MINIBP_DEVICE=gpu python bench/gpu.py --pytorch                   # resnet164, resnet1001 at batch 128
    MINIBP_DEVICE=gpu python bench/gpu.py --models resnet164 --configs 4:replayed:cudnn,4:replayed:gemm
    MINIBP_DEVICE=gpu python bench/gpu.py --parity --fit 11GiB        # and the replay check and the paper's GPU

A configuration is store:mode:conv (mode replayed or eager; conv gemm, cudnn or cudnn-tf32). Each is compiled
afresh, steps twice (the replayed step's first runs eagerly on its stream, the second captures the graph), then
times --rounds steps with CUDA events (median). Columns:
- calls: the device calls one step performs (program.device_calls of an eager step; a replayed step's graph holds
  as many, launched once), and that over the net's units;
- host ms: the host's time to issue one step (TrainStep.run, without waiting); device ms: the device's (events).
  An eager step waits for its losses, so its host time includes the device's; a replayed step's host time is
  staging the batch, writing the scalars and one launch;
- pool: CuPy's pool after the steps less before the net, against the plan (equal to the byte: nothing but the
  arena, the graph included; the batch is staged in pinned host memory);
- images/s, and (--pytorch) the time and memory over PyTorch's exact step, run in a child process on the same
  GPU with TF32 allowed in cuDNN (its default) and off.
--parity: the same 3 steps eager and replayed from the same weights, for each configuration's store and conv;
prints whether losses and weights are equal bit for bit (or their largest difference).
--fit BYTES: the largest batch of resnet1001 within BYTES for 4 bits and exact, as the planner says, run for 3
replayed steps; and PyTorch's largest batch within it (torch.cuda.set_per_process_memory_fraction).

bench/gpu_check.sh runs it; docs/gpu.md records what it printed.
"""
import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from minibp import backend, models, program
from minibp.arena import format_bytes
from minibp.optim import SGD
from minibp.quant import Store
from minibp.run.sizing import largest_batch, parse_bytes
from minibp.step import TrainStep

PYTORCH_STEP = """
import json, statistics, sys, numpy as np, torch
sys.path.insert(0, {bench!r})
from versus_pytorch import torch_resnet
depth, batch, rounds, fraction = {depth}, {batch}, {rounds}, {fraction}
torch.manual_seed(0); torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = {tf32}  # matmul keeps its default: float32
if fraction:
    torch.cuda.set_per_process_memory_fraction(fraction)
model = torch_resnet(torch, depth, 10).cuda()
decayed = [p for p in model.parameters() if p.ndim > 1]; rest = [p for p in model.parameters() if p.ndim <= 1]
opt = torch.optim.SGD([dict(params=decayed, weight_decay=2e-4), dict(params=rest, weight_decay=0.0)], lr=0.01,
                      momentum=0.9)
def step(images, labels):
    opt.zero_grad(set_to_none=False)
    loss = torch.nn.functional.cross_entropy(model(images), labels); loss.backward(); opt.step()
    return loss
def data(batch):
    rng = np.random.default_rng(0)
    return (torch.from_numpy(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)).cuda(),
            torch.from_numpy(rng.integers(0, 10, batch)).cuda())
def fits(batch):
    try:
        step(*data(batch)); torch.cuda.synchronize(); return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        torch.cuda.empty_cache()
if batch == 0:  # the largest batch that fits: doubling, then bisecting
    low, high = 0, 8
    while fits(high): low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2; low, high = (mid, high) if fits(mid) else (low, mid)
    batch = low
images, labels = data(batch)
for _ in range(2):
    step(images, labels)
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
times = []
for _ in range(rounds):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(); loss = step(images, labels); end.record(); end.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
print(json.dumps(dict(median=statistics.median(times), min=min(times), peak=torch.cuda.max_memory_allocated(),
                      loss=float(loss), torch=torch.__version__, batch=batch)))
"""


def pytorch_row(model, batch, rounds, *, tf32, fraction=0.0):
    """PyTorch's exact step on this GPU in a child process: {median, min, peak, loss, torch, batch}, or None (a line
    says why). batch 0: the largest that fits within fraction of the device's memory."""
    code = PYTORCH_STEP.format(bench=str(Path(__file__).resolve().parent), depth=models.depth_of(model), tf32=tf32,
                               batch=batch, rounds=rounds, fraction=fraction)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=400)
    if done.returncode != 0:
        print(f"PyTorch: failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_config(text):
    """'4:replayed:cudnn' -> ("4", "replayed", "cudnn"); mode and conv default to replayed and gemm."""
    bits, mode, conv = (text.split(":") + ["replayed", "gemm"][len(text.split(":")) - 1:])[:3]
    if mode not in ("replayed", "eager"):
        raise SystemExit(f"--configs {text}: the mode is replayed or eager")
    return bits, mode, conv


def stepper(model, bits, mode, conv, batch, seed=0):
    net = models.by_name(model).compile(pass_images=batch, bits=bits, seed=seed, conv=conv)
    return TrainStep(net, SGD(net), graph=mode == "replayed")


def measure(model, config, images, labels, args, cupy, pool, before):
    """The row of one configuration (the module docstring's columns)."""
    bits, mode, conv = config
    step = stepper(model, bits, mode, conv, args.batch)
    stream = step.stream if step.graph else cupy.cuda.get_current_stream()
    for i in range(2):  # replayed: the first step eager on the step's stream, the second captured
        step.run(images, labels, lr=0.01, iteration=i)
        step.result()
    calls = program.device_calls
    step.run(images, labels, lr=0.01, iteration=2)
    step.result()
    calls = len(step._step_program()) if step.graph else program.device_calls - calls
    start, end, times, hosts = cupy.cuda.Event(), cupy.cuda.Event(), [], []
    for r in range(args.rounds):
        start.record(stream)
        host = time.perf_counter()
        step.run(images, labels, lr=0.01, iteration=3 + r)
        hosts.append(time.perf_counter() - host)
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    loss = step.result()[0]
    used = pool.total_bytes() - before
    return dict(median=statistics.median(times), host=statistics.median(hosts), calls=calls,
                units=len(step.net.units), plan=step.net.arena.plan.allocation_bytes, used=used, loss=loss)


def parity(model, config, args, rng):
    """The same 3 steps eager and replayed from the same weights: 'bit for bit', or the largest differences."""
    bits, _, conv = config
    data = [(rng.standard_normal((args.batch, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, args.batch))
            for _ in range(3)]
    results = []
    for mode in ("eager", "replayed"):
        step = stepper(model, bits, mode, conv, args.batch)
        losses = []
        for i, (images, labels) in enumerate(data):
            step.run(images, labels, lr=0.05, iteration=i)
            losses.append(step.result())
        results.append((np.array(losses), step.net.state()))
        del step
        gc.collect()
    (la, sa), (lb, sb) = results
    if np.array_equal(la, lb) and all(np.array_equal(sa[k], sb[k]) for k in sa):
        return "bit for bit"
    weights = max(float(np.max(np.abs(sa[k] - sb[k]))) for k in sa)
    return f"losses differ by up to {float(np.max(np.abs(la - lb))):.3g}, weights by {weights:.3g}"


def fit(args, cupy, budget):
    """resnet1001's largest batch within budget for 4 bits and exact, as planned, run for 3 replayed steps."""
    net = models.by_name("resnet1001")
    print(f"\nthe paper's GPU: resnet1001 within {format_bytes(budget)}")
    for bits in ("4", "exact"):
        batch = largest_batch(net, store=Store(bits), budget=budget)
        try:
            step = stepper("resnet1001", bits, "replayed", "gemm", batch)
            rng = np.random.default_rng(0)
            images = rng.standard_normal((batch, 32, 32, 3)).astype(np.float32)
            labels = rng.integers(0, 10, batch)
            for i in range(3):
                cupy.cuda.Device().synchronize()
                start = time.perf_counter()
                step.run(images, labels, lr=0.01, iteration=i)
                step.result()
                seconds = time.perf_counter() - start
            print(f"  minibp {bits}: batch {batch}, plan {format_bytes(step.net.arena.plan.allocation_bytes)}, 3 steps "
                  f"run, the last {seconds * 1e3:.0f} ms ({batch / seconds:.0f} images/s)")
            del step
        except Exception as e:
            reason = str(e).splitlines()[0] if str(e) else ""
            print(f"  minibp {bits}: batch {batch}: failed: {type(e).__name__}: {reason}")
        gc.collect()
        cupy.get_default_memory_pool().free_all_blocks()
    total = cupy.cuda.runtime.memGetInfo()[1]
    row = pytorch_row("resnet1001", 0, 3, tf32=True, fraction=budget / total)
    if row:
        print(f"  PyTorch {row['torch']} exact: batch {row['batch']}, {row['batch'] / row['median']:.0f} images/s "
              f"(median of 3), peak {format_bytes(row['peak'])}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--configs", default="exact:replayed,4:replayed,4:eager,4:replayed:cudnn",
                        help="store:mode:conv, comma-separated (default exact:replayed,4:replayed,4:eager,"
                             "4:replayed:cudnn)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pytorch", action="store_true", help="PyTorch's exact step beside minibp's")
    parser.add_argument("--parity", action="store_true", help="eager against replayed, bit for bit")
    parser.add_argument("--fit", metavar="BYTES", help="the largest batch of resnet1001 within BYTES, run")
    args = parser.parse_args(argv)
    if backend.device != "gpu":
        print("bench/gpu.py needs a GPU: run it with MINIBP_DEVICE=gpu on a machine with one", file=sys.stderr)
        return 2
    cupy = backend.xp
    pool = cupy.get_default_memory_pool()
    configs = [parse_config(c) for c in args.configs.split(",")]
    for model in filter(None, args.models.split(",")):
        rng = np.random.default_rng(0)
        images = rng.standard_normal((args.batch, 32, 32, 3)).astype(np.float32)  # (N, H, W, C) on the host
        labels = rng.integers(0, 10, args.batch)
        print(f"\n{model}, batch {args.batch}, {args.rounds} rounds, {time.strftime('%Y-%m-%d')}")
        print(f"{'store':>5} {'mode':>8} {'conv':>10} {'median ms':>9} {'images/s':>8} {'calls':>7} {'a unit':>6} "
              f"{'host ms':>8} {'pool':>10} {'plan':>10} {'loss':>7}", flush=True)
        rows = []
        for config in configs:
            pool.free_all_blocks()
            before = pool.total_bytes()
            try:
                row = measure(model, config, images, labels, args, cupy, pool, before)
            except Exception as e:  # one configuration's failure is its row; the others still run
                reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
                print(f"{config[0]:>5} {config[1]:>8} {config[2]:>10} not run: {type(e).__name__}: {reason}",
                      flush=True)
                continue
            finally:
                gc.collect()  # the net and step of this configuration, before the next is built
                pool.free_all_blocks()
            rows.append((config, row))
            print(f"{config[0]:>5} {config[1]:>8} {config[2]:>10} {row['median'] * 1e3:9.1f} "
                  f"{args.batch / row['median']:8.0f} {row['calls']:>7} {row['calls'] / row['units']:6.2f} "
                  f"{row['host'] * 1e3:8.2f} {format_bytes(row['used']):>10} {format_bytes(row['plan']):>10} "
                  f"{row['loss']:7.4f}", flush=True)
        if args.pytorch:
            for tf32 in (True, False):  # PyTorch's default lets cuDNN use TF32; minibp's convolutions are float32
                torch_row = pytorch_row(model, args.batch, args.rounds, tf32=tf32)
                if not torch_row:
                    continue
                print(f"PyTorch {torch_row['torch']} exact (float32, cuDNN, TF32 {'allowed' if tf32 else 'off'}): "
                      f"median {torch_row['median'] * 1e3:.1f} ms, {args.batch / torch_row['median']:.0f} images/s, "
                      f"peak {format_bytes(torch_row['peak'])}, loss {torch_row['loss']:.4f}")
                for config, row in rows:
                    print(f"  minibp {':'.join(config)}: time x{row['median'] / torch_row['median']:.2f}, memory "
                          f"x{row['used'] / torch_row['peak']:.3f} of PyTorch's")
        if args.parity:
            for config in dict.fromkeys((bits, "replayed", conv) for bits, _, conv in configs):
                print(f"replayed against eager, {config[0]} bits, {config[2]}: {parity(model, config, args, rng)}",
                      flush=True)
    if args.fit:
        fit(args, cupy, parse_bytes(args.fit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
