"""Train a net with approximate activations: the paper's ResNets by name, or your own net, under every
guarantee of a run (README, Reliability).

    python3 -m minibp.train --data fashion-mnist --model resnet20 --bits 4 --iters 800 \\
        --lr-schedule 0:0.02,50:0.1,400:0.01,650:0.001 --val-every 200 --out runs/fm-4bit
    python3 -m minibp.train --out runs/fm-4bit --resume        # continue after Ctrl-C
    python3 -m minibp.evaluate runs/fm-4bit                    # test accuracy of its checkpoint
    python3 -m minibp.train --data cifar10                     # the paper's recipe: ResNet-164, 4 bits, 64k iterations
    python3 -m minibp.train --data cifar100 --model resnet1001 --batch 128 --split 2 --bits 4
    python3 -m minibp.train --data imagenet --data-dir DIR     # ResNet-152, batch 256, 640k iterations
    python3 -m minibp.train --data fashion-mnist --model docs/vgg_example.py:build --model-arg width=16 \\
        --iters 800 --lr-schedule cosine:0.05:warmup=50 --val-every 200 --out runs/fm-vgg      # your own net
    mpirun -n 2 python3 -m minibp.train --data cifar10         # 2 ranks, 64 of each 128 images (dist.py)

Your own net: --model FILE.py:FUNCTION (or package.module:FUNCTION) is called as FUNCTION(input_shape=...,
classes=..., NAME=VALUE for each --model-arg) and returns an uncompiled minibp.net.Net (models.build).
From Python, fit() below runs this same loop: minibp.fit(build, data="fashion-mnist", out="runs/fm-vgg", ...).

Writes OUT/metrics.jsonl (one JSON object a line: {"kind": "train"|"val"|"resume", "iter", ..., "time"}) and
OUT/checkpoint.h5 (atomically, every --checkpoint-every iterations, at the end, on Ctrl-C and on
SIGTERM). A resumed run continues with the saved configuration and data order and ends with the same
weights as an uninterrupted one. One trainer at a time owns a run folder (rundir.py). A run that
diverges stops without touching its last good checkpoint and says how to resume it. Under mpirun the
ranks take the step of one process with ranks x --split sub-batches (step.py), and rank 0 alone
writes the run folder. The console gives the plan once, then a line every --log-every iterations (loss
and accuracy averaged over them) and at each validation, each with the time elapsed since this process
began training and the ETA at this session's pace (validations included).

Exit status: 0 done, 1 the run failed (diverged, a write failed), 2 a bad option or input file,
130 interrupted (a checkpoint was saved).
"""
import argparse
import contextlib
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
from .runconfig import (apply_data_defaults, build_parser, check_config, describe_store, given_options, new_config,
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
        return _session(args, given_options(argv), group)[0]
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


def fit(model, *, data, out, resume=False, overwrite=False, model_args=None, **options):
    """Train `model` on a prepared data set through the loop of python3 -m minibp.train, with its guarantees
    (atomic checksummed checkpoints, bit-identical resume, the run-folder lock, divergence stopped, memory
    checked before allocation, ranks under mpirun), and return the trained net (compiled for training).

        import minibp
        from vgg_example import build     # def build(*, input_shape, classes, width=16) -> minibp.net.Net
        net = minibp.fit(build, data="fashion-mnist", out="runs/fm-vgg", model_args=dict(width=16), iters=800,
                         lr_schedule="cosine:0.05:warmup=50", batch=128, bits="4", val_every=200)
        logits = net.predict(images)      # after: python3 -m minibp.evaluate runs/fm-vgg works as for any run
        minibp.fit(build, data="fashion-mnist", out="runs/fm-vgg", model_args=dict(width=16), iters=1600,
                   resume=True)           # continue it (or from the command line: --out runs/fm-vgg --resume)

    model: a module-level function called as model(input_shape=..., classes=..., **model_args) that returns an
    uncompiled minibp.net.Net, defined in a file (a script's training code under `if __name__ == "__main__":`,
    since a resume and python3 -m minibp.evaluate import that file again); or a model spec as --model takes it
    ("resnet20", "FILE.py:FUNCTION", "package.module:FUNCTION"). data: a data set python -m minibp.prepare
    prepared ("fashion-mnist", "cifar10", ...) or "imagenet". out: the run folder. resume / overwrite: as
    --resume / --overwrite. model_args: the function's keyword arguments (numbers, strings, booleans, None, and
    lists and dicts of them: the checkpoint records them). options: any other option of the command line under
    its name, with the same default (python3 -m minibp.train --help): iters, lr_schedule, batch, bits, window,
    split, seed, momentum, weight_decay, no_augment, log_every, val_every, checkpoint_every, data_dir, graph,
    image_size, workers, rank_timeout.

    A bad option or input is a ValueError (or FileNotFoundError) with the command line's message, raised
    before anything is written; a diverged run raises Diverged, a failed write WriteFailed. Ctrl-C or SIGTERM
    finishes the iteration, saves a checkpoint and raises KeyboardInterrupt."""
    parser = build_parser(exit_on_error=False)
    names = {a.dest for a in parser._actions} - {"help", "data", "out", "resume", "overwrite", "model", "model_args"}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"fit() got unknown options {', '.join(unknown)}; it takes {', '.join(sorted(names))}")
    function = None if isinstance(model, str) else model
    argv = ["--model", models.spec_of(function) if function else model, "--data", str(data), "--out", str(out)]
    argv += ["--resume"] * bool(resume) + ["--overwrite"] * bool(overwrite)
    if not isinstance(model_args or {}, dict):
        raise TypeError(f"model_args must be a dict of keyword arguments, got {type(model_args).__name__}")
    for name, value in (model_args or {}).items():  # repr: a literal that --model-arg reads back
        argv += ["--model-arg", f"{name}={value!r}"]
    for name, value in options.items():  # as the command line gives them, so that they are checked alike
        flag = f"--{name.replace('_', '-')}"
        if parser._option_string_actions[flag].nargs == 0:  # a switch: present or not
            argv += [flag] * bool(value)
        elif value is not None:
            argv += [flag, str(value)]
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as e:
        raise ValueError(str(e)) from None
    status, net = _session(args, given_options(argv), dist.start(timeout=args.rank_timeout), function=function,
                           python=True)
    if status == 130:
        raise KeyboardInterrupt(f"stopped: a checkpoint is saved in {out}; continue with fit(..., resume=True)")
    return net


def _session(args, given, group, *, function=None, python=False):
    """(exit status, net) of a run (_run), on one process or on every rank of a group, whose ranks must
    agree on the options; rank 0 alone prints. function: the model's function (fit), else the spec's."""
    if group is not None:
        group.agree(dict(vars(args), data_dir=str(Path(args.data_dir).resolve())))
    with contextlib.ExitStack() as stack:
        if group is not None and group.rank:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        stack.enter_context(np.errstate(all="ignore"))  # a diverging step is found by finiteness checks, not warnings
        return _run(args, given, group, function=function, python=python)


def _failed(group, error, message, code):
    """Print the one-line error and return the exit status (several ranks: dist.Group.report says which
    rank prints, and may end the job)."""
    if group is None:
        print(f"error: {message}", file=sys.stderr)
        return code
    return group.report(message, error, code)


def _run(args, given, group=None, *, function=None, python=False):
    apply_data_defaults(args, given)
    if args.resume and args.overwrite:
        raise ValueError("--resume continues a run and --overwrite starts it again: give one")
    window = f"-{args.window}" if args.window != DEFAULT_WINDOW and args.bits not in ("exact", "naive") else ""
    window += "-stochastic" if args.rounding == "stochastic" else ""
    out = Path(args.out or f"runs/{args.data}-{models.short_name(args.model)}-{args.bits}{window}-seed{args.seed}")
    ranks = group.size if group else 1

    def claim():
        if not args.resume:  # the cheap checks before anything touches the disk
            check_config(new_config(args, ranks=ranks), ranks=ranks)
        return RunDir.claim(out, fresh=not args.resume, overwrite=args.overwrite)

    # several ranks: the run folder is rank 0's; the others know its paths and never touch it
    run = claim() if group is None else group.on_rank_0(claim, share_result=False) or RunDir(out, None)
    try:
        return _train(args, given, run, out, group, function=function, python=python)
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


def _train(args, given, run, out, group=None, *, function=None, python=False):
    """(exit status, net) of the run in `run`: fresh or resumed, to its last iteration or a signal.
    function: the model's (fit), else the one the spec names; python: advice in fit's words."""
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
    schedule = parse_schedule(config["lr_schedule"], iters=config["iters"])

    train_split, test_split, mean, batches, input_shape = load_data(config)
    if saved is not None:
        if isinstance(train_split, imagenet.Folder):  # the sorted folder names are the labels
            saved.check_classes(train_split.class_names, train_split.root)
        batches.restore(saved.data_state)
    built = models.describe(config["model"], config["model_args"])
    net = models.build(config["model"], model_args=config["model_args"], imagenet=config["data"] == "imagenet",
                       input_shape=input_shape, classes=train_split.classes, function=function)
    if saved is not None:
        saved.check_parameters(net, built)
    sub_batch = config["batch"] // config["split"]
    compile_within_memory(net, batch=sub_batch, bits=config["bits"], window=config["window"],
                          rounding=config["rounding"], seed=config["seed"])
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
    in_sub_batches = f" ({config['split']} x {sub_batch})" if config["split"] > 1 else ""
    if ranks > 1:
        in_sub_batches = f" ({ranks} ranks x {config['split'] // ranks} x {sub_batch})"
    print(f"{built} ({len(net.units)} units, {net.num_parameters:,} parameters) on {config['data']} "
          f"({len(train_split.labels):,} training images), {describe_store(config)}, batch {config['batch']}"
          f"{in_sub_batches}, device {backend.device}{', one CUDA graph a step' if step.graph else ''}")
    print(f"plan of a step, allocated once:\n{net.arena.plan.summary()}")
    if saved:
        print(f"resumed from {run.checkpoint_path} at iteration {iteration}"
              + "".join(f"; {k} {old} -> {new}" for k, (old, new) in changed.items()))

    command = f"mpirun -n {ranks} python -m minibp.train" if ranks > 1 else "python -m minibp.train"

    def resume_advice(**change):  # how to continue this run, with `change`d options, in the caller's words
        if python:
            return "fit(..., " + "".join(f"{k}={v!r}, " for k, v in change.items()) + "resume=True)"
        return f"{command} --out {out} --resume" + "".join(f" --{k.replace('_', '-')} {v}" for k, v in change.items())

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
        lower = schedule.divided(10)
        if last_saved[0] is None:
            again = (f"fit(..., overwrite=True, lr_schedule={lower!r})" if python else
                     f"{command} ... --overwrite --lr-schedule {lower}")
            return f"training diverged {what}; no checkpoint was saved. Start again with a lower learning rate: {again}"
        return (f"training diverged {what}; the last good checkpoint is {run.checkpoint_path} (iteration "
                f"{last_saved[0]}). Resume it with a lower learning rate: {resume_advice(lr_schedule=lower)}")

    def due(every, at, cfg=config):  # a log, checkpoint or validation point: every `every` iterations, and the last
        return at % cfg[every] == 0 or at == cfg["iters"]

    clock = Clock(first=iteration, last=config["iters"])

    def say(what):  # a console line: the iteration, what happened, the time
        width = len(str(config["iters"]))
        print(f"iter {iteration:{width}d}/{config['iters']}  {what}  {clock.now(iteration)}", flush=True)

    def validate():
        val_loss, val_accuracy = evaluate(net, test_split, mean, group=group, workers=config.get("workers"))
        say(f"validation loss {val_loss:.4f}  acc {val_accuracy:.4f}")
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
        window_start, window_images, sums = time.perf_counter(), 0, []  # sums: (loss, accuracy) a step since the log
        while iteration < config["iters"] and not stopping():
            lr = schedule.rate(iteration)
            images, labels = batches.next()
            if group is not None:  # every rank draws the whole batch, as one process would, and keeps its rows
                rows = group.share_of(config["batch"])
                images, labels = images[rows], labels[rows]
            try:
                step.run(images, labels, lr=lr, iteration=iteration)
            except FloatingPointError as e:
                raise Diverged(diverged_message(f"at iteration {iteration + 1} ({e})")) from None
            iteration += 1
            window_images += config["batch"]
            sums.append(step.result())  # eager: host floats already; a graph's step: a host read a step
            if not np.isfinite(sums[-1][0]):
                raise Diverged(diverged_message(f"at iteration {iteration} (the loss is {sums[-1][0]})"))
            if due("log_every", iteration):
                loss, accuracy = (float(v) for v in np.mean(sums, axis=0))
                rate = window_images / (time.perf_counter() - window_start)
                say(f"loss {loss:.4f}  acc {accuracy:.3f}  lr {lr:.3g}  {rate:.0f} img/s")
                log(kind="train", iter=iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                    planned_bytes=planned, averaged_over=len(sums))
                window_start, window_images, sums = time.perf_counter(), 0, []
            if due("checkpoint_every", iteration):
                save()  # before the validation, so a failing validation loses no training
            if due("val_every", iteration):
                validate()
                window_start = time.perf_counter()
        if stopping():
            if last_saved[0] != iteration:
                save()
            print(f"stopped at iteration {iteration}: checkpoint saved to {run.checkpoint_path}\n"
                  f"continue with: {resume_advice()}", flush=True)
            return 130, net
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        metrics.close()
        if isinstance(batches, imagenet.Batches):
            batches.close()  # its decoding processes
    if rank_0:
        run.check()  # the folder named below is still this run's
    print(f"done: {iteration} iterations in {clock.elapsed()}; checkpoint {run.checkpoint_path}, metrics "
          f"{run.metrics_path}")
    return 0, net


class Clock:
    """This session's time since training began, and the ETA of the run's last iteration at the pace of this
    session so far (validations and checkpoints included, as the rest of the run will have them)."""

    def __init__(self, *, first, last):
        self.start, self.first, self.last = time.monotonic(), first, last

    def elapsed(self):
        return _clock_time(time.monotonic() - self.start)

    def now(self, iteration):
        """'elapsed 1:23  eta 4:56' at `iteration` (eta ? before this session's first iteration ends)."""
        seconds, done = time.monotonic() - self.start, iteration - self.first
        eta = _clock_time(seconds / done * (self.last - iteration)) if done > 0 else "?"
        return f"elapsed {_clock_time(seconds)}  eta {eta}"


def _clock_time(seconds):
    """3725.2 -> '1:02:05', 83 -> '1:23'."""
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


if __name__ == "__main__":
    sys.exit(main())
