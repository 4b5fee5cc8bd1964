"""A run within its memory budget (--memory): solved once as the run starts, kept in its checkpoints, solved the
same way again on a resume.

    memory = solved(net, config, run_data, ranks=1, say=print)    # a fresh run: calibrated, then solved
    memory = resumed(net, config, saved.memory, ranks=1)           # a resume: the record solved again, checked
    memory.stores, memory.config, memory.record                    # each unit's store, the run's sub-batches, JSON

The record holds what a solve takes (the budget in bytes, the process's measured bytes and the calibrated errors), so
a resume, on this machine or another, solves to the same mix and the same sub-batches, and refuses a record that
does not (a checkpoint edited, or of another minibp). What the record also holds (the mix and the sub-batches it
solved to, the arena's bytes) is what evaluate, predict, export and --init-from read: they compute no codes, but
say what the run kept.
"""
from dataclasses import dataclass, replace

import numpy as np

from .. import backend, models
from ..arena import format_bytes
from ..io import imagenet
from ..io.batches import evaluation_batches
from ..optim import SGD
from ..quant import describe
from . import budget, calibration
from .sizing import Footprint, auto_budget, parse_memory


@dataclass(frozen=True)
class Memory:
    stores: tuple       # (quant.Store,) one a unit
    config: object      # the run's RunConfig, its sub_batches the solution's (over all ranks)
    record: dict        # what a checkpoint keeps (the module docstring)
    footprint: object   # sizing.Footprint: the peak the run reaches, to print at its end

    def header(self):
        """The console's line of the mix: 'stores: 412 units exact, ... (1.21 GiB of 1.25 GiB: ...)'."""
        r = self.record
        return (f"stores: {describe([self.config.store.at(bits) for bits in r['bits']])} "
                f"({format_bytes(r['arena'] + r['overhead'])} of {format_bytes(r['budget'])}: the arena "
                f"{format_bytes(r['arena'])}, the process beside it {format_bytes(r['overhead'])}); "
                f"{self.config.sub_batches} sub-batch{'es' * (self.config.sub_batches > 1)} of "
                f"{self.config.sub_batch}; the error model calibrated on {r['calibration_images']} images in passes "
                f"of {r.get('calibration_pass', r['calibration_images'])}")

    def peak_line(self):
        """The end's line: the peak measured beside the plan and the budget."""
        r, peak = self.record, self.footprint.peak()
        return (f"memory: {self.footprint.what} {format_bytes(peak) if peak is not None else 'not reported'}, "
                f"planned {format_bytes(r['arena'] + r['overhead'])}, budget {format_bytes(r['budget'])}")


def kept(net, config, saved):
    """The stores a trained run kept, as Net.compile takes them (evaluate, minibp.load, predict, export): its
    checkpoint's recorded mix for a --memory run, else its one store."""
    if config.memory is None:
        return config.store
    problem = "is missing" if saved.memory is None else _record_problem(saved.memory, net)
    if problem:
        raise ValueError(f"{saved.path} is damaged: its memory record {problem}")
    return list(budget.stores_of(net, saved.memory["bits"], config.store))


def costs_of(net, config, *, ranks):
    """budget.Costs of the run's net: each unit's bytes at each store, for the process's share of the batch."""
    return budget.Costs(net, store=config.store, per_process=config.batch // ranks, optimizer=config.optimizer,
                        grad_norm=config.clip_norm is not None, class_weights=config.class_weights is not None)


def footprint_of(net, config, run_data, *, ranks):
    """The run's sizing.Footprint (not yet measured)."""
    train = run_data.train
    images = len(train.labels) if hasattr(train, "labels") else 0
    return Footprint(net, per_process=config.batch // ranks, train_images=images, adamw=config.optimizer == "adamw",
                     replay=config.graph is True)


def calibration_images(config, run_data, n):
    """The first n training images, as a run normalises them and not augmented, with their labels: the error
    model's calibration batch (the same on every rank, every machine and every resume)."""
    train = run_data.train
    if isinstance(train, imagenet.Folder):
        batches = imagenet.evaluation_batches(train, batch=n, size=config.image_size, workers=config.workers)
    else:
        batches = evaluation_batches(train, batch=n, mean=run_data.mean)
    images, labels = next(iter(batches))
    return backend.to_host(images), np.asarray(labels)[:n]


def solved(net, config, run_data, *, ranks, say=print):
    """The Memory of a fresh run: its budget read (--memory SIZE, or auto), the process measured after a warm-up,
    the error model calibrated on the run's first images within the budget, then the mix and sub-batches solved.
    A ValueError where the budget holds no run, naming the least one and what it takes."""
    costs, footprint = costs_of(net, config, ranks=ranks), footprint_of(net, config, run_data, ranks=ranks)
    budget_bytes = parse_memory(config.memory)
    footprint.measure(warm_up=lambda: warm_up(net))
    if budget_bytes is None:
        budget_bytes = auto_budget()
    cal_bytes = calibration.calibration_bytes(net)
    check_least(costs, footprint, budget_bytes)
    cal_overhead = lambda n: footprint.overhead(n, calibration=cal_bytes)  # noqa: E731
    fewest = budget.fewest_sub_batches(costs, budget=budget_bytes, overhead=cal_overhead)
    m = _calibration_pass(costs, footprint, budget_bytes, cal_bytes,
                          min(costs.per_process // fewest, _split_size(run_data.train)))
    count = max(m, min(calibration.IMAGES, _split_size(run_data.train)) // m * m)
    images, labels = calibration_images(config, run_data, count)

    def check_plan(plan):
        if cal_overhead(m) + plan.allocation_bytes > budget_bytes:
            raise ValueError(f"the calibration's arena of {format_bytes(plan.allocation_bytes)} does not fit the "
                             f"budget of {format_bytes(budget_bytes)}")
    errors = calibration.calibrate(net, images, labels, store=config.store, seed=config.seed, pass_images=m,
                                   check_plan=check_plan, say=say)
    net.arena = None  # the calibration's arena goes before the run's comes
    if backend.device == "gpu":
        backend.xp.get_default_memory_pool().free_all_blocks()
    record = dict(budget=int(budget_bytes), measured=int(footprint.measured), staging=int(footprint.staging),
                  ranks=ranks, calibration_images=count,
                  calibration_pass=m, errors=errors.tolist())
    return _from_record(net, config, record, costs, footprint)


def resumed(net, config, run_data, record, *, path):
    """The Memory of a resumed run from its checkpoint's record (path: the checkpoint, for messages): solved
    again from what it holds, and refused unless that gives its mix and sub-batches."""
    problem = _record_problem(record, net)
    if problem:
        raise ValueError(f"{path} is damaged: its memory record {problem}")
    ranks = record["ranks"]
    if config.graph and not record.get("staging") and backend.device != "gpu":
        raise ValueError(f"--graph replays the step from a host copy of its batch, which {path}'s memory budget was "
                         "solved without: resume it without --graph")
    again = _from_record(net, config, record, costs_of(net, config, ranks=ranks),
                         footprint_of(net, config, run_data, ranks=ranks))
    if again.record["bits"] != record["bits"] or again.config.sub_batches != record["sub_batches"]:
        raise ValueError(f"{path}'s memory record does not solve to its own mix (a checkpoint of another minibp, or "
                         "edited): resume it with the minibp that wrote it")
    return again


def _from_record(net, config, record, costs, footprint):
    """Solve the record's budget with its errors and measured bytes; the Memory with the record completed (the
    mix, the sub-batches over all ranks, the bytes)."""
    footprint.measured, footprint.staging = record["measured"], record.get("staging", 0)
    cal = calibration.calibration_bytes(net)
    solution = budget.solve(costs, np.array(record["errors"]), budget=record["budget"],
                            overhead=lambda n: footprint.overhead(n, calibration=cal),
                            max_sub_batches=config.max_sub_batches)
    run = replace(config, sub_batches=solution.sub_batches * record["ranks"])
    complete = dict(record, sub_batches=run.sub_batches, bits=budget.unit_bits(net, solution.stores),
                    arena=solution.arena_bytes, overhead=solution.overhead_bytes, error=solution.error)
    return Memory(stores=solution.stores, config=run, record=complete, footprint=footprint)


def _calibration_pass(costs, footprint, budget_bytes, cal_bytes, n):
    """The calibration's pass size: the run's, n, where an exact pass of it fits the budget beside the process,
    else the most that does (check_least: at least one)."""
    for m in range(min(n, calibration.IMAGES), 1, -1):
        if _calibration_total(costs, footprint, m, cal_bytes) <= budget_bytes:
            return m
    return 1


def _calibration_total(costs, footprint, n, cal_bytes):
    """The bytes a calibration on n images takes: an exact arena at n, beside the process and the gradient's copy."""
    plan = costs.net.plan(pass_images=n, store=costs.choices[-1], **costs.planned)
    return footprint.overhead(n, calibration=cal_bytes) + plan.allocation_bytes


def check_least(costs, footprint, budget_bytes):
    """A ValueError naming the least budget and what it takes, where the budget is below it: 2 bits in every unit
    at a pass of one image, and the calibration's exact gradient of one image (the run's, and the planner's)."""
    cal_bytes = calibration.calibration_bytes(costs.net)
    solve, S = budget.least_budget(costs, lambda n: footprint.overhead(n, calibration=cal_bytes))
    least = max(solve, _calibration_total(costs, footprint, 1, cal_bytes))
    if budget_bytes < least:
        raise ValueError(f"needs at least {format_bytes(least)}: {budget.least_words(costs, S)}, and one image's "
                         f"exact gradient to calibrate the error model (given {format_bytes(budget_bytes)})")


def _split_size(split):
    return len(split.labels) if hasattr(split, "labels") else len(split)


def warm_up(net):
    """A pass of a tiny net of the run's kind: every kernel library loaded, BLAS's and OpenMP's buffers made, so that
    the resident memory read after it is the process's steady state."""
    C = net.input_shape[2]
    tiny = models.preact_resnet(11, input_shape=(8, 8, C), classes=2, dtype=net.dtype)
    tiny.compile(pass_images=2, bits="4")
    images = np.zeros((2, 8, 8, C), net.dtype)
    tiny.forward(backend.xp.asarray(images), np.zeros(2, np.int64))
    tiny.backward()
    SGD(tiny).step(lr=0.0)
    tiny.arena = None


def _record_problem(record, net):
    """What is wrong with a checkpoint's memory record, or None."""
    units = sum(1 for u in net.units if u.bn_channels)
    whole = ("budget", "measured", "ranks", "calibration_images", "sub_batches", "arena", "overhead")
    bad = [k for k in whole if not isinstance(record.get(k), int) or isinstance(record.get(k), bool) or record[k] < 0]
    if bad:
        return f"lacks a whole number {bad[0]}"
    errors = record.get("errors")
    if not isinstance(errors, list) or len(errors) != units or not all(
            isinstance(row, list) and len(row) == 3 and all(isinstance(v, (int, float)) and np.isfinite(v) and v >= 0
                                                            for v in row) for row in errors):
        return f"has no errors for each of the net's {units} batch-norm units (3 finite numbers each)"
    if not isinstance(record.get("bits"), list) or len(record["bits"]) != units or not all(
            b in budget.CHOICES for b in record["bits"]):
        return f"has no store for each of the net's {units} batch-norm units"
    return None
