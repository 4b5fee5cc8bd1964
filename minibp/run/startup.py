"""A training run's start-up, before its first iteration: what session.py's Session.start puts together, each
piece a function of the configuration, so that the loop (session.py) holds only the loop.

    saved, before, config, changed = resumed(path, given, ranks=1)   # a resume: the checkpoint and its options
    config = RunConfig.new(fine_tuned(given))      # a fresh run: --init-from's model where --model is not given
    run_data = load_data(config, saved, group)     # the data, its order restored on a resume
    net = build_net(config, run_data, saved)       # built as the spec says; on a resume, checked against it
    step = make_step(net, config, ranks=1)         # compiled within memory, with its optimizer
    started_from, why = take_weights(net, config.init_from)   # --init-from: the arrays that fit, taken
    print(header(config, net, step, run_data, ranks=1))

Every check here runs before the first write to the run folder, so a refused start leaves the disk as it was.
"""
import sys
from pathlib import Path

from .. import backend
from ..io import data, imagenet
from ..optim import SGD, AdamW
from ..step import TrainStep
from . import checkpoint, modelspec, splits
from .config import RunConfig
from .sizing import compile_within_memory
from .trained import checkpoint_path


def resumed(path, given, *, ranks):
    """(checkpoint, its configuration, the configuration resumed, changed options) of the run whose checkpoint
    is at path, resumed with the options `given`."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path} (a run stopped before its first checkpoint "
                                "starts again with --overwrite)")
    saved = checkpoint.load(path)
    before = RunConfig.from_checkpoint(saved)
    config, changed = before.resumed(given, ranks=ranks, iteration=saved.iteration, path=path)
    config.check_ranks(ranks)
    return saved, before, config, changed


def fine_tuned(given):
    """The options `given` of a fresh run, with --init-from's model and its arguments where --model is not
    given (a run fine-tuned from another is most often its net on other data)."""
    if given.get("init_from") is None:
        return given
    path = _source(given["init_from"])  # (checked here, before anything else is)
    if "model" in given:
        return given
    source = RunConfig.from_checkpoint(checkpoint.load(path))
    return dict(given, model=source.model, model_args=given.get("model_args", source.model_args))


def take_weights(net, run, *, group=None):
    """Start a compiled net from the weights of the run at `run` (a folder: its best.h5 where it has one, else
    its checkpoint.h5; or a checkpoint file): every parameter and running statistic whose name and shape are
    the net's is taken, the rest keeps its fresh initialisation, the optimizer's state starts at zero.
    (started_from, why): what a checkpoint records of it ({checkpoint, iteration, taken, fresh}), and why each
    fresh parameter is ({name: reason}, for the header); a ValueError where no parameter fits. group: rank 0
    reads the file and sends it to the others."""
    path = _source(run)
    source = checkpoint.load(path) if group is None else group.on_rank_0(lambda: checkpoint.load(path))
    own = net.state()
    taken = {name: array for name, array in source.state.items() if name.split("/")[0] in ("params", "running")
             and name in own and own[name].shape == array.shape}
    params = [name for name in own if name.startswith("params/")]
    if not any(name in taken for name in params):
        raise ValueError(f"--init-from {run}: {path} holds no parameter of this net's names and shapes (it has "
                         f"{len(source.state)} arrays, the net {len(params)} parameters)")
    net.load_state(dict(own, **taken))
    fresh = [name.removeprefix("params/") for name in params if name not in taken]
    return (dict(checkpoint=str(Path(path).resolve()), iteration=source.iteration, taken=len(taken), fresh=fresh),
            {name: _why_fresh(name, own, source.state) for name in fresh})


def _source(run):
    """The checkpoint file of --init-from's run (its best.h5 where it has one); FileNotFoundError naming it."""
    try:
        return checkpoint_path(run)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--init-from: {e}") from None


def _why_fresh(name, own, theirs):
    """Why a parameter started fresh: '(64, 5), the run's (64, 4)' or 'not in the run'."""
    key = f"params/{name}"
    return f"{own[key].shape}, the run's {theirs[key].shape}" if key in theirs else "not in the run"


def load_data(config, saved, group):
    """The run's data (splits.RunData); on a resume (saved: its checkpoint) the data order restored, and
    ImageNet's classes checked against the run's. group: several ranks check that they read the same data."""
    run_data = splits.load(config)
    if config.val_split is not None and data.has_split(run_data.path, "val"):  # never in silence
        print(f"warning: --val-split {config.val_split:g} validates on part of the training split, not on "
              f"{run_data.path}'s own val split", file=sys.stderr)
    if group is not None:  # every rank reads its own copy: on several machines, its host's
        group.agree_data(run_data.train, run_data.path)
    if saved is not None:
        if isinstance(run_data.train, imagenet.Folder):  # the sorted folder names are the labels
            saved.check_classes(run_data.train.class_names, run_data.train.root)
        run_data.batches.restore(saved.data_state)
    return run_data


def build_net(config, run_data, saved, *, function=None):
    """The run's net, uncompiled, for its data; on a resume checked against the checkpoint (saved): the data's
    shape and classes, the parameter table, the data file's checksum. function: the model's (fit), else the
    one the spec names."""
    def build(input_shape, classes):
        return modelspec.build(config.model, model_args=config.model_args, imagenet=config.imagenet,
                               input_shape=input_shape, classes=classes, function=function)
    net = build(run_data.input_shape, run_data.train.classes)
    if saved is not None:
        saved.check_data(net, build, run_data.path)  # before check_parameters, which would blame the net
        saved.check_parameters(net, modelspec.describe(config.model, config.model_args))
        if not isinstance(run_data.train, imagenet.Folder):  # the same shapes, but the same data?
            saved.check_data_checksum(run_data.train.sha256, run_data.path)
    return net


def make_step(net, config, *, ranks, group=None):
    """The run's TrainStep: net compiled for a sub-batch (refused before allocation where it does not fit the
    memory), its optimizer, its share of the sub-batches (ranks)."""
    clip = config.clip_norm
    compile_within_memory(net, batch=config.sub_batch, store=config.store, seed=config.seed,
                          optimizer=config.optimizer, grad_norm=clip is not None)
    opt = (AdamW(net, weight_decay=config.weight_decay, clip_norm=clip) if config.optimizer == "adamw"
           else SGD(net, momentum=config.momentum, weight_decay=config.weight_decay, clip_norm=clip))
    return TrainStep(net, opt, sub_batches=config.sub_batches // ranks, graph=config.graph, group=group)


def started(started_from, why):
    """The header's line of a run begun from another's weights: where from, and what started fresh."""
    fresh = "; ".join(f"{name} {why[name]}" for name in started_from["fresh"][:6])
    more = len(started_from["fresh"]) - 6
    return (f"started from {started_from['checkpoint']} (iteration {started_from['iteration']}): took "
            f"{started_from['taken']} arrays (parameters and running statistics)"
            + (f"; fresh: {fresh}" + (f"; and {more} more" if more > 0 else "") if fresh else "; nothing fresh"))


def header(config, net, step, run_data, *, ranks, started_from=None, why=None):
    """The lines a run starts with: the net, the data, the store, the batch and the device; the optimizer and
    schedule; where a fine-tuned run's weights came from (started_from, why: take_weights'); the augmentation
    and the validation split; the plan of a step."""
    sub_batch = config.sub_batch
    in_sub_batches = f" ({config.sub_batches} x {sub_batch})" if config.sub_batches > 1 else ""
    if ranks > 1:
        in_sub_batches = f" ({ranks} ranks x {config.sub_batches // ranks} x {sub_batch})"
    lines = [f"{modelspec.describe(config.model, config.model_args)} ({len(net.units)} units, "
             f"{net.num_parameters:,} parameters) on {config.data} ({len(run_data.train.labels):,} training images), "
             f"{config.store}, batch {config.batch}{in_sub_batches}, device {backend.device}"
             f"{', one CUDA graph a step' if step.graph else ', the step replayed' if step.replay else ''}",
             training(config)]
    if why is not None:
        lines.append(started(started_from, why))
    lines += [f"augment {config.augment}; validates on {run_data.validates_on}",
              f"plan of a step, allocated once:\n{net.arena.plan.summary()}"]
    return "\n".join(lines)


def training(config):
    """The header's line of how the run trains: 'optimizer sgd (momentum 0.9, weight decay 0.0002); schedule
    cosine:0.1:warmup=100 over 2000 iterations; gradient not clipped'."""
    decay = f"weight decay {config.weight_decay:g}"
    optimizer = (f"adamw (betas 0.9, 0.999, {decay})" if config.optimizer == "adamw" else
                 f"sgd (momentum {config.momentum:g}, {decay})")
    clip = "not clipped" if config.clip_norm is None else f"clipped to norm {config.clip_norm:g}"
    return f"optimizer {optimizer}; schedule {config.lr_schedule} over {config.iters} iterations; gradient {clip}"
