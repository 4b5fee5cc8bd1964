"""A minibp training step beside PyTorch's, on the CPU: the same pre-activation ResNet, time and peak memory.

    python bench/versus_pytorch.py                          # ResNet-164, batch 128, 3 rounds
    python bench/versus_pytorch.py --model resnet1001 --rounds 2
    python bench/versus_pytorch.py --quick                  # resnet11, batch 8, 1 round: a smoke test
    python bench/versus_pytorch.py --cpu avx2               # as an AVX2-only CPU runs both (on an AVX-512 one)

Needs PyTorch (torch==2.13.0, the CPU build: pip install -e '.[bench]'), imported only by the process
that runs the PyTorch configuration. There, torch.nn builds the net of minibp/models.py: a 3x3 conv to 16
channels; n bottleneck blocks a stage of BN-ReLU-conv1x1 -> BN-ReLU-conv3x3 (stride 2 in the first block
of stages 2 and 3) -> BN-ReLU-conv1x1, widths (16, 64), (32, 128), (64, 256), each adding its input
through the parameter-free shortcut (average-pool by the stride, zero-pad the channels); BN-ReLU, global
average pool, FC. (A stride-2 conv pads 1 on both sides in PyTorch, 0 before and 1 after in minibp:
the same output size and work.) Both train with SGD, momentum 0.9, weight decay 2e-4 on the conv and FC
weights, on random data, with as many threads as this process may use (torch.set_num_threads; minibp's
OpenMP kernels and OpenBLAS take them all by default).

Each configuration (PyTorch, minibp exact, minibp 4-bit) runs in a process of its own, as bench/memory.py
does: imports, thread pools and a tiny net's step first (the baseline), then the net, --warmup steps and
--steps timed steps (forward, backward, SGD step); it reports those times, the peak resident memory
(VmHWM) minus the baseline, and the seconds spent in convolutions in one more step (minibp: its conv
layers, timed; PyTorch: aten::convolution and aten::convolution_backward in torch.profiler). Rounds
alternate the configurations, so drift of a shared machine touches them alike. The table gives the
median over rounds of each round's median step (and the fastest step), ratios to PyTorch, and the
convolution work's GFLOP/s per second spent in convolutions beside a float32 GEMM (NumPy) timed
between rounds.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from memory import resident_bytes
from options import cpu_option, limit_cpu, net_options
from speed import conv_flops, conv_seconds, describe_machine, gemm_gflops

INSTALL_HINT = "PyTorch is not installed: pip install torch==2.13.0 (or pip install -e '.[bench]')"
MISSING_TORCH = 3  # a child's exit status when torch does not import
CONFIGS = {"pytorch": "PyTorch", "exact": "minibp exact", "4": "minibp 4-bit"}
STAGES = ((16, 64), (32, 128), (64, 256))  # minibp/models.py's (bottleneck width, block output channels)


def threads():
    """The cores this process may run on: both frameworks use all of them."""
    return len(os.sched_getaffinity(0))


def torch_resnet(torch, depth, classes):
    """minibp/models.py's pre-activation bottleneck ResNet of depth 9n+2, in torch.nn."""
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, cin, width, cout, stride):
            super().__init__()
            self.stride, self.pad = stride, cout - cin
            self.bn1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, width, 1, bias=False)
            self.bn2, self.conv2 = nn.BatchNorm2d(width), nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn3, self.conv3 = nn.BatchNorm2d(width), nn.Conv2d(width, cout, 1, bias=False)

        def forward(self, x):
            out = self.conv1(F.relu(self.bn1(x), inplace=True))  # bn1's output, not x
            out = self.conv2(F.relu(self.bn2(out), inplace=True))
            out = self.conv3(F.relu(self.bn3(out), inplace=True))
            shortcut = F.avg_pool2d(x, self.stride) if self.stride > 1 else x
            if self.pad:
                shortcut = F.pad(shortcut, (0, 0, 0, 0, 0, self.pad))  # zero channels after the input's
            return out + shortcut

    blocks, cin = [nn.Conv2d(3, 16, 3, 1, 1, bias=False)], 16
    for stage, (width, cout) in enumerate(STAGES):
        for block in range((depth - 2) // 9):
            blocks.append(Block(cin, width, cout, 2 if stage > 0 and block == 0 else 1))
            cin = cout
    blocks += [nn.BatchNorm2d(cin), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
               nn.Linear(cin, classes)]
    return nn.Sequential(*blocks)


def torch_child(args, shape, classes, rng):
    """(step function, seconds in convolutions of one profiled step) for PyTorch; the baseline is taken
    by the caller after the tiny net."""
    try:
        import torch
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(MISSING_TORCH)
    torch.set_num_threads(threads())
    torch.manual_seed(0)
    fmt = torch.channels_last if args.torch_format == "channels_last" else torch.contiguous_format

    def trainer(depth, batch, size):
        model = torch_resnet(torch, depth, classes).to(memory_format=fmt)
        decayed = [p for name, p in model.named_parameters() if p.ndim > 1]  # conv and FC weights
        rest = [p for name, p in model.named_parameters() if p.ndim <= 1]
        opt = torch.optim.SGD([dict(params=decayed, weight_decay=2e-4), dict(params=rest, weight_decay=0.0)],
                              lr=0.01, momentum=0.9)
        images = torch.from_numpy(rng.standard_normal((batch, shape[2], size, size)).astype(np.float32))
        images = images.contiguous(memory_format=fmt)
        labels = torch.from_numpy(rng.integers(0, classes, batch))

        def step():
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(images), labels).backward()
            opt.step()
        return step

    trainer(11, 2, 8)()  # the tiny net: allocator, thread pool and oneDNN set up before the baseline
    step_baseline = resident_bytes("VmRSS")
    step = trainer(args.depth, args.batch, shape[0])

    def conv_time():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            step()
        return sum(e.cpu_time_total for e in prof.key_averages()
                   if e.key in ("aten::convolution", "aten::convolution_backward")) / 1e6
    return step, step_baseline, conv_time


def minibp_child(args, bits, shape, classes, rng):
    from minibp import models
    from minibp.optim import SGD

    def trainer(name, batch, size):
        net = models.by_name(name, input_shape=(size, size, shape[2]), classes=classes).compile(pass_images=batch,
                                                                                             bits=bits, seed=0)
        opt = SGD(net, momentum=0.9, weight_decay=2e-4)
        images = rng.standard_normal((batch, size, size, shape[2])).astype(np.float32)
        labels = rng.integers(0, classes, batch)

        def step():
            net.zero_grad()
            net.forward(images, labels)
            net.backward()
            opt.step(lr=0.01)
        return net, step

    trainer("resnet11", 2, 8)[1]()  # the tiny net: kernel libraries, OpenMP and BLAS set up first
    np.ones((1024, 1024), np.float32) @ np.ones((1024, 1024), np.float32)  # BLAS's buffers
    step_baseline = resident_bytes("VmRSS")
    net, step = trainer(args.model, args.batch, shape[0])
    return step, step_baseline, lambda: conv_seconds(step)


def child(args, config):
    """One configuration: prints a JSON line of its step times, memory and conv seconds."""
    shape, classes = (32, 32, 3), 10
    rng = np.random.default_rng(0)
    if config == "pytorch":
        step, baseline, conv_time = torch_child(args, shape, classes, rng)
    else:
        step, baseline, conv_time = minibp_child(args, config, shape, classes, rng)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = resident_bytes("VmHWM")  # before the profiled step: a profiler keeps its own records
    print(json.dumps(dict(times=times, baseline=baseline, peak=peak, conv_seconds=conv_time())))


def run_child(args, config):
    argv = [sys.executable, __file__, "--child", config, "--model", args.model, "--batch", str(args.batch),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--torch-format", args.torch_format]
    done = subprocess.run(argv, env=dict(os.environ, MINIBP_DEVICE="cpu"), capture_output=True, text=True)
    if done.returncode == MISSING_TORCH:
        return None
    if done.returncode != 0:
        raise RuntimeError(f"the {CONFIGS[config]} process failed (exit {done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet164", batch=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="timed steps a process (after --warmup)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--configs", default="pytorch,exact,4", help=f"some of {','.join(CONFIGS)}")
    parser.add_argument("--torch-format", choices=["channels_last", "contiguous"], default="channels_last",
                        help="PyTorch's memory format (channels_last: its faster one on the CPU, measured)")
    parser.add_argument("--quick", action="store_true", help="resnet11, batch 8, 1 round of 1 step")
    cpu_option(parser)
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.model, args.batch, args.rounds, args.steps = "resnet11", 8, 1, 1
    from minibp import models
    args.depth = models.depth_of(args.model)  # a bad name fails here, before any process starts
    configs = args.configs.split(",")
    if any(c not in CONFIGS for c in configs):
        parser.error(f"--configs takes some of {','.join(CONFIGS)}, got {args.configs}")
    if min(args.batch, args.rounds, args.steps) < 1 or args.warmup < 0:
        parser.error("--batch, --rounds and --steps must be positive and --warmup >= 0")
    if args.child:
        child(args, args.child)
        return 0
    limit_cpu(args.cpu)  # the children inherit the limits
    if "pytorch" in configs and importlib.util.find_spec("torch") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    flops = conv_flops(models.by_name(args.model), args.batch)
    print(f"{args.model}, batch {args.batch}, CPU, {threads()} threads each; PyTorch {args.torch_format}; "
          f"{args.rounds} rounds of {args.warmup} warm-up + {args.steps} timed steps, a process a configuration",
          flush=True)
    print(describe_machine(), flush=True)
    results, gemm = {c: [] for c in configs}, []
    for round_ in range(args.rounds):
        for config in configs:
            r = run_child(args, config)
            if r is None:
                print(INSTALL_HINT, file=sys.stderr)
                return 2
            results[config].append(r)
        gemm.append(gemm_gflops())
        print(f"  round {round_ + 1}: " + "  ".join(f"{CONFIGS[c]} {statistics.median(results[c][-1]['times']):.3f}s"
                                                  for c in configs), flush=True)
    peak_gemm = statistics.median(gemm)
    summary = {}
    for c in configs:
        rs = results[c]
        summary[c] = dict(step=statistics.median(statistics.median(r["times"]) for r in rs),
                          fastest=min(min(r["times"]) for r in rs),
                          memory=statistics.median(r["peak"] - r["baseline"] for r in rs),
                          conv=statistics.median(r["conv_seconds"] for r in rs))
    ref = summary.get("pytorch")
    print(f"\n{'':>13}  {'step s':>7}  {'fastest':>7}  {'vs PyTorch':>10}  {'peak RSS':>9}  {'vs PyTorch':>10}  "
          f"{'conv s':>6}  {'conv GFLOP/s':>12}  {'of GEMM':>7}")
    for c in configs:
        s = summary[c]
        rate = flops / s["conv"] / 1e9
        time_ratio = f"{s['step'] / ref['step']:10.2f}" if ref else f"{'-':>10}"
        memory_ratio = f"{s['memory'] / ref['memory']:10.2f}" if ref else f"{'-':>10}"
        print(f"{CONFIGS[c]:>13}  {s['step']:7.3f}  {s['fastest']:7.3f}  {time_ratio}  "
              f"{s['memory'] / 2**20:7.0f}MB  {memory_ratio}  {s['conv']:6.2f}  {rate:12.1f}  "
              f"{100 * rate / peak_gemm:6.0f}%")
    print(f"convolution work {flops / 1e9:.1f} GFLOP a step (forward, data and weight gradients); float32 GEMM "
          f"(NumPy, 2048^3) here: {peak_gemm:.1f} GFLOP/s; peak RSS is VmHWM minus each process's baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
