"""A training run's loop: Session, this process's part in a run, from its first iteration to its last or a
signal, with the steps the loop takes (log, save, validate) and the messages of a run that diverged or whose
write failed. Its start-up is startup.py's; the command line and minibp.fit, which make a Session, are
train.py's.

    session = Session(run, out, group)     # run: the claimed run folder (folder.RunDir)
    session.start(config, given)           # a fresh run's RunConfig, or None: resume the run's checkpoint
    status, net = session.train()          # 0 done, 130 stopped by a signal (a checkpoint saved)
"""
import functools
import os
import signal
import time
from pathlib import Path

import numpy as np

from .. import build
from ..io import data, imagenet
from . import checkpoint, startup
from .evaluation import evaluate
from .folder import MetricsLog, read_metrics
from .options import option


class Diverged(Exception):
    """The loss or the weights stopped being finite."""
    on_every_rank = True  # ranks training together meet it at the same step, from the same numbers (dist.report)


class WriteFailed(Exception):
    """A checkpoint or metrics write failed (a full disk): the checkpoint before it stays."""


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
        self.saved_best = None  # (iteration, validation) of the resumed run's best.h5, or None
        self.iteration = 0      # iterations done
        self.last_saved = None  # the iteration of the last checkpoint written (or resumed from); None: none yet
        self.signals = []       # SIGINT or SIGTERM received: the loop stops after its iteration
        self.best = None        # (accuracy, -loss) of the best validation so far (best.h5's) ...
        self.best_iteration = None  # ... and its iteration
        self.stale = 0          # validations since the best that did not beat it (--patience counts them)
        self.started_from = None  # {checkpoint, iteration, taken, fresh}: --init-from's weights, as recorded
        self.closing = False    # the loop is over: train() is closing the metrics and the data reader
        self.memory = None      # a --memory run's memory.Memory: its mix, sub-batches and record
        self.model_file = None  # {path, sha256} of your own net's file as this process built the net with it
        self.unsaved_change = False  # a resume changed an option that no checkpoint has recorded yet
        self.resize = None      # how the data file's images were resized (prepare folder's --resize), or None


    def start(self, config, given, *, function=None):
        """The run's data, net, step and metrics log, and the plan printed. config: a new run's (RunConfig);
        None: resume the run's from its checkpoint with the options `given`. function: the model's (fit), else
        the one the spec names."""
        changed = {}
        if config is None:  # several ranks: rank 0 reads the checkpoint and sends it to the others
            resume = functools.partial(startup.resumed, self.run.path, given, ranks=self.ranks)
            self.saved, self.saved_best, self.saved_config, config, changed = (
                resume() if self.group is None else self.group.on_rank_0(resume))
        self.config, saved = config, self.saved
        self.data = startup.load_data(config, saved, self.group)
        self.train_split, self.batches = self.data.train, self.data.batches
        # how the data file's images were resized (prepare folder --resize): checkpoints say it, so that predict resizes
        # image files alike wherever the data file has gone
        self.resize = None if config.imagenet else data.resize_mode(config.data_path(), self.train_split.sha256)
        self.net, self.model_file = startup.build_net(config, self.data, saved, function=function)
        self.step, self.memory = startup.make_step(self.net, config, ranks=self.ranks, group=self.group,
                                                   run_data=self.data, saved=saved)
        if self.memory is not None:  # the sub-batches its budget solved for
            self.config = config = self.memory.config
        why = None
        if saved is not None:
            checkpoint.restore(self.net, saved)
            self.iteration, self.last_saved, self.started_from = saved.iteration, saved.iteration, saved.started_from
        elif config.init_from is not None:
            self.started_from, why = startup.take_weights(self.net, config.init_from, group=self.group)
        self.best, self.best_iteration, self.stale = (self.standing() if self.group is None else
                                                      self.group.on_rank_0(self.standing))
        if self.rank_0:
            self.run.clear_overwritten()  # every check has passed: only now does --overwrite remove the old run
        try:
            self.metrics = MetricsLog(self.run.metrics_path, keep_through=self.iteration if saved else None,
                                      check=self.run.check) if self.rank_0 else MetricsLog(os.devnull)
        except OSError as e:
            raise self.write_failed(self.run.metrics_path, e) from None
        self.unsaved_change = bool(changed)  # the checkpoint must come to record what the metrics say changed
        if changed:
            self.log(kind="resume", iter=self.iteration, changed=changed)
        print(startup.header(config, self.net, self.step, self.data, ranks=self.ranks, started_from=self.started_from,
                             why=why, memory=self.memory))
        if saved:
            newer = ("" if Path(saved.path).name != self.run.best_path.name else " (newer than its checkpoint.h5)"
                     if os.path.lexists(self.run.checkpoint_path) else " (it has no checkpoint.h5)")
            print(f"resumed from {saved.path} at iteration {self.iteration}{newer}"
                  + "".join(f"; {k} {old} -> {new}" for k, (old, new) in changed.items()))

    def train(self):
        """(exit status, net): the run's iterations from where start() left it, then 0 (done) or 130 (stopped
        by a signal, a checkpoint saved)."""
        config, group = self.config, self.group
        earlier = (self.saved.clock or {}).get("seconds") if self.saved is not None else None
        self.clock = Clock(first=self.iteration, last=config.iters, earlier=earlier)
        # A checkpoint is saved before its validation, so a kill between the two leaves the validation undone:
        # the resumed run does it first. (A validation point of the run as saved or as resumed: --iters may have
        # moved the last one.)
        if self.saved is not None and self.iteration > 0 and any(self.due("val_every", c)
                                                                 for c in (config, self.saved_config)):
            if self.unvalidated() if group is None else group.on_rank_0(self.unvalidated):
                self.validate()
        previous = {s: signal.signal(s, self.on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.loop()
            if ((self.stopping() or self.patience_spent()) and self.last_saved != self.iteration
                    or self.unsaved_change):  # (a resume that changed --patience and stopped at once)
                self.save()
            if self.stopping():
                print(f"stopped at iteration {self.iteration}: checkpoint saved to {self.run.checkpoint_path}\n"
                      f"continue with: {self.resume_advice()}", flush=True)
                return 130, self.net
        finally:
            self.closing = True  # a signal from here on is said as such (on_signal), never the default's silent end
            self.metrics.close()
            if isinstance(self.batches, imagenet.Batches):
                self.batches.close()  # its decoding processes
            for number, handler in previous.items():
                signal.signal(number, handler)
        if self.rank_0:
            self.run.check()  # the folder named below is still this run's
        if self.patience_spent() and self.iteration < config.iters:
            print(f"stopped early at iteration {self.iteration}: {self.stale} validation{'s' * (self.stale > 1)} in a "
                  f"row without a better one than iteration {self.best_iteration}'s (--patience {config.patience}); "
                  f"to train on: {self.resume_advice(patience=self.stale + config.patience)}")
        best = "" if self.best is None else (f", best {self.run.best_path} (iteration {self.best_iteration}, "
                                             f"validation accuracy {self.best[0]:.4f})")
        print(f"done: {self.iteration} iterations{self.clock.done(self.iteration)}; checkpoint {self.run.checkpoint_path}"
              f"{best}, metrics {self.run.metrics_path}")
        if self.memory is not None:
            print(self.memory.peak_line())
        return 0, self.net

    def loop(self):
        """The iterations, each a step, then its log line, checkpoint and validation where they are due, until
        the last iteration or a signal."""
        config, batches, group = self.config, self.batches, self.group
        # the interval a log line averages over: its start, its images (img/s), (loss, accuracy) a step
        interval_start, interval_images, sums = time.perf_counter(), 0, []
        while self.iteration < config.iters and not self.stopping() and not self.patience_spent():
            lr = config.schedule.rate(self.iteration)
            images, labels = batches.next()
            if group is not None:  # every rank draws the whole batch, as one process would, and keeps its rows
                rows = group.share_of(config.batch)
                images, labels = images[rows], labels[rows]
            sums.append(self.one_step(images, labels, lr=lr))
            interval_images += config.batch
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

    def one_step(self, images, labels, *, lr):
        """(loss, accuracy) of one training step, which counts the iteration; Diverged where it is not finite."""
        try:
            self.step.run(images, labels, lr=lr, iteration=self.iteration)
        except FloatingPointError as e:
            raise self.diverged(f"at iteration {self.iteration + 1} ({e})") from None
        self.iteration += 1
        result = self.step.result()  # eager: host floats already; a graph's step: a host read a step
        if not np.isfinite(result[0]):
            raise self.diverged(f"at iteration {self.iteration} (the loss is {result[0]})")
        return result

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
        # (a resume's first line averages the iterations since it began, fewer than --log-every: said)
        over = f" (over {len(sums)})" if len(sums) != self.config.log_every else ""
        self.say(f"loss {loss:.4f}  acc {accuracy:.3f}{over}  lr {lr:.3g}  {rate:.0f} img/s")
        norm = self.step.opt.last_grad_norm  # the last step's, before clipping (measured where --clip-norm is on)
        self.log(kind="train", iter=self.iteration, loss=loss, accuracy=accuracy, lr=lr, images_per_s=rate,
                 planned_bytes=self.net.arena.plan.total_bytes, averaged_over=len(sums),
                 **({} if norm is None else dict(grad_norm=norm)))

    def validate(self):
        """Loss and accuracy on the validation split (the test split where the data hold none), printed and logged. A loss that is not finite (the running
        statistics of a net whose training steps are finite, e.g. on images of a pixel or two) is said and
        logged as such (loss and accuracy null), and training goes on: its steps' own checks stop a divergence."""
        try:
            val_loss, val_accuracy = evaluate(self.net, self.data.val, self.data.mean, group=self.group,
                                              workers=self.config.workers)
        except FloatingPointError as e:
            self.say(f"validation failed: {e}, from the running statistics; training goes on")
            self.log(kind="val", iter=self.iteration, loss=None, accuracy=None, error=str(e))
            self.stale += 1
            return
        # the best: the highest accuracy, a tie broken by the lower loss (then the earlier model stays); every
        # rank has the same figures, and keeps the same count
        if self.best is None or (val_accuracy, -val_loss) > self.best:
            if self.rank_0:
                self.save(path=self.run.best_path, validation=dict(
                    split=getattr(self.data.val, "part", "val"), iteration=self.iteration, loss=val_loss,
                    accuracy=val_accuracy))
            self.best, self.best_iteration, self.stale = (val_accuracy, -val_loss), self.iteration, 0
        else:
            self.stale += 1
        self.say(f"validation loss {val_loss:.4f}  acc {val_accuracy:.4f}")
        self.log(kind="val", iter=self.iteration, loss=val_loss, accuracy=val_accuracy)

    def patience_spent(self):
        """Whether --patience validations in a row have not beaten the run's best: the run stops early."""
        return self.config.patience is not None and self.stale >= self.config.patience

    def standing(self):
        """(best, its iteration, validations since it) of the run so far (rank 0's files): best.h5's score and
        the validations the metrics hold after it, up to this iteration (a failed one counts as not better)."""
        if self.saved is None or self.saved_best is None:
            return None, None, 0
        iteration, validation = self.saved_best
        stale = sum(1 for r in self.records() if r.get("kind") == "val"
                    and isinstance(r.get("iter"), int) and iteration < r["iter"] <= self.iteration)
        return (validation["accuracy"], -validation["loss"]), iteration, stale

    def records(self):
        """The run's metrics records so far (none where it has no metrics file: killed before its first)."""
        return read_metrics(self.run.metrics_path) if os.path.lexists(self.run.metrics_path) else []

    def unvalidated(self):
        """Whether the metrics lack this iteration's validation (rank 0's file)."""
        return not any(r.get("kind") == "val" and r.get("iter") == self.iteration for r in self.records())

    def save(self, *, path=None, validation=None):
        """A checkpoint of this iteration (rank 0 writes it; the others check the same state is finite): the
        run's checkpoint.h5, or (path, validation) best.h5 with the validation it scored."""
        path = path or self.run.checkpoint_path
        split = self.train_split
        facts = None if isinstance(split, imagenet.Folder) else dict(
            name=split.name, sha256=split.sha256, shape=list(split.images.shape[1:]), classes=split.classes,
            **({} if self.resize is None else dict(resize=self.resize)))
        try:
            if self.rank_0:
                self.run.check()
                checkpoint.save(path, self.net, iteration=self.iteration, config=self.config.as_dict(),
                                data_state=self.batches.state(), class_names=getattr(split, "class_names", None),
                                data=facts, mean=self.data.mean, validation=validation,
                                started_from=self.started_from, memory=self.memory and self.memory.record,
                                model_file=self.model_file, clock=dict(seconds=round(self.clock.run_seconds(), 3)))
            else:  # the same state as rank 0's: stop with it
                checkpoint.check_finite(self.net.state())
        except checkpoint.NotFinite as e:
            raise self.diverged(f"at iteration {self.iteration} ({e})") from None
        except OSError as e:
            raise self.write_failed(path, e) from None
        if validation is None:
            self.last_saved, self.unsaved_change = self.iteration, False

    def resume_advice(self, **change):
        """How to continue this run, with `change`d options, in the caller's words."""
        if self.python:
            return "fit(..., " + "".join(f"{k}={v!r}, " for k, v in change.items()) + "resume=True)"
        return (f"{self.command} --out {self.out} --resume"
                + "".join(f" {option(k)} {v}" for k, v in change.items()))

    def diverged(self, what):
        """Diverged, saying what and how to go on: from the last good state on disk (the last checkpoint, or
        best.h5 where it is newer: a resume takes the newer) with a lower rate; never a command that loses
        best.h5."""
        lower = self.config.schedule.divided(10)
        if self.best_iteration is not None and (self.last_saved is None or self.best_iteration > self.last_saved):
            return Diverged(f"training diverged {what}; the last good state is {self.run.best_path} (iteration "
                            f"{self.best_iteration}, validation accuracy {self.best[0]:.4f}), which a resume "
                            f"continues. Resume it with a lower learning rate: {self.resume_advice(lr_schedule=lower)}")
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
        if self.closing:  # the loop is over, its checkpoint written: the run ends as it was about to
            print(f"\n{signal.Signals(number).name} while the run shut down (its data reader's processes): nothing "
                  "is lost, the run ends as it was about to", flush=True)
            return
        print(f"\n{signal.Signals(number).name}: finishing this iteration, then saving a checkpoint "
              "(Ctrl-C again to quit now)", flush=True)

    def stopping(self):
        """Whether a signal came; several ranks stop together, at the first iteration any of them was
        signalled by."""
        return bool(self.signals) if self.group is None else self.group.any(self.signals)


class Clock:
    """The run's training time (the earlier sessions' too, as its checkpoint records them) and the ETA of its
    last iteration at the pace of this session so far: validations and checkpoints included, as the rest of the
    run will have them, and a first build of the kernels left out (build.py counts it; it happens once)."""

    def __init__(self, *, first, last, earlier=None):
        """first: the iteration this session starts at; last: the run's; earlier: the seconds of training the
        checkpoint resumed from records (None: a fresh run, or a checkpoint from before the clock was kept)."""
        self.start, self.first, self.last, self.earlier = time.monotonic(), first, last, earlier
        self.compiling = build.compiling_seconds()

    def session_seconds(self):
        return time.monotonic() - self.start

    def run_seconds(self):
        """The run's training time: the earlier sessions' (where recorded) and this one's."""
        return (self.earlier or 0.0) + self.session_seconds()

    def now(self, iteration):
        """'elapsed 1:23  eta 4:56' at `iteration` (eta ? before this session's first iteration ends)."""
        done = iteration - self.first
        pace = self.session_seconds() - (build.compiling_seconds() - self.compiling)  # (a first build: once)
        eta = clock_time(max(pace, 0.0) / done * (self.last - iteration)) if done > 0 else "?"
        return f"elapsed {clock_time(self.run_seconds())}  eta {eta}"

    def done(self, iteration):
        """The end line's account: ' in 3:10' for a run of one session; ' (322 earlier, 378 now) in 1:39 of 3:10'
        for a resumed one (' in 1:39' alone where its checkpoint kept no clock)."""
        if self.first == 0:
            return f" in {clock_time(self.run_seconds())}"
        whole = "" if self.earlier is None else f" of {clock_time(self.run_seconds())}"
        return f" ({self.first} earlier, {iteration - self.first} now) in {clock_time(self.session_seconds())}{whole}"


def clock_time(seconds):
    """3725.2 -> '1:02:05', 83 -> '1:23'."""
    minutes, seconds = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"


