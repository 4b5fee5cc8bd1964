"""Fitting a plan to memory: sizes in bytes as people write them, the largest pass whose arena fits a budget,
and a net compiled only after its plan is known to fit the memory available now (the trainer, the evaluator
and the planner's --budget all ask these questions of Net.plan, the table the arena allocates from).
"""
import ctypes
import math
import re

import numpy as np

from .. import backend
from ..arena import format_bytes
from ..params import key

UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
         "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40,
         "p": 2**50, "pb": 10**15, "pib": 2**50}
MAX_BUDGET = 2**50      # 1 PiB: beyond any machine, and every buffer size stays far inside int64
MAX_BATCH = 2**31 - 1   # the largest pass (and so batch of one pass) the search reports
FAR = 2**20             # a pass far enough from 1 image that alignment padding barely tilts the predicted slope


def parse_bytes(text):
    """'11GiB', '11 GB', '512MiB', '1e9' -> bytes (int)."""
    match = re.fullmatch(r"\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"a size is a number and a unit (B, KiB, MiB, GiB, TiB, PiB, KB, MB, GB, TB, PB), "
                         f"got {text!r}")
    value = float(match.group(1)) * UNITS[match.group(2).lower()]
    if not math.isfinite(value):
        raise ValueError(f"size {text!r} is not a finite number of bytes")
    return int(value)


def check_budget(budget):
    """A budget in bytes as an int; ValueError unless it is positive and at most MAX_BUDGET."""
    if not budget > 0:  # NaN too
        raise ValueError(f"a budget must be a positive number of bytes, got {budget}")
    if budget > MAX_BUDGET:
        raise ValueError(f"budget {budget:.3g} bytes is beyond any machine (at most 1 PiB)")
    return int(budget)


def largest_batch(net, *, store, budget, training=True, optimizer="sgd", grad_norm=False, class_weights=False):
    """The largest pass_images, at this store (quant.Store), (at most MAX_BATCH) whose arena fits the budget: the
    largest batch a step of one pass (or an evaluation) takes; 0 if not even one image fits. training, optimizer,
    grad_norm and class_weights: Net.plan's.

    The arena grows with the pass, monotonically and nearly linearly (alignment padding and reduction
    chunks aside): plans at passes of 1 and FAR images predict the answer, a bracket widened from the prediction
    by doubling steps and then a bisection pin it down in O(log(error)) more plans, whatever the budget."""
    budget = check_budget(budget)
    allocation = lambda n: net.plan(pass_images=n, store=store, training=training, optimizer=optimizer,  # noqa: E731
                                    grad_norm=grad_norm, class_weights=class_weights).allocation_bytes
    fits = lambda n: allocation(n) <= budget  # noqa: E731
    one = allocation(1)
    if one > budget:
        return 0
    per_image = max(1, (allocation(FAR) - one) / (FAR - 1))
    guess = int(min(MAX_BATCH, max(1, 1 + (budget - one) // per_image)))
    lo, hi, step = 1, MAX_BATCH + 1, 1  # lo fits; hi does not (beyond the cap counts as not fitting)
    if fits(guess):
        lo = guess
        while lo + step < hi and fits(lo + step):
            lo, step = lo + step, 2 * step
        hi = min(hi, lo + step)
    else:
        hi = guess
        while hi - step > lo and not fits(hi - step):
            hi, step = hi - step, 2 * step
        lo = max(lo, hi - step)
    while hi - lo > 1:
        middle = (lo + hi) // 2
        lo, hi = (middle, hi) if fits(middle) else (lo, middle)
    return lo


def compile_within_memory(net, *, pass_images, store,
                          hint="lower --batch, or compute it in parts with --sub-batches", **options):
    """net.compile(pass_images=, store=, **options), refused before anything is allocated unless its plan fits the
    memory available now; the refusal gives the plan's size and the largest batch (of one pass) that fits."""
    planned = {k: options[k] for k in ("training", "optimizer", "grad_norm") if k in options}  # what plans differ by
    planned["class_weights"] = options.get("class_weights") is not None  # (compile takes them, a plan their buffer)

    def check_fits(plan):
        available = backend.available_memory()
        if available is None or plan.allocation_bytes <= available:
            return
        fits = largest_batch(net, store=store, budget=available, **planned) if available > 0 else 0
        if fits == 0:  # no pass size helps: say what is too big
            one = net.plan(pass_images=1, store=store, **planned).allocation_bytes
            raise ValueError(f"even a pass of 1 image needs {format_bytes(one)} but {backend.device} has "
                             f"{format_bytes(available)} available: the net is too large for this machine (input "
                             f"{'x'.join(map(str, net.input_shape))}, {net.classes:,} classes)")
        raise ValueError(f"a pass of {pass_images} images needs {format_bytes(plan.allocation_bytes)} but "
                         f"{backend.device} has {format_bytes(available)} available: the largest pass that fits is "
                         f"{fits} images ({hint})")

    return net.compile(pass_images=pass_images, store=store, check_plan=check_fits, **options)


def unit_rows(net, plan):
    """[(unit index, input shape, store bytes)] of the units that keep a store in this plan: the activation
    stores' bytes of each (its codes, and the block window's windows, which grow with the pass)."""
    def stores(u):
        names = (key(u.index, role) for role in ("x_copy", "codes", "windows"))
        return sum(plan[n].nbytes for n in names if n in plan and plan[n].category == "activation stores")
    return [(u.index, u.in_shape, stores(u)) for u in net.units
            if key(u.index, "x_copy") in plan or key(u.index, "codes") in plan]


# ----------------------------------------------------------------------------- a whole run within a budget

SLACK = 32 * 2**20  # the small change a budget keeps beyond what it counts (Python's objects, h5py's and NumPy's
#                     small buffers, the OpenMP threads' stacks): bench/budget.py measures the peak against it
AUTO_MARGIN = 0.05  # --memory auto leaves this share of the memory available now (at least MIN_MARGIN): the
MIN_MARGIN = 256 * 2**20  # page cache MemAvailable counts, and other processes' growth while the run lasts
GPU_MARGIN = 512 * 2**20  # a GPU's: cuBLAS's and cuDNN's own handles and kernels take device memory outside the pool


def process_bytes(field="VmRSS"):
    """This process's resident memory now (VmRSS) or at its peak so far (VmHWM), from /proc; None where the system
    does not say."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def return_freed_memory():
    """Have glibc give large freed blocks back to the system at once. Its allocator raises the size from which it maps
    a block of its own each time such a block is freed (up to 32 MiB), so that arrays of a few MiB freed and made
    again (a calibration's arenas, a checkpoint's copies) come to stay on its heap, and the resident memory grows past
    what is in use. A fixed threshold (M_MMAP_THRESHOLD, 128 KiB) keeps it what is in use. Elsewhere: nothing."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(ctypes.c_int(-3), ctypes.c_int(128 * 1024))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def pool_bytes():
    """The bytes CuPy's pool holds now (the GPU's arena and whatever else it allocated)."""
    return int(backend.xp.get_default_memory_pool().total_bytes())


class Footprint:
    """What a memory budget holds besides the step's arena, and the peak the process reaches, on either device.

    On the CPU the budget bounds the process's resident memory (its peak, VmHWM), and a run's footprint is:
        measured       the process's resident memory when it solves (the interpreter, NumPy, h5py, the kernels'
                       libraries and BLAS, brought to their steady state by a warm-up pass of a tiny net, and the
                       data held in memory with its batch buffers): read from /proc, not modelled
        staging        a replayed step's (--graph) host copy of the batch it stages its sub-batches from
        transient(n)   the most any later moment adds beside the arena, whichever is largest: a checkpoint (the
                       file built in memory, the state's size, and as much again for HDF5's own blocks; the state
                       itself is read in place), a validation (a pass's images made float), or the calibration
                       (its copy of the exact gradient)
        SLACK          the small change
    On a GPU the budget bounds CuPy's pool (its high-water mark): the arena, and nothing beside it (the batches,
    checkpoints and the calibration's copies are the host's; the CUDA context and the libraries' handles are
    outside the pool, which --memory auto leaves GPU_MARGIN for)."""

    def __init__(self, net, *, per_process, train_images, replay=False, adamw=False):
        itemsize = np.dtype(net.dtype).itemsize
        P, S = net.num_parameters, sum(u.bn_channels for u in net.units)
        self.gpu = backend.device == "gpu"
        self.image_values = int(np.prod(net.input_shape))
        self.state = (P * (3 if adamw else 2) + 2 * S) * itemsize    # params, momentum (and AdamW's), running
        self.checkpoint = 2 * self.state + 8 * train_images           # its file in memory, HDF5's, the order
        self.staging = (per_process * (self.image_values * itemsize + 8)) if replay else 0  # a replayed step's
        self.measured = 0

    def measure(self, warm_up=None):
        """Read the process's resident memory now (after warm_up(), which brings the libraries to their steady
        state); on a GPU the pool's bytes outside any arena (none, once the net's old arena is freed)."""
        if self.gpu:
            self.measured = 0
            return self
        return_freed_memory()
        if warm_up is not None:
            warm_up()
        self.measured = process_bytes() or 0
        return self

    def overhead(self, n, *, calibration=0):
        """The bytes a budget holds beside an arena of passes of n images (calibration: the calibration's own)."""
        if self.gpu:
            return 0
        validation = 3 * n * self.image_values * 4
        return self.measured + self.staging + max(self.checkpoint, validation, calibration) + SLACK

    def peak(self):
        """What the budget bounds, at its highest so far: the resident memory's peak, or the pool's bytes."""
        return pool_bytes() if self.gpu else process_bytes("VmHWM")

    what = property(lambda self: "the pool's high-water mark" if self.gpu else "peak resident memory")


def auto_budget():
    """--memory auto: the memory this run may take now, less a margin (AUTO_MARGIN, at least MIN_MARGIN; a GPU's
    GPU_MARGIN): on the CPU the process's resident memory and MemAvailable, on a GPU the free device memory and
    what CuPy's pool holds unused. A ValueError where the system does not say."""
    available = backend.available_memory()
    if available is None:
        raise ValueError("--memory auto: this system does not say how much memory is available; give a size")
    if backend.device == "gpu":
        return pool_bytes() + available - GPU_MARGIN
    return (process_bytes() or 0) + available - max(MIN_MARGIN, int(AUTO_MARGIN * available))


def parse_memory(text):
    """--memory's value: 'auto', or a size as --budget takes it; (text, bytes or None for auto)."""
    if str(text).strip().lower() == "auto":
        return None
    return check_budget(parse_bytes(text))
