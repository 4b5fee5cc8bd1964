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
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from . import backend, checkpoint, data, dist, imagenet, models
from .arena import format_bytes
from .kernels import KernelError
from .optim import SGD
from .plan import largest_batch
from .quant import DEFAULT_WINDOW
from .rundir import FolderLost, MetricsLog, RunDir, read_metrics
from .runconfig import (apply_data_defaults, build_parser, check_config, given_options, learning_rate, new_config,
                        parse_schedule, resumed_config)
from .step import TrainStep


class Diverged(Exception):
    """The loss or the weights stopped being finite."""
    on_every_rank = True  # ranks training together meet it at the same step, from the same numbers (dist.report)


class WriteFailed(Exception):
    """A checkpoint or metrics write failed (a full disk): the checkpoint before it stays."""


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


def compile_within_memory(net, *, batch, bits, hint="lower --batch, or compute it in parts with --split", **options):
    """net.compile(batch=, bits=, **options), after checking that its plan fits the memory available now;
    the refusal gives the plan's size and the largest batch that fits."""
    training = options.get("training", True)
    window = options.get("window", DEFAULT_WINDOW)
    plan = net.plan(batch=batch, bits=bits, window=window, training=training)
    available = backend.available_memory()
    if available is not None and plan.allocation_bytes > available:
        fits = largest_batch(net, bits=bits, window=window, budget=available, training=training) if available > 0 else 0
        if fits == 0:  # no batch size helps: say what is too big
            one = net.plan(batch=1, bits=bits, window=window, training=training).allocation_bytes
            raise ValueError(f"even a batch of 1 needs {format_bytes(one)} but {backend.device} has "
                             f"{format_bytes(available)} available: the net is too large for this machine (input "
                             f"{'x'.join(map(str, net.input_shape))}, {net.classes:,} classes)")
        raise ValueError(f"a batch of {batch} needs {format_bytes(plan.allocation_bytes)} but {backend.device} has "
                         f"{format_bytes(available)} available: the largest batch that fits is {fits} ({hint})")
    return net.compile(batch=batch, bits=bits, **options)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(description=__doc__).parse_args(argv)
    group = None  # the ranks under mpirun (dist.py); None: one process
    try:
        group = dist.start(timeout=args.rank_timeout)
        if group is not None:
            group.agree(dict(vars(args), data_dir=str(Path(args.data_dir).resolve())))
            if group.rank:
                sys.stdout = open(os.devnull, "w")  # rank 0 alone prints the progress
        with np.errstate(all="ignore"):  # a diverging step is found by the finiteness checks, not by warnings
            return _run(args, given_options(argv), group)
    except (Diverged, FolderLost, WriteFailed) as e:
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
        config, changed = resumed_config(saved, given, run.checkpoint_path, ranks=ranks)
        check_config(config, ranks=ranks)
        return saved, config, changed

    if args.resume:  # several ranks: rank 0 reads the checkpoint and sends it to the others
        saved, config, changed = resume() if group is None else group.on_rank_0(resume)
    else:
        config = new_config(args, ranks=ranks)
    schedule = parse_schedule(config["lr_schedule"])

    train_split, test_split, mean, batches, input_shape = load_data(config)
    if saved is not None:
        if isinstance(train_split, imagenet.Folder):  # the sorted folder names are the labels
            saved.check_classes(train_split.class_names, train_split.root)
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
    last_saved = [saved.iteration if saved else None]

    def write_failed(path, error):
        run.check()  # a folder deleted mid-write is that, not a full disk
        kept = (f"the previous checkpoint (iteration {last_saved[0]}) is kept" if last_saved[0] is not None
                else "no checkpoint had been saved yet")
        return WriteFailed(f"cannot write {path} ({os.strerror(error.errno) if error.errno else error}); {kept}")

    try:
        metrics = MetricsLog(run.metrics_path, keep_through=iteration if saved else None, check=run.check) \
            if rank_0 else MetricsLog(os.devnull)
    except OSError as e:
        raise write_failed(run.metrics_path, e) from None

    def log(**record):
        try:
            metrics.write(**record)
        except OSError as e:
            raise write_failed(metrics.path, e) from None

    if changed:
        log(kind="resume", iter=iteration, changed=changed)
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

    command = f"mpirun -n {ranks} python -m minibp.train" if ranks > 1 else "python -m minibp.train"

    def save():
        try:
            if rank_0:
                run.check()
                checkpoint.save(run.checkpoint_path, net, iteration=iteration, config=config,
                                data_state=batches.state(), class_names=getattr(train_split, "class_names", None))
            else:  # the same state as rank 0's: stop with it
                checkpoint.check_finite(net.state())
        except checkpoint.NotFinite as e:
            raise Diverged(diverged_message(f"at iteration {iteration} ({e})")) from None
        except OSError as e:
            raise write_failed(run.checkpoint_path, e) from None
        last_saved[0] = iteration

    def diverged_message(what):
        lower = ",".join(f"{it}:{lr / 10:g}" for it, lr in schedule)
        if last_saved[0] is None:
            return (f"training diverged {what}; no checkpoint was saved. Start again with a lower learning rate: "
                    f"{command} ... --overwrite --lr-schedule {lower}")
        return (f"training diverged {what}; the last good checkpoint is {run.checkpoint_path} (iteration "
                f"{last_saved[0]}). Resume it with a lower learning rate: {command} --out {out} "
                f"--resume --lr-schedule {lower}")

    def due(every, at, cfg=config):  # a log, checkpoint or validation point: every `every` iterations, and the last
        return at % cfg[every] == 0 or at == cfg["iters"]

    def validate():
        val_loss, val_accuracy = evaluate(net, test_split, mean, group=group, workers=config.get("workers"))
        print(f"iter {iteration:6d}  validation loss {val_loss:.4f}  accuracy {val_accuracy:.4f}", flush=True)
        log(kind="val", iter=iteration, loss=val_loss, accuracy=val_accuracy)

    def unvalidated():
        return not any(r.get("kind") == "val" and r.get("iter") == iteration for r in read_metrics(run.metrics_path))

    # A checkpoint is saved before its validation, so a kill between the two leaves the validation undone:
    # the resumed run does it first. (A validation point of the run as saved or as resumed: --iters may have
    # moved the last one.)
    if saved is not None and iteration > 0 and any(due("val_every", iteration, c) for c in (config, saved.config)):
        if unvalidated() if group is None else group.on_rank_0(unvalidated):
            validate()

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
            if due("log_every", iteration):
                loss, accuracy = step.result()  # (a graph's step: the first host read since the last log)
                if not np.isfinite(loss):
                    raise Diverged(diverged_message(f"by iteration {iteration} (the loss is {loss})"))
                rate = window_images / (time.perf_counter() - window_start)
                print(f"iter {iteration:6d}/{config['iters']}  loss {loss:.4f}  acc {accuracy:.3f}  lr {lr:g}  "
                      f"{rate:7.1f} img/s  plan {format_bytes(planned)}", flush=True)
                log(kind="train", iter=iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                    planned_bytes=planned)
                window_start, window_images = time.perf_counter(), 0
            if due("checkpoint_every", iteration):
                save()  # before the validation, so a failing validation loses no training
            if due("val_every", iteration):
                validate()
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
    if rank_0:
        run.check()  # the folder named below is still this run's
    print(f"done: {iteration} iterations; checkpoint {run.checkpoint_path}, metrics {run.metrics_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
