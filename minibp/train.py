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
and accuracy averaged over them, and how many where they are fewer: a resume's first line) and at each
validation, each with the run's training time (a resume's earlier sessions included, as its checkpoint
records them) and the ETA at this session's pace (validations included, a first build of the kernels not);
the last line says how many iterations this process ran of the run's.

Exit status: 0 done, 1 the run failed (diverged, a write failed), 2 a bad option or input file,
130 interrupted by Ctrl-C, 143 stopped by SIGTERM (either way a checkpoint was saved where the run had begun).
"""
import contextlib
import os
import signal
import sys
import types
import warnings
from pathlib import Path

import numpy as np

from . import cli, dist
from .integrity import shown
from .kernels import KernelError
from .run import modelspec, startup
from .run.config import RunConfig, absolute_paths, with_defaults
from .run.folder import FolderLost, RunDir
from .run.options import OPTIONS, Invocation, RunOptions, option_fields, read_command_line
from .run.session import Diverged, Session, WriteFailed


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
        return _failed(group, e, f"{e.strerror or e}{f': {shown(e.filename)}' if e.filename else ''}", 1)
    except cli.INTERRUPTS as e:  # a second Ctrl-C, or one before the loop began: the last checkpoint stays as it was
        if group is None or group.rank == 0:
            said = "stopped by SIGTERM" if isinstance(e, cli.Terminated) else "interrupted"
            print(f"\n{said}: the last checkpoint written stays as it was", file=sys.stderr)
        return cli.status_of(e)


def fit(model=None, *, data, out, resume=False, overwrite=False, model_args=None, **options):
    """Train `model` on a prepared data set through the loop of python3 -m minibp.train, with its guarantees
    (atomic checksummed checkpoints, bit-identical resume, the run-folder lock, divergence stopped, memory
    checked before allocation, ranks under mpirun), and return the trained net (compiled for training).

        import minibp
        from vgg_example import build     # def build(*, input_shape, classes, width=16) -> minibp.net.Net
        net = minibp.fit(build, data="fashion-mnist", out="runs/fm-vgg", model_args=dict(width=16), iters=800,
                         lr_schedule="cosine:0.05:warmup=50", batch=128, bits="4", val_every=200)
        logits = net.predict(images)      # after: python3 -m minibp.evaluate runs/fm-vgg works as for any run
        minibp.fit(data="fashion-mnist", out="runs/fm-vgg", iters=1200, lr_schedule="0:0.001",
                   resume=True)           # 400 more at 0.001 (or: python3 -m minibp.train --out runs/fm-vgg --resume)

    model: a module-level function called as model(input_shape=..., classes=..., **model_args) that returns an
    uncompiled minibp.net.Net, defined in a file (a script's training code under `if __name__ == "__main__":`,
    since a resume and python3 -m minibp.evaluate import that file again); or a model spec as --model takes it
    ("resnet20", "FILE.py:FUNCTION", "package.module:FUNCTION"); None: the run's own on a resume, the
    default's otherwise. data: a data set python3 -m minibp.prepare prepared ("fashion-mnist", ...), the path
    of a data file of your own, or "imagenet". out: the run folder. resume / overwrite: as --resume /
    --overwrite. model_args: the function's keyword arguments (numbers, strings, booleans, None, and lists
    and dicts of them: the checkpoint records them). options: any other option of the command line under its
    field's name, with the same default (docs/training.md lists them); a value is read as the command line
    reads its text (bits=4 is "4"), None leaves the default.

    A bad option or input is a ValueError (or FileNotFoundError) with the command line's message, raised
    before anything is written; a diverged run raises Diverged, a failed write WriteFailed. Ctrl-C or SIGTERM
    finishes the iteration, saves a checkpoint and raises KeyboardInterrupt."""
    if modelspec.importing():  # this file is being imported by minibp to rebuild its net: never train it again
        raise ValueError(f"fit() was called while minibp imported {modelspec.importing()} to rebuild the net (a "
                         "resume, evaluate or load): put the script's training under `if __name__ == \"__main__\":`")
    invocation, given = _fit_options(model, data=data, out=out, resume=resume, overwrite=overwrite,
                                     model_args=model_args, options=options)
    function = model if isinstance(model, types.FunctionType) else None
    status, net = _session(invocation, given, dist.start(timeout=invocation.rank_timeout), function=function,
                           python=True)
    if status in (130, 143):
        raise KeyboardInterrupt(f"stopped: a checkpoint is saved in {out}; continue with fit(..., resume=True)")
    return net


def _fit_options(model, *, data, out, resume, overwrite, model_args, options):
    """(Invocation, given) of fit's arguments, each checked as the command line checks its text (a TypeError
    for a value of another kind)."""
    if "split" in options:  # its name before --sub-batches, kept for a release
        if "sub_batches" in options:
            raise TypeError("fit()'s split is sub_batches' old name: give sub_batches alone")
        warnings.warn("fit()'s split is now sub_batches; split goes in a later release", DeprecationWarning,
                      stacklevel=3)
        options["sub_batches"] = options.pop("split")
    names = set(OPTIONS) - {"data", "data_file", "out", "resume", "overwrite", "model", "model_args"}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"fit() got unknown options {', '.join(unknown)}; it takes {', '.join(sorted(names))}")
    if model is not None and not isinstance(model, (str, types.FunctionType)):
        raise TypeError(f"fit()'s model is a function defined in a .py file, def build(*, input_shape, classes, "
                        f"...), or a model spec such as 'resnet20'; got {model!r}")
    for name, value in dict(data=data, out=out).items():
        if not isinstance(value, (str, os.PathLike)) or str(value) == "":
            raise TypeError(f"fit()'s {name} is a {'data set name' if name == 'data' else 'run folder path'}, "
                            f"got {value!r}")
    resume, overwrite = (OPTIONS[name].from_python(name, value) for name, value in (("resume", resume),
                                                                                    ("overwrite", overwrite)))
    if not isinstance(model_args or {}, dict):
        raise TypeError(f"model_args must be a dict of keyword arguments, got {type(model_args).__name__}")
    # each value as the command line would read its text, so that it is checked alike; None: the default
    given = {name: OPTIONS[name].from_python(name, value) for name, value in options.items() if value is not None}
    invocation = Invocation(out=str(out), resume=resume, overwrite=overwrite,
                            **{k: given.pop(k) for k in ("rank_timeout",) if k in given})
    # data: a data set's name, or the path of a file that minibp.io.data.write made (--data-file)
    own_file = str(data).endswith(".h5") or Path(data).is_file()
    given["data_file" if own_file else "data"] = str(data)
    if model is not None:
        given["model"] = model if isinstance(model, str) else modelspec.spec_of(model)
    if model_args is not None:
        given["model_args"] = model_args
    return invocation, given


def _session(invocation, given, group, *, function=None, python=False):
    """(exit status, net) of a run (_run), on one process or on every rank of a group, whose ranks must
    agree on the options; rank 0 alone prints. function: the model's function (fit), else the spec's."""
    if group is not None:
        group.agree(as_agreed(invocation, given))
    with contextlib.ExitStack() as stack:
        if group is not None and group.rank:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
        stack.enter_context(np.errstate(all="ignore"))  # a diverging step is found by finiteness checks, not warnings
        return _run(invocation, given, group, function=function, python=python)


def as_agreed(invocation, given):
    """What ranks must agree on, each option as this rank resolves it: a fresh run's at its default where not given
    (a rank without --rounding runs nearest, and is named so), a resume's as "(the run's)"; paths absolute."""
    given = absolute_paths(given)
    resolved = ({name: given.get(name, "(the run's)") for name, _ in option_fields(RunOptions)} if invocation.resume
                else with_defaults(given))
    return dict(resolved, **invocation.__dict__)


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
        return RunConfig.new(startup.fine_tuned(given), ranks=ranks)
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
        status, net = session.train()
        # a signal stopped the loop, which saved a checkpoint: SIGTERM's status is its own, as for every command
        return (128 + signal.SIGTERM if status == 130 and signal.SIGTERM in session.signals else status), net
    finally:
        if group is None or group.rank == 0:
            run.release()


if __name__ == "__main__":
    sys.exit(cli.run(main))

