"""--memory, measured: at budgets from the least a run fits in up to every unit exact, what the trainer chooses, the
peak of its process against the budget, and the gradient error of its mix beside the best uniform store's.

    python bench/budget.py                         # ResNet-164 and ResNet-1001 at batch 128 (half an hour or more)
    python bench/budget.py --models resnet164
    python bench/budget.py --quick                 # seconds: ResNet-11 on 8x8 data, batch 16 (the CI check)

The data is Fashion-MNIST as the paper's CIFAR shape (padded to 32x32, three channels: bench/gradients.py), written
to a temporary data file of --train training and 256 test images. The budgets: the least (the trainer's own
refusal names it), then for every unit at 2, 4, 8 bits and exact at one sub-batch the bytes the planner puts on
it (python3 -m minibp.plan --memory: the arena and the process beside it), and the points halfway between. At each:

- python3 -m minibp.train --memory BUDGET, in a process of its own, for 2 iterations with a checkpoint each and a
  validation: the mix and the sub-batches it chose, the bytes it planned, and its peak (VmHWM) against the budget;
- in this process, at the weights the run starts from and on a batch of 128 other training images, computed in the
  run's sub-batches: ||g - g_exact||^2 of the mix's whole gradient, and of the best uniform store's that fits the
  same budget at the same sub-batches (its arena beside the process the run measured), each over SGD's noise (the
  spread of --noise exact gradients, bench/error_model.py's).

The goals: the peak within the budget at every point; the mix's error never above the uniform store's, and below
it wherever the budget falls between two uniform sizes.
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gradients import cifar_shaped, probe_batches
from options import cpu_model, seed_option
from minibp import backend, models, quant
from minibp.arena import format_bytes
from minibp.io import data
from minibp.run import budget, checkpoint

UNIFORM = ("2", "4", "8", "exact")


def data_file(folder, args):
    """A temporary data file in the CIFAR shape: (path, its training Split)."""
    if args.quick:
        rng = np.random.default_rng(0)
        images = np.clip(rng.normal(128, 50, (320, 8, 8, 3)), 0, 255).astype(np.uint8)
        train = data.Split(images[:256], rng.integers(0, 4, 256), 4, "random")
        test = (images[256:], rng.integers(0, 4, 64))
    else:
        fashion = cifar_shaped(data.load_split(data.dataset_path(args.data_dir, "fashion-mnist"), "train"))
        train = data.Split(fashion.images[:args.train], fashion.labels[:args.train], 10, fashion.name)
        test = (fashion.images[-256:], fashion.labels[-256:])
    path = Path(folder) / "data.h5"
    data.write(path, train=(train.images, train.labels), test=test, classes=train.classes, name="bench")
    return path, train


def trainer(path, model, batch, out, memory, *, extra=()):
    return subprocess.run([sys.executable, "-m", "minibp.train", "--data-file", str(path), "--model", model,
                           "--batch", str(batch), "--iters", "2", "--val-every", "2", "--checkpoint-every", "1",
                           "--lr-schedule", "0:0.01", "--log-every", "1", "--out", str(out), "--overwrite",
                           "--memory", memory, *extra], capture_output=True, text=True)


def planned(path, model, batch, bits=None, memory=None):
    """python3 -m minibp.plan's JSON for the data file's shape."""
    argv = ["--data-file", str(path), "--model", model, "--batch", str(batch), "--json"]
    argv += ["--bits", bits] if bits else ["--memory", memory]
    done = subprocess.run([sys.executable, "-m", "minibp.plan", *argv], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def budgets(path, model, batch, least):
    """[(name, bytes)]: the least, each uniform store's bytes at one sub-batch, and the points halfway between."""
    overhead = planned(path, model, batch, memory="1PiB")["memory"]["overhead_bytes"]
    totals = [overhead + planned(path, model, batch, bits=b)["allocation_bytes"] for b in UNIFORM]
    points = [("least", least)]
    for i, b in enumerate(UNIFORM):
        points.append((f"{b} bits" if b != "exact" else "exact", totals[i]))
        if i + 1 < len(UNIFORM):
            points.append((f"{b}-{UNIFORM[i + 1]}", (totals[i] + totals[i + 1]) // 2))
    return sorted({(n, int(v)) for n, v in points if v >= least}, key=lambda p: p[1])


def gradient(net, batch, sub_batches):
    """The whole gradient of a batch of 128 computed in sub-batches, as a step computes it."""
    images, labels = batch
    n = len(labels) // sub_batches
    net.zero_grad()
    for s in range(sub_batches):
        net.forward(images[s * n:(s + 1) * n], labels[s * n:(s + 1) * n], draw=s)
        net.backward(loss_scale=1.0 / sub_batches)
    return backend.to_host(net.grads).astype(np.float64)


def solve_time(net, batch):
    """Time a solve as a run makes it: the units' costs planned for the pass size, then the mix, at the budget just
    short of every unit exact (the slowest for the exact programme), after one untimed solve of another net (imports
    and first calls)."""
    warm = models.by_name("resnet11", input_shape=(8, 8, 3), classes=2)
    budget.solve(budget.Costs(warm, store=quant.Store("4"), per_process=2), budget.prior_errors(
        budget.Costs(warm, store=quant.Store("4"), per_process=2)), budget=2**40, overhead=lambda n: 0)
    began = time.perf_counter()
    costs = budget.Costs(net, store=quant.Store("4"), per_process=batch)
    unit_bytes, fixed = costs.at(batch)
    budget.solve(costs, budget.prior_errors(costs), budget=fixed + int(unit_bytes[:, -1].sum()) - 1,
                 overhead=lambda n: 0)
    print(f"solving a budget for {len(costs.units)} units, the plans of its pass size included: "
          f"{time.perf_counter() - began:.2f} s", flush=True)


def run(model, args, folder):
    path, train = data_file(folder, args)
    shape, classes, batch = train.images.shape[1:], train.classes, args.batch
    refused = trainer(path, model, batch, Path(folder) / "least", "1000B")
    found = re.search(r"needs at least ([0-9.]+) ([KMG]iB)", refused.stderr)
    if not found:
        sys.exit(f"the trainer did not name the least budget: {refused.stderr}")
    least = int(float(found.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[found.group(2)]) + 2**20
    mean = train.pixel_mean()
    probe = probe_batches(train, mean, batch, 1 + args.noise, seed=args.seed + 7)
    start = lambda: models.by_name(model, input_shape=shape, classes=classes)  # noqa: E731  (seed 0: the run's)
    exact_by_s, noise = {}, None
    rows = []
    solve_time(start(), batch)
    print(f"\n{model}, batch {batch}: budget, what the trainer chose, its peak, and the gradient errors", flush=True)
    for name, b in budgets(path, model, batch, least):
        out = Path(folder) / f"run-{name}"
        done = trainer(path, model, batch, out, f"{b}B")
        if done.returncode != 0:
            print(f"{name}: the trainer failed: {done.stderr.strip()}", flush=True)
            rows.append(dict(name=name, budget=b, failed=done.stderr.strip()))
            continue
        record = checkpoint.load(out / "checkpoint.h5").memory
        peak = re.search(r"peak resident memory ([0-9.]+) ([KMG]iB)", done.stdout)
        peak = float(peak.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[peak.group(2)]
        S = record["sub_batches"]
        n = batch // S
        if noise is None:
            net = start().compile(pass_images=n, bits="exact")
            others = [gradient(net, b_, S) for b_ in probe[1:]]
            noise = float(np.mean([np.sum((g - np.mean(others, axis=0)) ** 2) for g in others]))
            del net
        if S not in exact_by_s:
            exact_by_s[S] = gradient(start().compile(pass_images=n, bits="exact"), probe[0], S)
        reference = exact_by_s[S]
        mix = start()
        mix.compile(pass_images=n, store=list(budget.stores_of(mix, record["bits"], quant.Store("4"))))
        mix_error = float(np.sum((gradient(mix, probe[0], S) - reference) ** 2)) / noise
        del mix
        fits = [k for k in UNIFORM if record["overhead"] + start().plan(pass_images=n, bits=k).allocation_bytes <= b]
        uniform = fits[-1] if fits else None
        uniform_error = (float(np.sum((gradient(start().compile(pass_images=n, bits=uniform), probe[0], S)
                                       - reference) ** 2)) / noise if uniform else float("nan"))
        row = dict(name=name, budget=b, sub_batches=S, mix=quant.describe([quant.Store("4").at(k) for k in
                                                                             record["bits"]]),
                   planned=record["arena"] + record["overhead"], peak=int(peak), mix_error=mix_error,
                   uniform=uniform, uniform_error=uniform_error)
        rows.append(row)
        print(f"{name:>8}  {format_bytes(b):>10}  S={S:<3} peak {format_bytes(row['peak']):>10} "
              f"({'within' if row['peak'] <= b else 'OVER'})  mix {mix_error:.3e}  uniform {uniform} "
              f"{uniform_error:.3e}  {row['mix']}", flush=True)
    return rows


def table(model, batch, rows):
    print(f"\n{model}, batch {batch}: --memory at each budget (peak: VmHWM of the trainer's own process; errors: "
          "||g - g_exact||^2 / SGD noise)")
    print(f"{'budget':>10} {'':>8} {'S':>3} {'planned':>10} {'peak':>10} {'mix error':>10} {'uniform':>12}  mix")
    ok = True
    for r in rows:
        if "failed" in r:
            print(f"{format_bytes(r['budget']):>10} {r['name']:>8}  failed: {r['failed']}")
            ok = False
            continue
        within = r["peak"] <= r["budget"]
        better = r["uniform"] is None or r["mix_error"] <= r["uniform_error"] * (1 + 1e-9)
        ok &= within and better
        uniform = f"{r['uniform_error']:.2e} ({r['uniform']})" if r["uniform"] else "none fits"
        print(f"{format_bytes(r['budget']):>10} {r['name']:>8} {r['sub_batches']:>3} {format_bytes(r['planned']):>10} "
              f"{format_bytes(r['peak']):>10} {r['mix_error']:10.2e} {uniform:>12}  {r['mix']}")
    print(f"goals ({model}): every peak within its budget and every mix's error at most the uniform store's: "
          f"{'met' if ok else 'NOT met'}")
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet164,resnet1001")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--train", type=int, default=2048, help="training images in the data file (default 2048)")
    parser.add_argument("--noise", type=int, default=4, help="batches SGD's noise is measured over (default 4)")
    parser.add_argument("--data-dir", default="data")
    seed_option(parser)
    parser.add_argument("--solve-time", action="store_true", help="only time a solve for each of --models")
    parser.add_argument("--quick", action="store_true", help="ResNet-11 on random 8x8 data, batch 16: seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batch, args.noise = "resnet11", 16, 2
    print(f"CPU: {cpu_model()}")
    if args.solve_time:
        for model in args.models.split(","):
            solve_time(models.by_name(model, input_shape=(32, 32, 3), classes=10), args.batch)
        return 0
    ok = True
    with tempfile.TemporaryDirectory(prefix="minibp-budget-") as folder:
        for model in args.models.split(","):
            ok &= table(model, args.batch, run(model, args, folder))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
