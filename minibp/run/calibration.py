"""The error model a memory budget solves with (budget.py), calibrated on the run's own first images.

    errors = calibrate(net, images, labels, store=config.store, seed=config.seed)   # (units, 3): 2, 4, 8 bits

err(u, k), the predicted error of unit u's store at k bits, is the squared error that store puts into the whole
parameter gradient, at the weights the run starts from. A unit's store perturbs the gradient twice: its own
parameters' directly (its conv's through a~, its batch norm's through xhat~), and every unit's below it through the
gradient it sends down (dx), which a residual stream carries to the first layers, where it adds up: in a ResNet-164
the error of the last stage's stores lands almost all on the first stage's gradients, thousands of times their
own. So the calibration measures both:

    own(u, k)      ||g_u(k) - g_u(exact)||^2 of unit u's own parameters with every unit at k bits
    total(G)       ||g(G at 4 bits) - g(exact)||^2 of the whole gradient with only the group G of units at 4 bits,
                   for GROUPS groups of consecutive units, the net's depth in equal parts
    err(u, k)    = total(G) * own(u, k) / sum_{v in G} own(v, 4)

each group's whole error shared among its units as their own errors are, and carried to k by the unit's own ratio.
The squared errors of independent sources add, so sum_u err(u, s_u) predicts a mix's: exactly for a group's
uniform store, as a share within a group (docs/method.md, "A memory budget"); bench/error_model.py and
bench/budget.py check it against measurement.

The calibration computes 4 + GROUPS gradients of its images (exact; 8, 4 and 2 bits in every unit; each group at 4
bits), each in passes of `pass_images` as a step computes its sub-batches (the run's pass size where an exact pass
of it fits the budget, fewer where not), each net.compile within the budget: its arena is the net's own, at that
pass size, checked by check_plan before it is allocated. It changes nothing a run keeps: the caller compiles the net
again for its mix and starts it from its initial weights.
"""
import numpy as np

from .. import backend
from ..params import slices
from .budget import stores_of

BITS = (2, 4, 8)      # the columns of the errors, as budget.solve takes them
IMAGES = 32           # the calibration's images at most
GROUPS = 8            # the groups of units whose whole error is measured (fewer in a net of fewer units)


def calibrate(net, images, labels, *, store, seed, pass_images=None, check_plan=None, say=None):
    """(units, 3) float64: each batch-norm unit's err(u, k) at 2, 4 and 8 bits (the module docstring), measured on
    images (n, H, W, C) and labels (n,), on the host, in passes of pass_images (default n; it divides n). store: the
    run's (its window, rounding and clip); check_plan: refuses a calibration arena that does not fit
    (Net.compile's); say: progress lines. Beside the arena it holds two copies of the gradient on the host
    (calibration_bytes)."""
    n = len(images)
    m = pass_images or n
    passes = n // m
    if passes * m != n:
        raise ValueError(f"the calibration's {n} images are not whole passes of {m}")
    units = [u for u in net.units if u.bn_channels]
    own_slices = _unit_slices(net, units)
    groups = np.array_split(np.arange(len(units)), min(GROUPS, len(units)))
    configurations = [("exact", "exact")] + [(f"{k} bits", [str(k)] * len(units)) for k in reversed(BITS)]
    configurations += [(f"units {g[0]}-{g[-1]} at 4 bits", ["4" if i in set(g) else "exact" for i in range(len(units))])
                       for g in groups]
    exact, own, total = None, {}, []
    for step, (name, bits) in enumerate(configurations, 1):
        if say is not None:
            say(f"memory: calibrating the error model on {n} images ({passes} pass{'es' * (passes > 1)} of {m}), "
                f"{step}/{len(configurations)}: {name}")
        stores = store.at("exact") if bits == "exact" else list(stores_of(net, bits, store))
        gradient = _gradient(net, images, labels, stores=stores, pass_images=m, seed=seed, check_plan=check_plan)
        if exact is None:
            exact = gradient.copy()
            continue
        gradient -= exact
        if step <= 1 + len(BITS):
            own[bits[0]] = [_squared(gradient, mine) for mine in own_slices]
        else:
            total.append(_squared(gradient, [slice(0, len(gradient))]))
    own = np.array([own[str(k)] for k in BITS], np.float64).T  # (units, 3)
    errors = np.zeros_like(own)
    for group, whole in zip(groups, total):
        errors[group] = whole * own[group] / max(own[group, 1].sum(), np.finfo(np.float64).tiny)
    return errors


def calibration_bytes(net):
    """The host bytes calibrate() holds beside the net's arena: the exact gradient's copy and a gradient's."""
    return 2 * net.num_parameters * np.dtype(net.dtype).itemsize


def _gradient(net, images, labels, *, stores, pass_images, seed, check_plan):
    """The whole parameter gradient (host, flat, a copy) of the images in passes of pass_images, as a step sums its
    sub-batches', the net compiled with these stores."""
    net.arena = None  # the last arena goes first, and its state is not copied: every pass starts from the seed's
    net.compile(pass_images=pass_images, store=stores, seed=seed, check_plan=check_plan)
    passes = len(images) // pass_images
    for p in range(passes):
        part = slice(p * pass_images, (p + 1) * pass_images)
        net.forward(backend.xp.asarray(images[part]), labels[part], draw=p)
        net.backward(loss_scale=1.0 / passes, accumulate=p > 0)
    return np.array(backend.to_host(net.grads), copy=True)


def _unit_slices(net, units):
    """Each unit's slices of the flat gradient (its parameters, every role), in the parameter table's layout."""
    mine = {u.index: [] for u in units}
    for _, u, _, where in slices(net.units):
        mine.get(u.index, []).append(where)
    return [mine[u.index] for u in units]


def _squared(values, parts, chunk=1 << 20):
    """The sum of squares of values over parts (slices), in float64, a chunk at a time (no copy of the whole)."""
    total = 0.0
    for s in parts:
        for start in range(s.start, s.stop, chunk):
            part = values[start:min(start + chunk, s.stop)].astype(np.float64)
            total += float(np.dot(part, part))
    return total
