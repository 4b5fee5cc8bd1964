"""The arena: every large buffer of a training step, planned in one table, allocated once.

A Plan is a table of buffers (name, shape, dtype, category). It reports bytes per category and
in total without allocating anything, which is how a user learns what a pass size costs.
An Arena makes one allocation for a plan and carves it into views, each starting on a
256-byte boundary; asking it for a buffer the plan does not hold is an error.

    plan = Plan()
    plan.add("act0", (N, H, W, C), np.float32, "shared activations")
    plan.total_bytes                     # no memory touched yet
    arena = Arena(plan)
    arena["act0"]                        # a (N, H, W, C) float32 view into the one allocation
"""
from dataclasses import dataclass

import numpy as np

from . import backend

ALIGNMENT = 256  # bytes; what cuBLAS/cuDNN and AVX-512 loads like best


def align_up(nbytes):
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def format_bytes(nbytes):
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple
    dtype: np.dtype
    category: str

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


class Plan:
    """An ordered table of named buffers. Nothing is allocated."""

    def __init__(self):
        self.buffers = {}  # name -> BufferSpec, in the order added

    def add(self, name, shape, dtype, category):
        if name in self.buffers:
            raise ValueError(f"the plan already has a buffer named {name!r}")
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"buffer {name!r}: negative size in shape {shape}")
        self.buffers[name] = BufferSpec(name, shape, np.dtype(dtype), category)
        return name

    def __contains__(self, name):
        return name in self.buffers

    def __getitem__(self, name):
        return self.buffers[name]

    @property
    def total_bytes(self):
        """Bytes of all buffers (without alignment padding)."""
        return sum(b.nbytes for b in self.buffers.values())

    @property
    def allocation_bytes(self):
        """Bytes the arena allocates: every buffer padded to the alignment, plus one alignment for the base."""
        return sum(align_up(b.nbytes) for b in self.buffers.values()) + ALIGNMENT

    def bytes_by_category(self):
        totals = {}
        for b in self.buffers.values():
            totals[b.category] = totals.get(b.category, 0) + b.nbytes
        return totals

    def summary(self):
        """A table of bytes per category and the total, as text."""
        rows = sorted(self.bytes_by_category().items(), key=lambda kv: -kv[1])
        width = max([len(c) for c, _ in rows] + [5])
        lines = [f"{c:<{width}}  {format_bytes(n):>12}" for c, n in rows]
        lines.append(f"{'total':<{width}}  {format_bytes(self.total_bytes):>12}")
        return "\n".join(lines)


class Arena:
    """One allocation for a plan, carved into aligned views: arena[name]."""

    def __init__(self, plan):
        self.plan = plan
        xp = backend.xp
        self.memory = xp.empty(plan.allocation_bytes, dtype=np.uint8)  # (allocation_bytes,) the only allocation
        address = self.memory.data.ptr if backend.device == "gpu" else self.memory.ctypes.data
        offset = (-address) % ALIGNMENT
        self.views = {}
        for spec in plan.buffers.values():
            raw = self.memory[offset:offset + spec.nbytes]
            self.views[spec.name] = raw.view(spec.dtype).reshape(spec.shape)
            offset += align_up(spec.nbytes)

    def __getitem__(self, name):
        try:
            return self.views[name]
        except KeyError:
            raise KeyError(f"buffer {name!r} is not in the arena's plan (planned: {', '.join(self.views)})") from None

    def __contains__(self, name):
        return name in self.views
