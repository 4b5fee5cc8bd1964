"""Planned memory beside the memory a training iteration really takes, per mode, each in its own process.

    python bench/memory.py --model resnet164 --batch 128              # modes exact, 8, 4
    python bench/memory.py --model resnet1001 --batch 128 --modes 4,exact

Each mode runs in a fresh process: imports, kernel libraries, BLAS's buffers and a warm-up on a tiny net
first (the baseline), then the net is compiled and one iteration (forward, backward, SGD step) runs on random
data. The peak resident memory the OS reports (VmHWM) minus the baseline is printed beside the plan.
Target: peak - baseline <= 1.15 * plan, i.e. no hidden full-size temporaries. (CPU only: on a GPU the
arena lives in device memory; bench/gpu.py reports CuPy's pool there.)
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

from options import modes_option, net_options


def resident_bytes(field):
    """VmRSS or VmHWM (peak) of this process, from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(model, batch, mode, data):
    from minibp import models
    from minibp.optim import SGD
    from minibp.models import DATA_SHAPES
    shape, classes = DATA_SHAPES[data]
    rng = np.random.default_rng(0)
    tiny = models.by_name("resnet11", input_shape=(8, 8, shape[2]), classes=classes).compile(batch=2, bits=mode)
    tiny.forward(rng.standard_normal((2, 8, 8, shape[2])).astype(np.float32), np.zeros(2, np.int64))
    tiny.backward()
    SGD(tiny).step(lr=0.1)
    np.ones((1024, 1024), np.float32) @ np.ones((1024, 1024), np.float32)  # BLAS sets up its buffers
    images = rng.standard_normal((batch,) + shape).astype(np.float32)  # (N, H, W, C) the batch itself
    labels = rng.integers(0, classes, batch)
    del tiny
    baseline = resident_bytes("VmRSS")
    net = models.by_name(model, input_shape=shape, classes=classes).compile(batch=batch, bits=mode)
    net.forward(images, labels)
    net.backward()
    SGD(net).step(lr=0.1)
    peak = resident_bytes("VmHWM")
    print(json.dumps(dict(mode=mode, plan=net.arena.plan.total_bytes, baseline=baseline, peak=peak)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet164", batch=128, data="cifar10", data_choices=["cifar10", "cifar100", "fashion-mnist"])
    modes_option(parser, "exact,8,4")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.model, args.batch, args.child, args.data)
        return 0
    env = dict(os.environ, MINIBP_DEVICE="cpu")
    print(f"{args.model}, batch {args.batch}, {args.data}: one training iteration a mode, each in its own process")
    print(f"{'mode':>6}  {'plan':>10}  {'peak - baseline':>15}  {'ratio':>6}  {'baseline':>9}")
    worst = 0.0
    for mode in args.modes.split(","):
        done = subprocess.run([sys.executable, __file__, "--model", args.model, "--batch", str(args.batch),
                               "--data", args.data, "--child", mode], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return 1
        r = json.loads(done.stdout.strip().splitlines()[-1])
        used = r["peak"] - r["baseline"]
        worst = max(worst, used / r["plan"])
        print(f"{mode:>6}  {r['plan'] / 2**20:8.1f}MiB  {used / 2**20:13.1f}MiB  {used / r['plan']:6.3f}  "
              f"{r['baseline'] / 2**20:7.1f}MiB", flush=True)
    print(f"worst (peak - baseline) / plan: {worst:.3f} (target <= 1.15)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
