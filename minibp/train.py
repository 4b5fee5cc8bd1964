"""Train a pre-activation ResNet with approximate activations: the paper's recipe by default.

    python -m minibp.train --data cifar10                                # ResNet-164, 4 bits, 64k iterations
    python -m minibp.train --data fashion-mnist --model resnet20 --iters 2000 \\
        --lr-schedule 0:0.01,100:0.1,1000:0.01,1500:0.001 --out runs/fm-4bit
    python -m minibp.train --out runs/fm-4bit --resume                   # continue after Ctrl-C
    python -m minibp.evaluate runs/fm-4bit                               # test accuracy of its checkpoint

Writes OUT/metrics.jsonl (one JSON object a line: {"kind": "train"|"val", "iter", ...}) and
OUT/checkpoint.h5 (atomically, every --checkpoint-every iterations, at the end and on Ctrl-C).
A resumed run continues with the saved configuration and data order and ends with the same weights
as an uninterrupted one.
"""
import argparse
import json
import signal
import sys
import time
from pathlib import Path

import numpy as np

from . import backend, checkpoint, data, models
from .arena import format_bytes
from .net import MODE_BITS
from .optim import SGD

REFERENCE_SCHEDULE = "0:0.01,400:0.1,32000:0.01,48000:0.001"  # METHOD.md's recipe, for 64k iterations


def parse_schedule(text):
    """'0:0.01,400:0.1,...' -> [(0, 0.01), (400, 0.1), ...]: the rate from each iteration on."""
    try:
        steps = sorted((int(it), float(lr)) for it, lr in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise ValueError(f"a learning-rate schedule is ITER:LR[,ITER:LR...], e.g. {REFERENCE_SCHEDULE}; "
                         f"got {text!r}") from None
    if not steps or steps[0][0] != 0 or any(lr < 0 or not np.isfinite(lr) for _, lr in steps):
        raise ValueError(f"the schedule must start at iteration 0 with finite non-negative rates, got {text!r}")
    return steps


def learning_rate(schedule, iteration):
    return [lr for start, lr in schedule if start <= iteration][-1]


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minibp.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=data.DATASETS, default="cifar10")
    p.add_argument("--data-dir", default="data", help="where datasets/prepare.py wrote <data>.h5 (default: data)")
    p.add_argument("--model", default="resnet164", help="resnet<9n+2>: resnet20, resnet164 (default), resnet1001")
    p.add_argument("--bits", choices=list(MODE_BITS), default="4",
                   help="activation store: exact, 8, 4 (default), 2, or naive (4 bits fed forward: the ablation)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--split", type=int, default=1, help="sub-batches a batch is computed in (gradients accumulate)")
    p.add_argument("--iters", type=int, default=None, help="iterations in all (default 64000)")
    p.add_argument("--lr-schedule", default=REFERENCE_SCHEDULE, help=f"ITER:LR,... (default {REFERENCE_SCHEDULE})")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=2e-4)
    p.add_argument("--no-augment", action="store_true", help="no pad-and-crop or flips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="run folder (default: runs/<data>-<model>-<bits>-seed<seed>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--val-every", type=int, default=400)
    p.add_argument("--checkpoint-every", type=int, default=400)
    return p


def evaluate(net, split, mean):
    """(loss, accuracy) of net (running BN statistics) over a whole split."""
    total_loss = total_correct = 0.0
    for images, labels in data.evaluation_batches(split, batch=net.batch, mean=mean):
        loss, accuracy = net.forward(images, labels, train=False)
        total_loss += loss * len(labels)
        total_correct += accuracy * len(labels)
    return total_loss / len(split.labels), total_correct / len(split.labels)


def _config(args):
    config = {k: v for k, v in vars(args).items() if k not in ("resume", "out")}
    config["iters"] = 64000 if args.iters is None else args.iters
    return config


def _check_config(config):
    if config["batch"] < 1 or config["split"] < 1 or config["batch"] % config["split"]:
        raise ValueError(f"--batch ({config['batch']}) must be a positive multiple of --split ({config['split']})")
    if config["iters"] < 1:
        raise ValueError("--iters must be positive")
    for key in ("log_every", "val_every", "checkpoint_every"):
        if config[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be positive")
    models.depth_of(config["model"])
    parse_schedule(config["lr_schedule"])


class MetricsLog:
    """OUT/metrics.jsonl: appended a line at a time, flushed, so a crash loses nothing written."""

    def __init__(self, path, *, keep_through=None):
        self.path = Path(path)
        if keep_through is not None and self.path.exists():  # a resumed run: drop records past the checkpoint
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("iter", 0) <= keep_through]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.file = open(self.path, "a")

    def write(self, **record):
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args):
    out = Path(args.out or f"runs/{args.data}-{args.model}-{args.bits}-seed{args.seed}")
    ckpt_path = out / "checkpoint.h5"
    saved = None
    if args.resume:
        if not ckpt_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {ckpt_path}")
        saved = checkpoint.load(ckpt_path)
        config = saved.config
        if args.iters is not None:
            config["iters"] = args.iters
    else:
        if ckpt_path.exists():
            raise ValueError(f"{out} already holds a run: pass --resume to continue it, or another --out")
        config = _config(args)
    _check_config(config)
    schedule = parse_schedule(config["lr_schedule"])

    path = data.dataset_path(config["data_dir"], config["data"])
    train_split, test_split = data.load_split(path, "train"), data.load_split(path, "test")
    mean = train_split.pixel_mean()
    net = models.by_name(config["model"], input_shape=train_split.images.shape[1:], classes=train_split.classes)
    sub_batch = config["batch"] // config["split"]
    net.compile(batch=sub_batch, mode=config["bits"], seed=config["seed"])
    opt = SGD(net, momentum=config["momentum"], weight_decay=config["weight_decay"])
    batches = data.Batches(train_split, batch=config["batch"], mean=mean, augment=not config["no_augment"],
                           seed=config["seed"])
    iteration = 0
    if saved is not None:
        checkpoint.restore(net, saved)
        batches.restore(saved.data_state)
        iteration = saved.iteration
    out.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(out / "metrics.jsonl", keep_through=iteration if saved else None)
    planned = net.arena.plan.total_bytes
    in_sub_batches = f" ({config['split']} x {sub_batch})" if config["split"] > 1 else ""
    print(f"{config['model']} ({len(net.units)} units, {net.num_parameters:,} parameters) on {config['data']} "
          f"({len(train_split.labels):,} training images), mode {config['bits']}, batch {config['batch']}"
          f"{in_sub_batches}, device {backend.device}")
    print(net.arena.plan.summary())
    if saved:
        print(f"resumed from {ckpt_path} at iteration {iteration}")

    interrupted = []

    def on_interrupt(*_):
        if interrupted:  # a second Ctrl-C: stop at once (the last checkpoint stays)
            raise KeyboardInterrupt
        interrupted.append(True)
        print("\ninterrupt: finishing this iteration, then saving a checkpoint (Ctrl-C again to quit now)",
              flush=True)

    previous_handler = signal.signal(signal.SIGINT, on_interrupt)

    def save():
        checkpoint.save(ckpt_path, net, iteration=iteration, config=config, data_state=batches.state())

    try:
        window_start, window_images = time.perf_counter(), 0
        while iteration < config["iters"] and not interrupted:
            lr = learning_rate(schedule, iteration)
            images, labels = batches.next()
            net.zero_grad()
            losses, accuracies = [], []
            for start in range(0, config["batch"], sub_batch):
                loss, accuracy = net.forward(images[start:start + sub_batch], labels[start:start + sub_batch])
                net.backward(loss_scale=1.0 / config["split"])
                losses.append(loss)
                accuracies.append(accuracy)
            opt.step(lr=lr)
            iteration += 1
            window_images += config["batch"]
            if iteration % config["log_every"] == 0 or iteration == config["iters"]:
                rate = window_images / (time.perf_counter() - window_start)
                loss, accuracy = float(np.mean(losses)), float(np.mean(accuracies))
                print(f"iter {iteration:6d}/{config['iters']}  loss {loss:.4f}  acc {accuracy:.3f}  lr {lr:g}  "
                      f"{rate:7.1f} img/s  plan {format_bytes(planned)}", flush=True)
                metrics.write(kind="train", iter=iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                              planned_bytes=planned)
                window_start, window_images = time.perf_counter(), 0
            if iteration % config["val_every"] == 0 or iteration == config["iters"]:
                val_loss, val_accuracy = evaluate(net, test_split, mean)
                print(f"iter {iteration:6d}  validation loss {val_loss:.4f}  accuracy {val_accuracy:.4f}", flush=True)
                metrics.write(kind="val", iter=iteration, loss=val_loss, accuracy=val_accuracy)
                window_start = time.perf_counter()
            if iteration % config["checkpoint_every"] == 0 or iteration == config["iters"]:
                save()
    finally:
        signal.signal(signal.SIGINT, previous_handler)
    if interrupted:
        save()
        print(f"interrupted at iteration {iteration}: checkpoint saved to {ckpt_path}\n"
              f"continue with: python -m minibp.train --out {out} --resume", flush=True)
        return 130
    print(f"done: {iteration} iterations; checkpoint {ckpt_path}, metrics {out / 'metrics.jsonl'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
