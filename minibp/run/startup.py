"""A training run's start-up, before its first iteration: what session.py's Session.start puts together, each
piece a function of the configuration, so that the loop (session.py) holds only the loop.

    saved, best, before, config, changed = resumed(folder, given, ranks=1)   # a resume: its state and options
    config = RunConfig.new(fine_tuned(given))      # a fresh run: --init-from's model where --model is not given
    run_data = load_data(config, saved, group)     # the data, its order restored on a resume
    net, model_file = build_net(config, run_data, saved)   # built as the spec says; on a resume, checked
    step, memory = make_step(net, config, ranks=1) # compiled within memory (--memory: solved for it), its optimizer
    started_from, why = take_weights(net, config.init_from)   # --init-from: the arrays that fit, taken
    print(header(config, net, step, run_data, ranks=1))

Every check here runs before the first write to the run folder, so a refused start leaves the disk as it was.
"""
import os
import sys
from pathlib import Path

from .. import backend
from ..integrity import shown
from ..net import Net
from ..io import data, imagenet
from ..optim import SGD, AdamW
from ..step import TrainStep
from . import checkpoint, memory, modelspec, splits, tuning
from .config import RunConfig
from .folder import BEST, CHECKPOINT
from .options import DEFINING, option, option_fields
from .sizing import compile_within_memory


def resumed(folder, given, *, ranks):
    """(checkpoint, best, its configuration, the configuration resumed, changed options) of the run in `folder`
    resumed with the options `given`: from its checkpoint.h5, or from its best.h5 where that is newer (a
    validation after the last checkpoint) or the run has no checkpoint.h5 (it validated before its first one),
    so that no state on disk is lost. best: (iteration, validation) of best.h5, or None; it is checked as the
    checkpoint is, and refused where it is not this run's."""
    last_path = Path(folder) / CHECKPOINT
    last = checkpoint.load(last_path) if os.path.lexists(last_path) else None
    best = _best(Path(folder) / BEST, last)
    if last is None and best is None:
        raise FileNotFoundError(f"--resume: no checkpoint at {last_path} (a run stopped before its first checkpoint "
                                "starts again with --overwrite)")
    saved = best if last is None or (best is not None and best.iteration > last.iteration) else last
    before = RunConfig.from_checkpoint(saved)
    config, changed = before.resumed(given, ranks=ranks, iteration=saved.iteration, path=saved.path)
    config.check_ranks(ranks)
    return saved, None if best is None else (best.iteration, best.validation), before, config, changed


def _best(path, last):
    """The run's best.h5 at path (None where there is none), checked as a checkpoint is, holding the score of
    its validation, and, beside the run's checkpoint.h5 (last), of the same run: a ValueError otherwise, which
    says how to resume without it and keep it."""
    if not os.path.lexists(path):
        return None
    try:
        best = checkpoint.load(path)
        score = [(best.validation or {}).get(k) for k in ("accuracy", "loss")]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in score):
            raise ValueError(f"{path} holds no validation's score: it is not a best.h5 minibp wrote")
        if last is not None:
            _check_same_run(best, last)
    except ValueError as e:
        raise ValueError(f"{e}; to resume without it, move it out of {path.parent} (it keeps its weights wherever "
                         "it goes)") from None
    return best


def _check_same_run(best, last):
    """A ValueError unless best.h5 (best) is of the run whose checkpoint.h5 is last: its defining options, its
    data and its class names. (Their arrays are each checked against the net the run builds: one that does not
    fit is named by itself, not blamed on the other.)"""
    theirs, ours = RunConfig.from_checkpoint(best), RunConfig.from_checkpoint(last)
    differ = [name for name, opt in option_fields(RunConfig) if opt.kind == DEFINING
              and getattr(theirs, name) != getattr(ours, name)]
    if differ:
        raise ValueError(f"{best.path} is not this run's: its {option(differ[0])} is {getattr(theirs, differ[0])}, "
                         f"{last.path}'s {getattr(ours, differ[0])}")
    facts = [((c.data or {}).get("sha256"), c.class_names) for c in (best, last)]
    if facts[0] != facts[1]:
        raise ValueError(f"{best.path} is not this run's: it holds a net trained on other data than {last.path}")


def fine_tuned(given):
    """The options `given` of a fresh run, with --init-from's model and its arguments where --model is not
    given (a run fine-tuned from another is most often its net on other data): then the net is built from the
    structure the run's checkpoint keeps (build_net), and its model file is neither imported nor looked for."""
    if given.get("init_from") is None:
        return given
    path = _source(given["init_from"])  # (checked here, before anything else is)
    if "model" in given:
        return given
    saved = checkpoint.load(path)
    source = RunConfig.from_checkpoint(saved, loading=True)
    return dict(given, model=source.model, model_args=given.get("model_args", source.model_args),
                find_model=saved.structure is None)


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
        return checkpoint.checkpoint_path(run)
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
    """(the run's net, uncompiled, for its data; {path, sha256} of the model file it was built with, or None where
    none was: a ResNet's name, a module, a net built from a checkpoint's structure). On a resume the net is checked
    against the checkpoint (saved): the data's shape and classes, the parameter table, the data file's checksum,
    and a model file that changed since is said. function: the model's (fit), else the one the spec names."""
    structure = _structure(config, saved, function)

    def build(input_shape, classes):
        if structure is not None:
            return Net.from_structure(structure, input_shape=input_shape, classes=classes)
        return modelspec.build(config.model, model_args=config.model_args, imagenet=config.imagenet,
                               input_shape=input_shape, classes=classes, function=function)
    net = build(run_data.input_shape, run_data.train.classes)
    if saved is not None:
        saved.check_data(net, build, run_data.path)  # before check_parameters, which would blame the net
        saved.check_parameters(net, modelspec.describe(config.model, config.model_args))
        if not isinstance(run_data.train, imagenet.Folder):  # the same shapes, but the same data?
            saved.check_data_checksum(run_data.train.sha256, run_data.path)
    return net, None if structure is not None else _model_file(config, saved)


def _model_file(config, saved):
    """{path, sha256} of the run's model file as it is now, or None; on a resume, a file that changed since the
    checkpoint's is said on stderr (the net was built with it as it is now, and its parameters checked)."""
    now = modelspec.file_record(config.model)
    before = None if saved is None else saved.model_file
    if now is not None and isinstance(before, dict) and before.get("sha256") not in (None, now["sha256"]):
        print(f"note: {now['path']} changed since {saved.path} was written (SHA-256 {str(before['sha256'])[:12]}... "
              f"then, {now['sha256'][:12]}... now): the net was built with it as it is now", file=sys.stderr)
    return now


def _structure(config, saved, function):
    """The structure (Net.structure) a run's net is built from, or None to build it by its model spec: a fine-tune
    of another run's net (no --model), from that run's checkpoint; a resume whose model file is gone, from its
    own (said on stderr). A resume whose file is there builds with the file, as the run did."""
    if function is not None or config.find_model:
        return None
    if saved is None:  # a fine-tune of --init-from's own net
        return checkpoint.load(checkpoint.checkpoint_path(config.init_from)).structure
    if modelspec.is_own(config.model) and not modelspec.found(config.model):
        print(f"note: {config.model} is not there: the net is built from the structure {saved.path} keeps",
              file=sys.stderr)
        return saved.structure
    return None


def make_step(net, config, *, ranks, group=None, run_data=None, saved=None):
    """(the run's TrainStep, its memory.Memory or None): net compiled for a sub-batch (refused before allocation where
    it does not fit the memory), its optimizer, its share of the sub-batches (ranks). A --memory run's stores and
    sub-batches are solved for its budget first (memory.py): from its checkpoint's record on a resume (saved), else
    calibrated and solved (under several ranks on rank 0, each rank then solving the record again and all of them
    agreeing on the mix)."""
    clip, solved = config.clip_norm, None
    store = config.store
    if config.memory is not None:
        solved = _memory(net, config, ranks=ranks, group=group, run_data=run_data, saved=saved)
        config, store = solved.config, list(solved.stores)
    frozen = tuning.frozen_units(config.freeze, units=len(net.units), classifier=_classifier(net))
    weights = None if config.class_weights is None else tuning.class_weights(
        config.class_weights, run_data.train.labels, classes=net.classes)
    compile_within_memory(net, pass_images=config.sub_batch, store=store, seed=config.seed, optimizer=config.optimizer,
                          grad_norm=clip is not None, label_smoothing=config.label_smoothing, class_weights=weights)
    opt = (AdamW(net, weight_decay=config.weight_decay, clip_norm=clip, frozen=frozen) if config.optimizer == "adamw"
           else SGD(net, momentum=config.momentum, weight_decay=config.weight_decay, clip_norm=clip, frozen=frozen))
    return TrainStep(net, opt, sub_batches=config.sub_batches // ranks, graph=config.graph, group=group), solved


def _classifier(net):
    """The index of the net's classifier unit (--freeze all-but-classifier's one unit left to train)."""
    return next(u.index for u in net.units if u.is_classifier)


def _memory(net, config, *, ranks, group, run_data, saved):
    """The memory.Memory of a --memory run (make_step's)."""
    if saved is not None:
        if saved.memory is None:
            raise ValueError(f"{saved.path} is damaged: a --memory run's checkpoint without its memory record")
        return memory.resumed(net, config, run_data, saved.memory, path=saved.path)
    if group is None:
        return memory.solved(net, config, run_data, ranks=ranks)
    record = group.on_rank_0(lambda: memory.solved(net, config, run_data, ranks=ranks).record)
    solved = memory.resumed(net, config, run_data, record, path="rank 0's memory record")
    mixes = group.gather_objects((solved.record["bits"], solved.config.sub_batches))
    differ = next((rank for rank, mix in enumerate(mixes) if mix != mixes[0]), None)
    if differ is not None:
        error = ValueError(f"rank {differ} solves --memory {config.memory} to another mix than rank 0 "
                           f"({mixes[differ][1]} sub-batches against {mixes[0][1]}, or other stores): every rank "
                           "needs the same minibp, net and data")
        error.on_every_rank = True
        raise error
    return solved


def started(started_from, why):
    """The header's line of a run begun from another's weights: where from, and what started fresh."""
    fresh = "; ".join(f"{name} {why[name]}" for name in started_from["fresh"][:6])
    more = len(started_from["fresh"]) - 6
    return (f"started from {started_from['checkpoint']} (iteration {started_from['iteration']}): took "
            f"{started_from['taken']} arrays (parameters and running statistics)"
            + (f"; fresh: {fresh}" + (f"; and {more} more" if more > 0 else "") if fresh else "; nothing fresh"))


def header(config, net, step, run_data, *, ranks, started_from=None, why=None, memory=None):
    """The lines a run starts with: the net, the data, the store, the batch and the device; the optimizer and
    schedule; where a fine-tuned run's weights came from (started_from, why: take_weights'); the augmentation
    and the validation split; the plan of a step."""
    sub_batch = config.sub_batch
    in_sub_batches = f" ({config.sub_batches} x {sub_batch})" if config.sub_batches > 1 else ""
    if ranks > 1:
        in_sub_batches = f" ({ranks} ranks x {config.sub_batches // ranks} x {sub_batch})"
    lines = [f"{modelspec.describe(config.model, config.model_args)} ({len(net.units)} units, "
             f"{net.num_parameters:,} parameters) on {shown(config.data)} ({len(run_data.train.labels):,} training "
             f"images), "
             f"{config.store if memory is None else 'memory ' + config.memory}, batch {config.batch}{in_sub_batches}, "
             f"device {backend.device}"
             f"{', one CUDA graph a step' if step.graph else ', the step replayed' if step.replay else ''}",
             training(config)]
    lines += [line for line in (loss_and_frozen(config, net, step.opt),) if line]
    if memory is not None:
        lines.append(memory.header())
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
    line = f"optimizer {optimizer}; schedule {config.lr_schedule} over {config.iters} iterations; gradient {clip}"
    if config.patience is not None:
        line += f"; stops early after {config.patience} validations without a better one (--patience)"
    return line


def loss_and_frozen(config, net, opt):
    """The header's line of a loss other than plain cross-entropy and of frozen units, or None for neither:
    'loss: label smoothing 0.1, class weights balanced; frozen: units 0-15 (16 of 56)'."""
    loss = [f"label smoothing {config.label_smoothing:g}"] if config.label_smoothing else []
    if config.class_weights is not None:
        weights = config.class_weights
        loss.append(f"class weights {weights if len(weights) <= 60 else weights[:57] + '...'}")
    parts = ([f"loss: {', '.join(loss)}"] if loss else []) + (
        [f"frozen: {tuning.describe_frozen(opt.frozen, len(net.units))}"] if opt.frozen else [])
    return "; ".join(parts) or None
