"""The error model a memory budget solves with (budget.py), calibrated on the run's own first images.

    errors = calibrate(net, images, labels, store=config.store, seed=config.seed)   # (units, 3): 2, 4, 8 bits

err(u, k), the predicted error of unit u's store at k bits, is the squared error k-bit stores put into the unit's own
parameter gradient: ||g_u(k) - g_u(exact)||^2, measured on the calibration images with every unit at k bits, the
weights as the run starts. The squared errors of a gradient add over independent sources, and a unit's store
perturbs first the gradient of its own conv (through a~) and its batch norm (through xhat~); the error it sends down
through dx lands in the units below it, where this measure charges it to them (docs/method.md, "A memory budget",
derives the model and says what it leaves out). So sum_u err(u, s_u) predicts the squared error of the whole
gradient, exactly for a uniform store on these images and as that sum for a mix; bench/budget.py checks it against
measurement.

The calibration runs four passes on a batch of n images (exact, then 8, 4 and 2 bits), each net.compile within the
budget: its arena is the net's own, at n, checked by check_plan before it is allocated. It changes nothing a run
keeps: the caller compiles the net again for its mix and starts it from its initial weights.
"""
import numpy as np

from .. import backend
from ..params import key

BITS = (2, 4, 8)      # the columns of the errors, as budget.solve takes them
IMAGES = 32           # the calibration's images at most (fewer where the budget holds fewer exact)


def calibrate(net, images, labels, *, store, seed, check_plan=None, say=None):
    """(units, 3) float64: each batch-norm unit's err(u, k) at 2, 4 and 8 bits (the module docstring), measured on
    images (n, H, W, C) and labels (n,), on the host. store: the run's (its window, rounding and clip);
    check_plan: refuses a calibration arena that does not fit (Net.compile's); say: progress lines. Beside the
    arena it holds one float32 copy of the exact gradient on the host (calibration_bytes)."""
    n = len(images)
    units = [u for u in net.units if u.bn_channels]
    exact, errors = None, {}
    for bits in ("exact",) + tuple(str(k) for k in reversed(BITS)):
        if say is not None:
            say(f"memory: calibrating the error model on {n} images: {bits}{' bits' if bits != 'exact' else ''}")
        net.compile(batch=n, store=store.at(bits), seed=seed, check_plan=check_plan)
        net.forward(backend.xp.asarray(images), labels, draw=0)
        net.backward(accumulate=False)
        if exact is None:
            exact = [[backend.to_host(net.grad_views[name]).copy() for name in _names(u)] for u in units]
        else:
            errors[bits] = [sum(_squared_distance(backend.to_host(net.grad_views[name]), e)
                                for name, e in zip(_names(u), mine)) for u, mine in zip(units, exact)]
    return np.array([errors[str(k)] for k in BITS], np.float64).T


def calibration_bytes(net):
    """The host bytes calibrate() holds beside the net's arena: the exact gradient's copy (float), and a role's
    difference in float64 at a time."""
    sizes = [int(np.prod(p.shape)) for u in net.units for p in u.parameters()]
    return sum(sizes) * np.dtype(net.dtype).itemsize + 2 * max(sizes, default=0) * 8


def _names(u):
    """The names of the unit's parameters, every role (its conv's, its batch norm's): its part of the gradient."""
    return [key(u.index, p.role) for p in u.parameters()]


def _squared_distance(a, b):
    d = a.astype(np.float64) - b
    return float(np.dot(d.ravel(), d.ravel()))
