"""Train a net with approximate activations: the paper's ResNets by name, or your own net, under every
guarantee of a run (README, Reliability).

    python3 -m minibp.train --data fashion-mnist --model resnet20 --bits 4 --iters 2000 \\
        --lr-schedule cosine:0.1:warmup=100 --augment none --val-every 500 --out runs/fm-4bit
    python3 -m minibp.train --out runs/fm-4bit --resume        # continue after Ctrl-C
    python3 -m minibp.evaluate runs/fm-4bit                    # test accuracy of its checkpoint
    python3 -m minibp.train --data cifar10                     # the paper's recipe: ResNet-164, 4 bits, 64k iterations
    python3 -m minibp.train --data cifar100 --model resnet1001 --batch 128 --sub-batches 2 --bits 4
    python3 -m minibp.train --data imagenet --data-dir DIR     # ResNet-152, batch 256, 640k iterations
    python3 -m minibp.train --data fashion-mnist --model docs/vgg_example.py:build --model-arg width=16 \\
        --iters 800 --lr-schedule cosine:0.05:warmup=50 --val-every 200 --out runs/fm-vgg      # your own net
    mpirun -n 2 python3 -m minibp.train --data cifar10         # 2 ranks, 64 of each 128 images (dist.py)

Your own net: --model FILE.py:FUNCTION (or package.module:FUNCTION) is called as FUNCTION(input_shape=...,
classes=..., NAME=VALUE for each --model-arg) and returns an uncompiled minibp.net.Net (modelspec.build).
From Python, fit() below runs this same loop: minibp.fit(build, data="fashion-mnist", out="runs/fm-vgg", ...).

Writes OUT/metrics.jsonl (one JSON object a line: {"kind": "train"|"val"|"resume", "iter", ..., "time"}) and
OUT/checkpoint.h5 (atomically, every --checkpoint-every iterations, at the end, on Ctrl-C and on
SIGTERM). A resumed run continues with the saved configuration and data order and ends with the same
weights as an uninterrupted one. One trainer at a time owns a run folder (run/folder.py). A run that
diverges stops without touching its last good checkpoint and says how to resume it. Under mpirun the
ranks take the step of one process with ranks x --sub-batches (step.py), and rank 0 alone
writes the run folder. The console gives the plan once, then a line every --log-every iterations (loss
and accuracy averaged over them) and at each validation, each with the time elapsed since this process
began training and the ETA at this session's pace (validations included).

Exit status: 0 done, 1 the run failed (diverged, a write failed), 2 a bad option or input file,
130 interrupted (a checkpoint was saved).
"""
import contextlib
import functools
import os
import signal
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np

from . import backend, dist
from .io import imagenet
from .kernels import KernelError
from .optim import SGD, AdamW
from .run import checkpoint, modelspec, splits
from .run.config import RunConfig
from .run.options import OPTIONS, Invocation, read_command_line
from .run.evaluation import evaluate
from .run.folder import FolderLost, MetricsLog, RunDir, read_metrics
from .run.sizing import compile_within_memory
from .step import TrainStep


class Diverged(Exception):
    """The loss or the weights stopped being finite."""
    on_every_rank = True  # ranks training together meet it at the same step, from the same numbers (dist.report)


class WriteFailed(Exception):
    """A checkpoint or metrics write failed (a full disk): the checkpoint before it stays."""


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    group = None  # the ranks under mpirun (dist.py); None: one process
    try:
        invocation, given = read_command_line(argv, description=__doc__)
        group = dist.start(timeout=invocation.rank_timeout)
        return _session(invocation, given, group)[0]
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
    ("resnet20", "FILE.py:FUNCTION", "package.module:FUNCTION"). data: a data set python3 -m minibp.prepare
    prepared ("fashion-mnist", "cifar10", ...) or "imagenet". out: the run folder. resume / overwrite: as
    --resume / --overwrite. model_args: the function's keyword arguments (numbers, strings, booleans, None, and
    lists and dicts of them: the checkpoint records them). options: any other option of the command line under
    its field's name (run/config.py RunConfig; python3 -m minibp.train --help), with the same default: iters,
    lr_schedule, batch, sub_batches, bits, window, rounding, clip, seed, augment, val_split, optimizer, momentum,
    weight_decay, clip_norm, log_every, val_every, checkpoint_every, data_dir, graph, image_size, workers,
    rank_timeout. A value is read as the command line reads its text (bits=4 is "4"); None leaves the default.

    A bad option or input is a ValueError (or FileNotFoundError) with the command line's message, raised
    before anything is written; a diverged run raises Diverged, a failed write WriteFailed. Ctrl-C or SIGTERM
    finishes the iteration, saves a checkpoint and raises KeyboardInterrupt."""
    if modelspec.importing():  # this file is being imported by minibp to rebuild its net: never train it again
        raise ValueError(f"fit() was called while minibp imported {modelspec.importing()} to rebuild the net (a "
                         "resume, evaluate or load): put the script's training under `if __name__ == \"__main__\":`")
    if "split" in options:  # its name before --sub-batches, kept for a release
        warnings.warn("fit()'s split is now sub_batches; split goes in a later release", DeprecationWarning,
                      stacklevel=2)
        options["sub_batches"] = options.pop("split")
    names = set(OPTIONS) - {"data", "data_file", "out", "resume", "overwrite", "model", "model_args"}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"fit() got unknown options {', '.join(unknown)}; it takes {', '.join(sorted(names))}")
    if not isinstance(model, str) and not isinstance(model, types.FunctionType):
        raise TypeError(f"fit()'s model is a function defined in a .py file, def build(*, input_shape, classes, "
                        f"...), or a model spec such as 'resnet20'; got {model!r}")
    for name, value in dict(data=data, out=out).items():
        if not isinstance(value, (str, os.PathLike)) or str(value) == "":
            raise TypeError(f"fit()'s {name} is a {'data set name' if name == 'data' else 'run folder path'}, "
                            f"got {value!r}")
    for name, value in dict(resume=resume, overwrite=overwrite).items():
        if not isinstance(value, bool):
            raise TypeError(f"fit()'s {name} is True or False, got {value!r}")
    if not isinstance(model_args or {}, dict):
        raise TypeError(f"model_args must be a dict of keyword arguments, got {type(model_args).__name__}")
    function = None if isinstance(model, str) else model
    # each value as the command line would read its text, so that it is checked alike; None: the default
    given = {name: OPTIONS[name].from_python(name, value) for name, value in options.items() if value is not None}
    invocation = Invocation(out=str(out), resume=resume, overwrite=overwrite,
                            **{k: given.pop(k) for k in ("rank_timeout",) if k in given})
    # data: a data set's name, or the path of a file that minibp.io.data.write made (--data-file)
    own_file = str(data).endswith(".h5") or Path(data).is_file()
    given.update({"data_file" if own_file else "data": str(data)},
                 model=modelspec.spec_of(function) if function else model, model_args=model_args or {})
    status, net = _session(invocation, given, dist.start(timeout=invocation.rank_timeout), function=function,
                           python=True)
    if status == 130:
        raise KeyboardInterrupt(f"stopped: a checkpoint is saved in {out}; continue with fit(..., resume=True)")
    return net


def _session(invocation, given, group, *, function=None, python=False):
    """(exit status, net) of a run (_run), on one process or on every rank of a group, whose ranks must
    agree on the options; rank 0 alone prints. function: the model's function (fit), else the spec's."""
    if group is not None:
        where = {k: str(Path(given[k]).resolve()) for k in ("data_dir", "data_file") if given.get(k) is not None}
        group.agree(dict(given, **where, **invocation.__dict__))
    with contextlib.ExitStack() as stack:
        if group is not None and group.rank:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        stack.enter_context(np.errstate(all="ignore"))  # a diverging step is found by finiteness checks, not warnings
        return _run(invocation, given, group, function=function, python=python)


def _failed(group, error, message, code):
    """Print the one-line error and return the exit status (several ranks: dist.Group.report says which
    rank prints, and may end the job)."""
    if group is None:
        print(f"error: {message}", file=sys.stderr)
        return code
    return group.report(message, error, code)


def _run(invocation, given, group=None, *, function=None, python=False):
    """(exit status, net) of the run the options name: its folder claimed (rank 0's), a Session trained in it."""
    if invocation.resume and invocation.overwrite:
        raise ValueError("--resume continues a run and --overwrite starts it again: give one")
    ranks = group.size if group else 1

    def fresh():  # a new run's configuration, checked whole before anything touches the disk (rank 0's)
        return RunConfig.new(given, ranks=ranks)
    config = None if invocation.resume else fresh() if group is None else group.on_rank_0(fresh)
    out = Path(invocation.out) if invocation.out else (config or (fresh() if group is None else
                                                                  group.on_rank_0(fresh))).folder()

    def claim():
        return RunDir.claim(out, fresh=not invocation.resume, overwrite=invocation.overwrite)

    # several ranks: the run folder is rank 0's; the others know its paths and never touch it
    run = claim() if group is None else group.on_rank_0(claim, share_result=False) or RunDir(out, None)
    try:
        session = Session(run, out, group, python=python)
        session.start(config, given, function=function)
        return session.train()
    finally:
        if group is None or group.rank == 0:
            run.release()


class Session:
    """This process's part in a run: start() sets it up, fresh or resumed from the checkpoint in `run` (a
    RunDir), and train() runs its iterations to the last one or a signal. The loop's state lives here (the
    iteration, the last checkpoint, the signals received), and its steps are methods: log, save, validate,
    say, stopping, and the messages of a diverged run or a failed write."""

    def __init__(self, run, out, group=None, *, python=False):
        """out: the run folder as given (the advice names it); group: the ranks under mpirun, None for one
        process; python: advice in fit's words."""
        self.run, self.out, self.group, self.python = run, out, group, python
        self.ranks = group.size if group else 1
        self.rank_0 = group is None or group.rank == 0  # the one that writes metrics and checkpoints
        self.command = ("python3 -m minibp.train" if self.ranks == 1 else
                        f"mpirun -n {self.ranks} python3 -m minibp.train")
        self.saved = None       # the checkpoint resumed from ...
        self.saved_config = None  # ... and its configuration as saved (RunConfig), before the resume's changes
        self.iteration = 0      # iterations done
        self.last_saved = None  # the iteration of the last checkpoint written (or resumed from); None: none yet
        self.signals = []       # SIGINT or SIGTERM received: the loop stops after its iteration
        self.best = None        # (accuracy, -loss) of the best validation so far (best.h5's) ...
        self.best_iteration = None  # ... and its iteration

    def start(self, config, given, *, function=None):
        """The run's data, net, step and metrics log, and the plan printed. config: a new run's (RunConfig);
        None: resume the run's from its checkpoint with the options `given`. function: the model's (fit), else
        the one the spec names."""
        changed = {}
        if config is None:  # several ranks: rank 0 reads the checkpoint and sends it to the others
            resume = functools.partial(self.resume, given)
            self.saved, self.saved_config, config, changed = (resume() if self.group is None else
                                                              self.group.on_rank_0(resume))
        self.config = config
        saved = self.saved

        self.data = run_data = splits.load(config)
        self.train_split, self.batches = run_data.train, run_data.batches
        if self.group is not None:  # every rank reads its own copy: on several machines, its host's
            self.group.agree_data(self.train_split, run_data.path)
        if saved is not None:
            if isinstance(self.train_split, imagenet.Folder):  # the sorted folder names are the labels
                saved.check_classes(self.train_split.class_names, self.train_split.root)
            self.batches.restore(saved.data_state)
        built = modelspec.describe(config.model, config.model_args)

        def build(input_shape, classes):
            return modelspec.build(config.model, model_args=config.model_args, imagenet=config.imagenet,
                                   input_shape=input_shape, classes=classes, function=function)
        self.net = net = build(run_data.input_shape, self.train_split.classes)
        if saved is not None:
            saved.check_data(net, build, run_data.path)  # before check_parameters, which would blame the net
            saved.check_parameters(net, built)
            if not isinstance(self.train_split, imagenet.Folder):  # the same shapes, but the same data?
                saved.check_data_checksum(self.train_split.sha256, run_data.path)
        sub_batch, clip = config.sub_batch, config.clip_norm
        compile_within_memory(net, batch=sub_batch, store=config.store, seed=config.seed, optimizer=config.optimizer,
                              grad_norm=clip is not None)
        opt = (AdamW(net, weight_decay=config.weight_decay, clip_norm=clip) if config.optimizer == "adamw"
               else SGD(net, momentum=config.momentum, weight_decay=config.weight_decay, clip_norm=clip))
        self.step = TrainStep(net, opt, split=config.sub_batches // self.ranks, graph=config.graph, group=self.group)
        if saved is not None:
            checkpoint.restore(net, saved)
            self.iteration = self.last_saved = saved.iteration
        self.best = self.best_so_far() if self.rank_0 else None
        if self.rank_0:
            self.run.clear_overwritten()  # every check has passed: only now does --overwrite remove the old run
        try:
            self.metrics = MetricsLog(self.run.metrics_path, keep_through=self.iteration if saved else None,
                                      check=self.run.check) if self.rank_0 else MetricsLog(os.devnull)
        except OSError as e:
            raise self.write_failed(self.run.metrics_path, e) from None
        if changed:
            self.log(kind="resume", iter=self.iteration, changed=changed)

        in_sub_batches = f" ({config.sub_batches} x {sub_batch})" if config.sub_batches > 1 else ""
        if self.ranks > 1:
            in_sub_batches = f" ({self.ranks} ranks x {config.sub_batches // self.ranks} x {sub_batch})"
        print(f"{built} ({len(net.units)} units, {net.num_parameters:,} parameters) on {config.data} "
              f"({len(self.train_split.labels):,} training images), {config.store}, batch "
              f"{config.batch}{in_sub_batches}, device {backend.device}"
              f"{', one CUDA graph a step' if self.step.graph else ''}")
        print(f"augment {config.augment}; validates on {run_data.validates_on}")
        print(f"plan of a step, allocated once:\n{net.arena.plan.summary()}")
        if saved:
            print(f"resumed from {self.run.checkpoint_path} at iteration {self.iteration}"
                  + "".join(f"; {k} {old} -> {new}" for k, (old, new) in changed.items()))

    def train(self):
        """(exit status, net): the run's iterations from where start() left it, then 0 (done) or 130 (stopped
        by a signal, a checkpoint saved)."""
        config, batches, step, group = self.config, self.batches, self.step, self.group
        self.clock = Clock(first=self.iteration, last=config.iters)
        # A checkpoint is saved before its validation, so a kill between the two leaves the validation undone:
        # the resumed run does it first. (A validation point of the run as saved or as resumed: --iters may have
        # moved the last one.)
        if self.saved is not None and self.iteration > 0 and any(self.due("val_every", c)
                                                                 for c in (config, self.saved_config)):
            if self.unvalidated() if group is None else group.on_rank_0(self.unvalidated):
                self.validate()

        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            # the interval a log line averages over: its start, its images (img/s), (loss, accuracy) a step
            interval_start, interval_images, sums = time.perf_counter(), 0, []
            while self.iteration < config.iters and not self.stopping():
                lr = config.schedule.rate(self.iteration)
                images, labels = batches.next()
                if group is not None:  # every rank draws the whole batch, as one process would, and keeps its rows
                    rows = group.share_of(config.batch)
                    images, labels = images[rows], labels[rows]
                try:
                    step.run(images, labels, lr=lr, iteration=self.iteration)
                except FloatingPointError as e:
                    raise self.diverged(f"at iteration {self.iteration + 1} ({e})") from None
                self.iteration += 1
                interval_images += config.batch
                sums.append(step.result())  # eager: host floats already; a graph's step: a host read a step
                if not np.isfinite(sums[-1][0]):
                    raise self.diverged(f"at iteration {self.iteration} (the loss is {sums[-1][0]})")
                if self.due("log_every"):
                    self.log_interval(sums, lr=lr, rate=interval_images / (time.perf_counter() - interval_start))
                    interval_start, interval_images, sums = time.perf_counter(), 0, []
                if self.due("checkpoint_every"):
                    self.save()  # before the validation, so a failing validation loses no training
                if self.due("val_every"):
                    began = time.perf_counter()
                    self.validate()
                    # the rate is of training: the validation's time leaves the interval, its images stay
                    interval_start += time.perf_counter() - began
            if self.stopping():
                if self.last_saved != self.iteration:
                    self.save()
                print(f"stopped at iteration {self.iteration}: checkpoint saved to {self.run.checkpoint_path}\n"
                      f"continue with: {self.resume_advice()}", flush=True)
                return 130, self.net
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)
            self.metrics.close()
            if isinstance(batches, imagenet.Batches):
                batches.close()  # its decoding processes
        if self.rank_0:
            self.run.check()  # the folder named below is still this run's
        best = "" if self.best is None else (f", best {self.run.best_path} (iteration {self.best_iteration}, "
                                             f"validation accuracy {self.best[0]:.4f})")
        print(f"done: {self.iteration} iterations in {self.clock.elapsed()}; checkpoint {self.run.checkpoint_path}"
              f"{best}, metrics {self.run.metrics_path}")
        return 0, self.net

    def resume(self, given):
        """(checkpoint, its configuration, the configuration resumed, changed options) of the run resumed with
        the options `given`."""
        path = self.run.checkpoint_path
        if not path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint at {path} (a run stopped before its first checkpoint "
                                    "starts again with --overwrite)")
        saved = checkpoint.load(path)
        before = RunConfig.from_checkpoint(saved)
        config, changed = before.resumed(given, ranks=self.ranks, iteration=saved.iteration, path=path)
        config.check_ranks(self.ranks)
        return saved, before, config, changed

    def due(self, every, config=None):
        """Whether this iteration is a log, checkpoint or validation point (every="log_every", ...) of
        config (default the run's): every `every` iterations, and the last."""
        config = config or self.config
        return self.iteration % getattr(config, every) == 0 or self.iteration == config.iters

    def say(self, what):
        """A console line: the iteration, what happened, the time."""
        width = len(str(self.config.iters))
        print(f"iter {self.iteration:{width}d}/{self.config.iters}  {what}  {self.clock.now(self.iteration)}",
              flush=True)

    def log(self, **record):
        """A metrics record (rank 0's file; the others write nowhere)."""
        try:
            self.metrics.write(**record)
        except OSError as e:
            raise self.write_failed(self.metrics.path, e) from None

    def log_interval(self, sums, *, lr, rate):
        """The log line and record of the iterations since the last: loss and accuracy averaged over their
        steps' `sums`, the rate in images a second."""
        loss, accuracy = (float(v) for v in np.mean(sums, axis=0))
        self.say(f"loss {loss:.4f}  acc {accuracy:.3f}  lr {lr:.3g}  {rate:.0f} img/s")
        norm = self.step.opt.last_grad_norm  # the last step's, before clipping (measured where --clip-norm is on)
        self.log(kind="train", iter=self.iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                 planned_bytes=self.net.arena.plan.total_bytes, averaged_over=len(sums),
                 **({} if norm is None else dict(grad_norm=norm)))

    def validate(self):
        """Loss and accuracy on the test split, printed and logged. A loss that is not finite (the running
        statistics of a net whose training steps are finite, e.g. on images of a pixel or two) is said and
        logged as such (loss and accuracy null), and training goes on: its steps' own checks stop a divergence."""
        try:
            val_loss, val_accuracy = evaluate(self.net, self.data.val, self.data.mean, group=self.group,
                                              workers=self.config.workers)
        except FloatingPointError as e:
            self.say(f"validation failed: {e}, from the running statistics; training goes on")
            self.log(kind="val", iter=self.iteration, loss=None, accuracy=None, error=str(e))
            return
        # the best: the highest accuracy, a tie broken by the lower loss (then the earlier model stays)
        if self.rank_0 and (self.best is None or (val_accuracy, -val_loss) > self.best):
            self.save(path=self.run.best_path, validation=dict(
                split=getattr(self.data.val, "part", "val"), iteration=self.iteration, loss=val_loss,
                accuracy=val_accuracy))
            self.best, self.best_iteration = (val_accuracy, -val_loss), self.iteration
        self.say(f"validation loss {val_loss:.4f}  acc {val_accuracy:.4f}")
        self.log(kind="val", iter=self.iteration, loss=val_loss, accuracy=val_accuracy)

    def best_so_far(self):
        """The validation accuracy of the run's best.h5 (None: none yet, or a fresh run). A best.h5 that
        cannot be read is replaced by the next validation, with a warning."""
        if self.saved is None or not self.run.best_path.exists():
            return None
        try:
            best = checkpoint.load(self.run.best_path)
        except ValueError as e:
            print(f"warning: {e}; the next validation writes a new best.h5", file=sys.stderr)
            return None
        accuracy, loss = ((best.validation or {}).get(k) for k in ("accuracy", "loss"))
        if best.iteration > self.iteration or not all(isinstance(v, (int, float)) for v in (accuracy, loss)):
            return None  # past the checkpoint resumed from: the resumed run scores that validation again
        self.best_iteration = best.iteration
        return accuracy, -loss

    def unvalidated(self):
        """Whether the metrics lack this iteration's validation (rank 0's file)."""
        return not any(r.get("kind") == "val" and r.get("iter") == self.iteration
                       for r in read_metrics(self.run.metrics_path))

    def save(self, *, path=None, validation=None):
        """A checkpoint of this iteration (rank 0 writes it; the others check the same state is finite): the
        run's checkpoint.h5, or (path, validation) best.h5 with the validation it scored."""
        path = path or self.run.checkpoint_path
        split = self.train_split
        facts = None if isinstance(split, imagenet.Folder) else dict(
            name=split.name, sha256=split.sha256, shape=list(split.images.shape[1:]), classes=split.classes)
        try:
            if self.rank_0:
                self.run.check()
                checkpoint.save(path, self.net, iteration=self.iteration, config=self.config.as_dict(),
                                data_state=self.batches.state(), class_names=getattr(split, "class_names", None),
                                data=facts, mean=self.data.mean, validation=validation)
            else:  # the same state as rank 0's: stop with it
                checkpoint.check_finite(self.net.state())
        except checkpoint.NotFinite as e:
            raise self.diverged(f"at iteration {self.iteration} ({e})") from None
        except OSError as e:
            raise self.write_failed(path, e) from None
        if validation is None:
            self.last_saved = self.iteration

    def resume_advice(self, **change):
        """How to continue this run, with `change`d options, in the caller's words."""
        if self.python:
            return "fit(..., " + "".join(f"{k}={v!r}, " for k, v in change.items()) + "resume=True)"
        return (f"{self.command} --out {self.out} --resume"
                + "".join(f" --{k.replace('_', '-')} {v}" for k, v in change.items()))

    def diverged(self, what):
        """Diverged, saying what and how to go on: from the last good checkpoint with a lower rate."""
        lower = self.config.schedule.divided(10)
        if self.last_saved is None:
            again = (f"fit(..., overwrite=True, lr_schedule={lower!r})" if self.python else
                     f"{self.command} ... --overwrite --lr-schedule {lower}")
            return Diverged(f"training diverged {what}; no checkpoint was saved. Start again with a lower learning "
                            f"rate: {again}")
        return Diverged(f"training diverged {what}; the last good checkpoint is {self.run.checkpoint_path} "
                        f"(iteration {self.last_saved}). Resume it with a lower learning rate: "
                        f"{self.resume_advice(lr_schedule=lower)}")

    def write_failed(self, path, error):
        """WriteFailed for a write to `path` that failed with OSError `error`, naming the checkpoint kept."""
        self.run.check()  # a folder deleted mid-write is that, not a full disk
        kept = (f"the previous checkpoint (iteration {self.last_saved}) is kept" if self.last_saved is not None
                else "no checkpoint had been saved yet")
        return WriteFailed(f"cannot write {path} ({os.strerror(error.errno) if error.errno else error}); {kept}")

    def on_signal(self, number, _frame):
        """SIGINT or SIGTERM: finish the iteration, then save and stop; a second one stops at once."""
        if self.signals:  # a second Ctrl-C: stop at once (the last checkpoint stays)
            raise KeyboardInterrupt
        self.signals.append(number)
        print(f"\n{signal.Signals(number).name}: finishing this iteration, then saving a checkpoint "
              "(Ctrl-C again to quit now)", flush=True)

    def stopping(self):
        """Whether a signal came; several ranks stop together, at the first iteration any of them was
        signalled by."""
        return bool(self.signals) if self.group is None else self.group.any(self.signals)


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
