"""Train a pre-activation ResNet with approximate activations: the paper's recipe by default.

    python -m minibp.train --data cifar10                                # ResNet-164, 4 bits, 64k iterations
    python -m minibp.train --data imagenet --data-dir DIR                # ResNet-152, batch 256, 640k iterations
    python -m minibp.train --data fashion-mnist --model resnet20 --iters 2000 \\
        --lr-schedule 0:0.01,100:0.1,1000:0.01,1500:0.001 --out runs/fm-4bit
    python -m minibp.train --out runs/fm-4bit --resume                   # continue after Ctrl-C
    python -m minibp.evaluate runs/fm-4bit                               # test accuracy of its checkpoint
    mpirun -n 2 python -m minibp.train --data cifar10                    # 2 ranks, 64 of each 128 images (dist.py)

Writes OUT/metrics.jsonl (one JSON object a line: {"kind": "train"|"val"|"resume", "iter", ...}) and
OUT/checkpoint.h5 (atomically, every --checkpoint-every iterations, at the end, on Ctrl-C and on
SIGTERM). A resumed run continues with the saved configuration and data order and ends with the same
weights as an uninterrupted one. One trainer at a time owns a run folder (rundir.py). A run that
diverges stops without touching its last good checkpoint and says how to resume it. Under mpirun the
ranks take the step of one process with ranks x --split sub-batches (step.py), and rank 0 alone
writes the run folder.

Exit status: 0 done, 1 the run failed (diverged, a write failed), 2 a bad option or input file,
130 interrupted (a checkpoint was saved).
"""
import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from . import backend, checkpoint, data, dist, imagenet, models
from .arena import format_bytes
from .kernels import KernelError
from .quant import BITS, DEFAULT_WINDOW, WINDOWS
from .optim import SGD
from .plan import largest_batch
from .rundir import MetricsLog, RunDir
from .step import TrainStep

REFERENCE_SCHEDULE = "0:0.01,400:0.1,32000:0.01,48000:0.001"  # the paper's recipe, for 64k iterations
# ImageNet: the paper's code's setting (ResNet-152, batch 256, 640k iterations, weight decay 1e-4, the rate
# divided by 10 every 160k iterations); validation about once an epoch (5,004 iterations).
IMAGENET_SCHEDULE = "0:0.1,160000:0.01,320000:0.001,480000:0.0001"
IMAGENET_DEFAULTS = dict(model="resnet152", data_dir="data/imagenet", batch=256, iters=640000, image_size=224,
                         lr_schedule=IMAGENET_SCHEDULE, weight_decay=1e-4, val_every=5000, checkpoint_every=1000)
# Options that define a run: a resumed run must keep them. The others may change on resume.
DEFINING = ("data", "model", "bits", "window", "batch", "split", "seed", "momentum", "weight_decay", "no_augment",
            "image_size")
CHANGEABLE = ("data_dir", "iters", "lr_schedule", "log_every", "val_every", "checkpoint_every", "graph", "workers")


class Diverged(Exception):
    """The loss or the weights stopped being finite."""
    on_every_rank = True  # ranks training together meet it at the same step, from the same numbers (dist.report)


def parse_schedule(text):
    """'0:0.01,400:0.1,...' -> [(0, 0.01), (400, 0.1), ...]: the rate from each iteration on."""
    try:
        steps = sorted((int(it), float(lr)) for it, lr in (part.split(":") for part in text.split(",")))
    except ValueError:
        raise ValueError(f"a learning-rate schedule is ITER:LR[,ITER:LR...], e.g. {REFERENCE_SCHEDULE}; "
                         f"got {text!r}") from None
    if not steps or steps[0][0] != 0 or any(lr < 0 or not np.isfinite(lr) for _, lr in steps):
        raise ValueError(f"the schedule must start at iteration 0 with finite non-negative rates, got {text!r}")
    repeated = sorted({it for (it, _), (nxt, _) in zip(steps, steps[1:]) if it == nxt})
    if repeated:
        raise ValueError(f"the schedule gives iteration {repeated[0]} more than one rate: {text!r}")
    return steps


def learning_rate(schedule, iteration):
    return [lr for start, lr in schedule if start <= iteration][-1]


def build_parser():
    p = argparse.ArgumentParser(prog="python -m minibp.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=data.DATASETS + ("imagenet",), default="cifar10",
                   help="imagenet: its folder of JPEGs, with the paper's ImageNet setting as the defaults")
    p.add_argument("--data-dir", default="data", help="where datasets/prepare.py wrote <data>.h5 (default: data); "
                   "for imagenet the folder holding train/<class>/ and val/<class>/ (default: data/imagenet)")
    p.add_argument("--model", default="resnet164", help="resnet<9n+2>: resnet20, resnet164 (default), resnet1001; "
                   "on imagenet resnet50, resnet101, resnet152 (default)")
    p.add_argument("--image-size", type=int, help="imagenet: the side of the training and validation crops "
                   "(default 224)")
    p.add_argument("--workers", type=int, help="imagenet: JPEG-decoding processes (default: the cores less one)")
    p.add_argument("--bits", choices=list(BITS), default="4",
                   help="activation store: exact, 8, 4 (default), 2, or naive (4 bits fed forward: the ablation)")
    p.add_argument("--window", choices=list(WINDOWS), default=DEFAULT_WINDOW,
                   help=f"the k-bit codes' window per channel: range (the batch's range of values) or fixed "
                        f"(the paper's, +-3 sigma); default {DEFAULT_WINDOW}")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--split", type=int, default=1, help="sub-batches a batch is computed in (gradients accumulate)")
    p.add_argument("--iters", type=int, default=64000, help="iterations in all (default 64000)")
    p.add_argument("--lr-schedule", default=REFERENCE_SCHEDULE, help=f"ITER:LR,... (default {REFERENCE_SCHEDULE})")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=2e-4)
    p.add_argument("--no-augment", action="store_true", help="no pad-and-crop or flips")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="run folder (default: runs/<data>-<model>-<bits>[-<window>]-seed<seed>, "
                   "the window named when it is not the default)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="start a new run in an --out that holds one")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--val-every", type=int, default=400)
    p.add_argument("--checkpoint-every", type=int, default=400)
    p.add_argument("--graph", action="store_true",
                   help="replay each training step as one CUDA graph (GPU; on the CPU steps run eagerly)")
    p.add_argument("--rank-timeout", type=float, default=60.0,
                   help="under mpirun: seconds a rank waits for the others before it stops the job (default 60)")
    return p


def given_options(argv):
    """The options present on the command line, {dest: value}, told apart from defaults."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return vars(parser.parse_args(argv))


def evaluate(net, split, mean, *, group=None, workers=None):
    """(loss, accuracy) of net (running BN statistics) over a whole split, from net.predict's logits. split:
    an HDF5 split, normalised by mean, or an imagenet.Folder (center crops of the net's input size, decoded
    by `workers` processes). group (dist.py): rank r evaluates batches r, r + ranks, ...; their sums are
    summed over the ranks (each batch's from one rank: exact) and added up in batch order on every rank,
    so every rank gets one process's figures, bit for bit."""
    if isinstance(split, imagenet.Folder):
        batches = imagenet.evaluation_batches(split, batch=net.batch, size=net.input_shape[0], workers=workers)
    else:
        batches = data.evaluation_batches(split, batch=net.batch, mean=mean)
    sums = []  # (-log-likelihood, correct) of each batch
    for i, (images, labels) in enumerate(batches):
        if group is not None and i % group.size != group.rank:
            sums.append((0.0, 0.0))
            continue
        logits = net.predict(images).astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        sums.append((-float(log_p[np.arange(len(labels)), labels].sum()), int((logits.argmax(axis=1) == labels).sum())))
    sums = np.array(sums, np.float64).reshape(-1, 2)  # (batches, 2)
    if group is not None:
        group.sum(sums)
    total_loss = total_correct = 0.0
    for loss, correct in sums.tolist():
        total_loss += loss
        total_correct += correct
    if not np.isfinite(total_loss):
        raise FloatingPointError(f"the loss over the {split.name} split is {total_loss}")
    return total_loss / len(split.labels), total_correct / len(split.labels)


def check_config(config, *, ranks=1):
    """ranks: the processes under mpirun; config["split"] counts the sub-batches of a step over all of them."""
    if config["batch"] < 1 or config["split"] < 1 or config["batch"] % config["split"]:
        split = f"{ranks} ranks x --split {config['split'] // ranks}" if ranks > 1 else "--split"
        raise ValueError(f"--batch ({config['batch']}) must be a positive multiple of {split} ({config['split']})")
    if config["split"] % ranks:
        raise ValueError(f"the run computes a batch in {config['split']} sub-batches, which {ranks} ranks cannot "
                         "share evenly: run it on a number of ranks that divides them")
    if config["iters"] < 1:
        raise ValueError("--iters must be positive")
    for key in ("log_every", "val_every", "checkpoint_every"):
        if config[key] < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be positive")
    models.depth_of(config["model"], imagenet=config["data"] == "imagenet")
    parse_schedule(config["lr_schedule"])
    if config.get("image_size") is not None and config["data"] != "imagenet":
        raise ValueError("--image-size applies to --data imagenet only")
    if config["data"] == "imagenet" and (config["image_size"] < 32 or config["image_size"] % 32):
        raise ValueError(f"--image-size must be a multiple of 32 (the net halves it five times), got "
                         f"{config['image_size']}")
    if config.get("workers") is not None and config["workers"] < 1:
        raise ValueError("--workers must be positive")


def compile_within_memory(net, *, batch, bits, hint="lower --batch, or compute it in parts with --split", **options):
    """net.compile(batch=, bits=, **options), after checking that its plan fits the memory available now;
    the refusal gives the plan's size and the largest batch that fits."""
    training = options.get("training", True)
    plan = net.plan(batch=batch, bits=bits, training=training)
    available = backend.available_memory()
    if available is not None and plan.allocation_bytes > available:
        fits = largest_batch(net, bits=bits, budget=available, training=training) if available > 0 else 0
        raise ValueError(f"a batch of {batch} needs {format_bytes(plan.allocation_bytes)} but {backend.device} has "
                         f"{format_bytes(available)} available: the largest batch that fits is {fits} ({hint})")
    return net.compile(batch=batch, bits=bits, **options)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    group = None  # the ranks under mpirun (dist.py); None: one process
    try:
        group = dist.start(timeout=args.rank_timeout)
        if group is not None:
            group.agree(dict(vars(args), data_dir=str(Path(args.data_dir).resolve())))
            if group.rank:
                sys.stdout = open(os.devnull, "w")  # rank 0 alone prints the progress
        with np.errstate(all="ignore"):  # a diverging step is found by the finiteness checks, not by warnings
            return _run(args, given_options(argv), group)
    except Diverged as e:
        return _failed(group, e, str(e), 1)
    except (ValueError, FileNotFoundError, KernelError) as e:
        return _failed(group, e, str(e), 2)
    except OSError as e:  # a full disk or a vanished folder while writing; a rank that stopped answering
        return _failed(group, e, f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}", 1)
    except KeyboardInterrupt:  # a second Ctrl-C: the last checkpoint stays as it was
        if group is None or group.rank == 0:
            print("\ninterrupted: the last checkpoint written stays as it was", file=sys.stderr)
        return 130


def _failed(group, error, message, code):
    """Print the one-line error and return the exit status (several ranks: dist.Group.report says which
    rank prints, and may end the job)."""
    if group is None:
        print(f"error: {message}", file=sys.stderr)
        return code
    return group.report(message, error, code)


def new_config(args, *, ranks=1):
    config = {k: v for k, v in vars(args).items() if k not in ("resume", "overwrite", "out", "rank_timeout")}
    config["data_dir"] = str(Path(args.data_dir).resolve())  # a run resumes from any folder
    # the sub-batches of a step over all ranks: ranks x split defines the run, so that 2 ranks x --split 1
    # and 1 process x --split 2, which compute the same step, resume each other's checkpoints
    config["split"] = args.split * ranks
    return config


def _resumed_config(saved, given, ckpt_path, *, ranks=1):
    """The saved configuration with the changeable options given now applied; a ValueError listing
    any defining option given with another value than the run's. ranks: as new_config."""
    config = dict(saved.config)
    config.setdefault("window", "fixed")  # runs from before the option coded through the paper's window
    if "split" in given:
        given = dict(given, split=given["split"] * ranks)
    differ = [f"--{k.replace('_', '-')} {given[k]} (the run has {config.get(k)})" if k != "split" or ranks == 1 else
              f"{ranks} ranks x --split {given[k] // ranks} (the run has {config.get(k)} sub-batches a step)"
              for k in DEFINING if k in given and given[k] != config.get(k)]
    if differ:
        raise ValueError(f"{ckpt_path} was trained with other options; a resumed run keeps them: "
                         + "; ".join(differ))
    changed = {k: [config.get(k), given[k]] for k in CHANGEABLE if k in given and given[k] != config.get(k)}
    for key, (_, new) in changed.items():
        config[key] = new
    if "data_dir" in changed:
        config["data_dir"] = str(Path(config["data_dir"]).resolve())
    return config, changed


def apply_data_defaults(args, given):
    """With --data imagenet, the paper's ImageNet setting (IMAGENET_DEFAULTS) for every option the command
    line does not give."""
    if args.data == "imagenet":
        for key, value in IMAGENET_DEFAULTS.items():
            if key not in given:
                setattr(args, key, value)
    return args


def _run(args, given, group=None):
    apply_data_defaults(args, given)
    if args.resume and args.overwrite:
        raise ValueError("--resume continues a run and --overwrite starts it again: give one")
    window = f"-{args.window}" if args.window != DEFAULT_WINDOW and args.bits not in ("exact", "naive") else ""
    out = Path(args.out or f"runs/{args.data}-{args.model}-{args.bits}{window}-seed{args.seed}")
    ranks = group.size if group else 1

    def claim():
        if not args.resume:  # the cheap checks before anything touches the disk
            check_config(new_config(args, ranks=ranks), ranks=ranks)
        return RunDir.claim(out, fresh=not args.resume, overwrite=args.overwrite)

    # several ranks: the run folder is rank 0's; the others know its paths and never touch it
    run = claim() if group is None else group.on_rank_0(claim, share_result=False) or RunDir(out, None)
    try:
        return _train(args, given, run, out, group)
    finally:
        if group is None or group.rank == 0:
            run.release()


def load_data(config):
    """(train split, test split, mean, training batches, input shape) of the run's data: a prepared HDF5
    file, or an ImageNet folder streamed by worker processes (its splits are imagenet.Folder listings, and
    the reader normalises: mean None)."""
    if config["data"] == "imagenet":
        train_split, test_split = imagenet.load_folders(config["data_dir"])
        batches = imagenet.Batches(train_split, batch=config["batch"], size=config["image_size"],
                                   augment=not config["no_augment"], seed=config["seed"], workers=config.get("workers"))
        return train_split, test_split, None, batches, batches.image_shape
    train_split, test_split = data.load_dataset(data.dataset_path(config["data_dir"], config["data"]))
    mean = train_split.pixel_mean()
    batches = data.Batches(train_split, batch=config["batch"], mean=mean, augment=not config["no_augment"],
                           seed=config["seed"])
    return train_split, test_split, mean, batches, train_split.images.shape[1:]


def _train(args, given, run, out, group=None):
    saved, changed, ranks = None, {}, group.size if group else 1

    def resume():
        if not run.checkpoint_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {run.checkpoint_path} (a run stopped before its "
                                    "first checkpoint starts again with --overwrite)")
        saved = checkpoint.load(run.checkpoint_path)
        config, changed = _resumed_config(saved, given, run.checkpoint_path, ranks=ranks)
        check_config(config, ranks=ranks)
        return saved, config, changed

    if args.resume:  # several ranks: rank 0 reads the checkpoint and sends it to the others
        saved, config, changed = resume() if group is None else group.on_rank_0(resume)
    else:
        config = new_config(args, ranks=ranks)
    schedule = parse_schedule(config["lr_schedule"])

    train_split, test_split, mean, batches, input_shape = load_data(config)
    if saved is not None:
        batches.restore(saved.data_state)
    net = models.by_name(config["model"], imagenet=config["data"] == "imagenet", input_shape=input_shape,
                         classes=train_split.classes)
    sub_batch = config["batch"] // config["split"]
    compile_within_memory(net, batch=sub_batch, bits=config["bits"], window=config["window"], seed=config["seed"])
    opt = SGD(net, momentum=config["momentum"], weight_decay=config["weight_decay"])
    step = TrainStep(net, opt, split=config["split"] // ranks, graph=config.get("graph", False), group=group)
    iteration = 0
    if saved is not None:
        checkpoint.restore(net, saved)
        iteration = saved.iteration
    rank_0 = group is None or group.rank == 0  # the one that writes metrics and checkpoints
    metrics = MetricsLog(run.metrics_path, keep_through=iteration if saved else None) if rank_0 else \
        MetricsLog(os.devnull)
    if changed:
        metrics.write(kind="resume", iter=iteration, changed=changed)
    planned = net.arena.plan.total_bytes
    window = f" ({net.window} window)" if net.k and not net.naive else ""
    in_sub_batches = f" ({config['split']} x {sub_batch})" if config["split"] > 1 else ""
    if ranks > 1:
        in_sub_batches = f" ({ranks} ranks x {config['split'] // ranks} x {sub_batch})"
    print(f"{config['model']} ({len(net.units)} units, {net.num_parameters:,} parameters) on {config['data']} "
          f"({len(train_split.labels):,} training images), bits {config['bits']}{window}, batch {config['batch']}"
          f"{in_sub_batches}, device {backend.device}{', one CUDA graph a step' if step.graph else ''}")
    print(net.arena.plan.summary())
    if saved:
        print(f"resumed from {run.checkpoint_path} at iteration {iteration}"
              + "".join(f"; {k} {old} -> {new}" for k, (old, new) in changed.items()))

    last_saved = [saved.iteration if saved else None]
    command = f"mpirun -n {ranks} python -m minibp.train" if ranks > 1 else "python -m minibp.train"

    def save():
        try:
            if rank_0:
                checkpoint.save(run.checkpoint_path, net, iteration=iteration, config=config,
                                data_state=batches.state())
            else:  # the same state as rank 0's: stop with it
                checkpoint.check_finite(net.state())
        except checkpoint.NotFinite as e:
            raise Diverged(diverged_message(f"at iteration {iteration} ({e})")) from None
        last_saved[0] = iteration

    def diverged_message(what):
        lower = ",".join(f"{it}:{lr / 10:g}" for it, lr in schedule)
        if last_saved[0] is None:
            return (f"training diverged {what}; no checkpoint was saved. Start again with a lower learning rate: "
                    f"{command} ... --overwrite --lr-schedule {lower}")
        return (f"training diverged {what}; the last good checkpoint is {run.checkpoint_path} (iteration "
                f"{last_saved[0]}). Resume it with a lower learning rate: {command} --out {out} "
                f"--resume --lr-schedule {lower}")

    stop = []

    def on_signal(number, _frame):
        if stop:  # a second Ctrl-C: stop at once (the last checkpoint stays)
            raise KeyboardInterrupt
        stop.append(number)
        print(f"\n{signal.Signals(number).name}: finishing this iteration, then saving a checkpoint "
              "(Ctrl-C again to quit now)", flush=True)

    def stopping():  # several ranks stop together, at the first iteration any of them was signalled by
        return bool(stop) if group is None else group.any(stop)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        window_start, window_images = time.perf_counter(), 0
        while iteration < config["iters"] and not stopping():
            lr = learning_rate(schedule, iteration)
            images, labels = batches.next()
            if group is not None:  # every rank draws the whole batch, as one process would, and keeps its rows
                rows = group.share_of(config["batch"])
                images, labels = images[rows], labels[rows]
            try:
                step.run(images, labels, lr=lr)
            except FloatingPointError as e:
                raise Diverged(diverged_message(f"at iteration {iteration + 1} ({e})")) from None
            iteration += 1
            window_images += config["batch"]
            if iteration % config["log_every"] == 0 or iteration == config["iters"]:
                loss, accuracy = step.result()  # (a graph's step: the first host read since the last log)
                if not np.isfinite(loss):
                    raise Diverged(diverged_message(f"by iteration {iteration} (the loss is {loss})"))
                rate = window_images / (time.perf_counter() - window_start)
                print(f"iter {iteration:6d}/{config['iters']}  loss {loss:.4f}  acc {accuracy:.3f}  lr {lr:g}  "
                      f"{rate:7.1f} img/s  plan {format_bytes(planned)}", flush=True)
                metrics.write(kind="train", iter=iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                              planned_bytes=planned)
                window_start, window_images = time.perf_counter(), 0
            if iteration % config["checkpoint_every"] == 0 or iteration == config["iters"]:
                save()  # before the validation, so a failing validation loses no training
            if iteration % config["val_every"] == 0 or iteration == config["iters"]:
                val_loss, val_accuracy = evaluate(net, test_split, mean, group=group, workers=config.get("workers"))
                print(f"iter {iteration:6d}  validation loss {val_loss:.4f}  accuracy {val_accuracy:.4f}", flush=True)
                metrics.write(kind="val", iter=iteration, loss=val_loss, accuracy=val_accuracy)
                window_start = time.perf_counter()
        if stopping():
            if last_saved[0] != iteration:
                save()
            print(f"stopped at iteration {iteration}: checkpoint saved to {run.checkpoint_path}\n"
                  f"continue with: {command} --out {out} --resume", flush=True)
            return 130
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        metrics.close()
        if isinstance(batches, imagenet.Batches):
            batches.close()  # its decoding processes
    print(f"done: {iteration} iterations; checkpoint {run.checkpoint_path}, metrics {run.metrics_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
