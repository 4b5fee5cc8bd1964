"""Training on 1 and 2 CPU ranks (mpirun, minibp/dist.py): images/s, and the time of the gradient sum.

    python bench/scaling.py                                   # ResNet-20, batch 64, CIFAR-shaped data
    python bench/scaling.py --model resnet56 --batch 128 --steps 4 --rounds 2

Each configuration runs in its own mpirun: 1 rank with every core's threads, 2 ranks with half the
threads each, and 1 rank with one thread (what one rank of the 2 gets); the configurations alternate
for --rounds rounds, so that drift of a shared machine touches them alike, and the table gives the
median, min and max of each. A rank steps exactly as the
trainer does (TrainStep with the group: its half of the batch, one gradient sum and one gather a step),
on random CIFAR-shaped images, and rank 0 reports images/s of the global batch over --steps steps after
a warm-up. Under 2 ranks it then times the sum over the ranks of a gradient buffer the size of
ResNet-164's and of ResNet-1001's (float32), with the bounded, polled sum the trainer uses
(Group.sum: all-to-all, a sum in rank order, all-gather, each polled) and with a plain blocking
Allreduce, median of --repeats.

On a machine with as many cores as the 1-rank run uses, 2 ranks can only win by what one process
leaves idle (the Python between kernels, single-threaded passes); the gain of more ranks comes with
more cores or machines, which this script does not have here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from options import net_options

ROOT = Path(__file__).resolve().parent.parent
SHAPE, CLASSES = (32, 32, 3), 10
BUFFERS = ("resnet164", "resnet1001")


def mpirun():
    """The mpirun of pip's mpich (beside the interpreter's scripts), else the one on the PATH."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / "mpirun").is_file():
            return str(folder / "mpirun")
    return "mpirun"


def worker(args):
    """One rank's measurement; rank 0 prints one JSON line."""
    from minibp import dist, models
    from minibp.optim import SGD
    from minibp.step import TrainStep

    group = dist.start(timeout=120)
    ranks, rank = (group.size, group.rank) if group else (1, 0)
    net = models.by_name(args.model, input_shape=SHAPE, classes=CLASSES)
    net.compile(pass_images=args.batch // ranks, bits=args.bits, seed=0)
    step = TrainStep(net, SGD(net), group=group)
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((args.batch,) + SHAPE).astype(np.float32), rng.integers(0, CLASSES, args.batch))
               for _ in range(2)]
    rows = group.share_of(args.batch) if group else slice(None)
    times = []
    for i in range(args.steps + 1):  # the first is the warm-up
        images, labels = batches[i % 2]
        if group:
            group.barrier()
        start = time.perf_counter()
        step.run(images[rows], labels[rows], lr=0.01)
        times.append(time.perf_counter() - start)
    result = dict(ranks=ranks, images_per_s=args.batch * args.steps / sum(times[1:]))
    if group:
        result["sums"] = {}
        for name in BUFFERS:
            size = models.by_name(name, input_shape=SHAPE, classes=CLASSES).num_parameters
            buffer = np.ones(size, np.float32)
            polled, blocking = [], []
            for _ in range(args.repeats):
                group.barrier()
                start = time.perf_counter()
                group.sum(buffer)
                polled.append(time.perf_counter() - start)
                group.barrier()
                start = time.perf_counter()
                group.comm.Allreduce(group.MPI.IN_PLACE, buffer, op=group.MPI.SUM)
                blocking.append(time.perf_counter() - start)
            result["sums"][name] = dict(parameters=size, polled=polled, blocking=blocking)
    if rank == 0:
        print(json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(p, model="resnet20", batch=64, batch_help="the global batch (even: 2 ranks take half each)")
    p.add_argument("--bits", default="4")
    p.add_argument("--steps", type=int, default=6, help="timed steps after one warm-up")
    p.add_argument("--repeats", type=int, default=5, help="gradient sums timed per buffer")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration, alternating")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    cores = os.cpu_count()
    configurations = ((1, cores), (2, max(1, cores // 2)), (1, max(1, cores // 2)))  # (ranks, threads a rank)
    results = {c: [] for c in configurations}
    for _ in range(args.rounds):
        for ranks, threads in configurations:
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
            command = [mpirun(), "-n", str(ranks), sys.executable, __file__, "--worker"] + sys.argv[1:]
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
            results[ranks, threads].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.model}, batch {args.batch}, bits {args.bits}, {cores} cores, {args.steps} steps after a warm-up, "
          f"{args.rounds} rounds")
    print(f"{'ranks':>5} {'threads a rank':>15} {'images/s median':>16} {'min':>7} {'max':>7}")
    for (ranks, threads), runs in results.items():
        rates = [r["images_per_s"] for r in runs]
        print(f"{ranks:5d} {threads:15d} {statistics.median(rates):16.1f} {min(rates):7.1f} {max(rates):7.1f}")
    print("\nsum of a float32 gradient buffer over 2 ranks (median of every repeat of every round):")
    print(f"{'buffer':>10} {'parameters':>11} {'MB':>6} {'polled (Group.sum)':>19} {'blocking Allreduce':>19}")
    for name in BUFFERS:
        sums = [r["sums"][name] for r in results[configurations[1]]]
        polled, blocking = (statistics.median(t for s in sums for t in s[key]) for key in ("polled", "blocking"))
        print(f"{name:>10} {sums[0]['parameters']:11,d} {sums[0]['parameters'] * 4 / 1e6:6.1f} "
              f"{polled * 1e3:16.1f} ms {blocking * 1e3:16.1f} ms")


if __name__ == "__main__":
    main()
