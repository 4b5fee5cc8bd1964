"""Does OpenBLAS fight minibp's OpenMP kernels for the cores? A ResNet-20 training step (batch 64, 4 bits,
CIFAR-shaped random data) through each CPU convolution path, each configuration in a process of its own,
alternating over rounds:

    python bench/threads.py              # 3 rounds of 5 timed steps
    python bench/threads.py --cpu avx2   # with minibp's kernels and OpenBLAS limited to AVX2
    python bench/threads.py --beside     # two processes sharing the cores: the direct step alone and beside another


direct: conv_direct's kernels, no BLAS (what conv="auto", the default, runs in float32 on the CPU). The
im2col rows compile the net with conv="gemm", the im2col + GEMM path float64 takes on the CPU: with
OpenBLAS's own spin before its idle threads sleep (OPENBLAS_THREAD_TIMEOUT=28, its default), with minibp's
(4: sleep at once, set in minibp/__init__.py), and with one BLAS thread.

--beside: each path's step alone, then while a second process trains the same net through the same
path (as an evaluation beside a trainer does), each with as many threads as there are cores. Shared
evenly, the cores give each process half their time: a step at most about 2x as long (less where a
process alone leaves the cores idle part of the time).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from options import cpu_option, limit_cpu

CONFIGS = {  # name: (Net.compile's conv path, environment)
    "direct": ("direct", {}),
    "im2col, OpenBLAS's spin": ("gemm", {"OPENBLAS_THREAD_TIMEOUT": "28"}),
    "im2col, minibp's setting": ("gemm", {}),
    "im2col, 1 BLAS thread": ("gemm", {"OPENBLAS_NUM_THREADS": "1"}),
}


def child(name, steps, *, forever=False):
    import numpy as np
    from minibp import models
    from minibp.optim import SGD
    net = models.by_name("resnet20", input_shape=(32, 32, 3), classes=10).compile(pass_images=64, bits=4, seed=0,
                                                                                 conv=CONFIGS[name][0])
    opt = SGD(net)
    rng = np.random.default_rng(0)
    images, labels = rng.standard_normal((64, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, 64)

    def step():
        start = time.perf_counter()
        net.zero_grad()
        net.forward(images, labels)
        net.backward()
        opt.step(lr=0.01)
        return time.perf_counter() - start
    step()  # warm-up: kernel builds, thread pools
    while forever:  # the neighbour of --beside: trains until killed
        step()
    print(json.dumps(dict(times=[step() for _ in range(steps)], path=CONFIGS[name][0],
                          timeout=os.environ.get("OPENBLAS_THREAD_TIMEOUT"))))


def run(name, steps, env=None):
    """The median step of a child process."""
    done = subprocess.run([sys.executable, __file__, "--child", name, "--steps", str(steps)],
                          env={**os.environ, "MINIBP_DEVICE": "cpu", **(env or {})}, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: exit {done.returncode}\n{done.stderr}")
    return statistics.median(json.loads(done.stdout.splitlines()[-1])["times"])


BESIDE = ("direct", "im2col, OpenBLAS's spin", "im2col, minibp's setting")


def beside(args):
    from speed import describe_machine
    print(f"ResNet-20, batch 64, 4 bits: {args.rounds} rounds of each path's step alone and beside a second "
          f"process training the same net the same way\n{describe_machine()}", flush=True)
    alone, shared = {name: [] for name in BESIDE}, {name: [] for name in BESIDE}
    for round_ in range(args.rounds):
        for name in BESIDE:
            env = {**os.environ, "MINIBP_DEVICE": "cpu", **CONFIGS[name][1]}
            alone[name].append(run(name, args.steps, CONFIGS[name][1]))
            neighbour = subprocess.Popen([sys.executable, __file__, "--child", name, "--forever"], env=env,
                                         stdout=subprocess.DEVNULL)
            try:
                time.sleep(3)  # its warm-up done: it is training
                shared[name].append(run(name, args.steps, CONFIGS[name][1]))
            finally:
                neighbour.kill()
                neighbour.wait()
        print(f"  round {round_ + 1}: " + "  ".join(f"{n} {alone[n][-1]:.3f}s alone, {shared[n][-1]:.3f}s beside"
                                                  for n in BESIDE), flush=True)
    print(f"\n{'':>26}  {'alone s':>7}  {'beside s':>8}  {'ratio':>5}   (an even share of the cores: at most 2x)")
    for name in BESIDE:
        a, b = statistics.median(alone[name]), statistics.median(shared[name])
        print(f"{name:>26}  {a:7.3f}  {b:8.3f}  {b / a:5.2f}")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    cpu_option(parser)
    parser.add_argument("--beside", action="store_true", help="time the direct step alone and beside another "
                        "training process")
    parser.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--forever", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.steps, forever=args.forever)
        return 0
    from speed import describe_machine
    limit_cpu(args.cpu)
    if args.beside:
        return beside(args)
    print(f"ResNet-20, batch 64, 4 bits, {args.rounds} rounds of 1 warm-up + {args.steps} steps, a process a "
          f"configuration\n{describe_machine()}", flush=True)
    times = {name: [] for name in CONFIGS}
    for round_ in range(args.rounds):
        for name, (_, env) in CONFIGS.items():
            times[name].append(run(name, args.steps, env))
        print(f"  round {round_ + 1}: " + "  ".join(f"{n} {t[-1]:.3f}s" for n, t in times.items()), flush=True)
    base = statistics.median(times["direct"])
    print(f"\n{'':>26}  {'step s':>7}  {'vs direct':>9}")
    for name, t in times.items():
        print(f"{name:>26}  {statistics.median(t):7.3f}  {statistics.median(t) / base:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
