"""Planned memory beside the memory a training iteration really takes, per mode, each in its own process.

    python bench/memory.py --model resnet164 --batch 128              # modes exact, 8, 4
    python bench/memory.py --model resnet1001 --batch 128 --modes 4,exact
    python bench/memory.py --model docs/vgg_example.py:build --model-arg width=16 --data fashion-mnist   # your own

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

from minibp.run.options import parse_model_arg
from options import modes_option, net_options


def resident_bytes(field):
    """VmRSS or VmHWM (peak) of this process, from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def build(model, model_args, data):
    """The uncompiled net a model spec (a ResNet's name or your own FILE.py:FUNCTION, as the trainer's
    --model) gives for the data set's shape and classes; a one-line ValueError for a bad spec."""
    from minibp.models import DATA_SHAPES
    from minibp.run import modelspec
    shape, classes = DATA_SHAPES[data]
    modelspec.check_spec(model, model_args)
    return modelspec.build(model, model_args=model_args, input_shape=shape, classes=classes)


def child(model, model_args, batch, mode, data):
    from minibp import models
    from minibp.optim import SGD
    from minibp.models import DATA_SHAPES
    shape, classes = DATA_SHAPES[data]
    rng = np.random.default_rng(0)
    tiny = models.by_name("resnet11", input_shape=(8, 8, shape[2]), classes=classes).compile(pass_images=2, bits=mode)
    tiny.forward(rng.standard_normal((2, 8, 8, shape[2])).astype(np.float32), np.zeros(2, np.int64))
    tiny.backward()
    SGD(tiny).step(lr=0.1)
    np.ones((1024, 1024), np.float32) @ np.ones((1024, 1024), np.float32)  # BLAS sets up its buffers
    images = rng.standard_normal((batch,) + shape).astype(np.float32)  # (N, H, W, C) the batch itself
    labels = rng.integers(0, classes, batch)
    del tiny
    baseline = resident_bytes("VmRSS")
    net = build(model, model_args, data).compile(pass_images=batch, bits=mode)
    net.forward(images, labels)
    net.backward()
    SGD(net).step(lr=0.1)
    peak = resident_bytes("VmHWM")
    print(json.dumps(dict(mode=mode, plan=net.arena.plan.total_bytes, baseline=baseline, peak=peak)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet164", batch=128, data="cifar10",
                data_choices=["cifar10", "cifar100", "fashion-mnist"])
    modes_option(parser, "exact,8,4")
    parser.add_argument("--model-arg", action="append", default=[], type=parse_model_arg, metavar="NAME=VALUE",
                        help="a keyword argument of your own net's function, as the trainer's (repeat it)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model_args = dict(args.model_arg)
    if args.child:
        child(args.model, model_args, args.batch, args.child, args.data)
        return 0
    try:  # a bad spec or net is one line here, not a child's traceback
        build(args.model, model_args, args.data)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    env = dict(os.environ, MINIBP_DEVICE="cpu")
    print(f"{args.model}, batch {args.batch}, {args.data}: one training iteration a mode, each in its own process")
    print(f"{'mode':>6}  {'plan':>10}  {'peak - baseline':>15}  {'ratio':>6}  {'baseline':>9}")
    worst = 0.0
    for mode in args.modes.split(","):
        arguments = [f"--model-arg={name}={value!r}" for name, value in model_args.items()]
        done = subprocess.run([sys.executable, __file__, "--model", args.model, *arguments, "--batch", str(args.batch),
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
