"""Launch shapes of the row kernels (kernels/bn.cu, kernels/pool.cu) by device, and the output size of a
sliding set of taps (a conv's or a pool's) along one axis.

The row kernels see an activation as (rows, C), channels last: blocks walk rows in chunks, and a block's
threads walk a row's groups (channels, or code bytes at k bits). launch() alone chooses that shape; the
results do not depend on it (kernels/bn.cu says why).
"""
from .. import backend
from ..constants import FINISH_PIECE

GPU_BLOCK = 256        # threads a GPU block: a row's groups (x) times row lanes (y)
GPU_MAX_BLOCKS = 4096  # more rows than that covers: the lanes stride over them
CPU_BLOCKS = 64        # one-thread blocks the CPU's OpenMP threads share: a contiguous run of rows each


def output_size(size, kernel, stride, padding):
    """(output size, padding before) along one axis, TensorFlow's convention for "same"."""
    if padding == "valid":
        if size < kernel:
            raise ValueError(f"a {kernel}-wide 'valid' kernel does not fit an input of size {size}")
        return (size - kernel) // stride + 1, 0
    if padding == "same":
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        return out, total // 2
    raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")


def finish_launch(C):
    """dict(grid, block) of a finishing kernel over C channels (kernels/bn_walk.cuh's for_finish_channels): on the
    GPU a thread a channel, on the CPU one-thread blocks that share pieces of FINISH_PIECE channels."""
    if backend.device == "gpu":
        return dict(threads=C)  # the loader's default shape: 256-thread blocks covering C threads
    return dict(grid=(min(-(-C // FINISH_PIECE), CPU_BLOCKS),), block=(1,))


def window_launch(windows, C):
    """dict(grid, block) of code_windows over (windows, C) (kernels/bn.cu's for_window_pieces): on the GPU a thread a
    window and channel, on the CPU one-thread blocks that share (window, piece of FINISH_PIECE channels) items."""
    if backend.device == "gpu":
        return dict(threads=windows * C)
    return dict(grid=(min(windows * -(-C // FINISH_PIECE), CPU_BLOCKS),), block=(1,))


def launch(rows, C, *, bits=0, rows_per_chunk=None):
    """dict(grid, block, rows_per_chunk) of a BN kernel over (rows, C) at `bits`, or a pooling kernel's over
    (pixels, C) (bits = 0: its threads share channels); rows_per_chunk is given for a reduction (its chunks
    of partial sums), else the device's choice."""
    groups = C * bits // 8 if bits else C  # what a row's threads share: channels, or code bytes
    if backend.device == "gpu":  # adjacent threads on adjacent addresses, several rows a block when rows are narrow
        x = min(1 << (groups - 1).bit_length(), GPU_BLOCK)
        per_chunk = rows_per_chunk or 1
        lanes = -(-rows // per_chunk)
        return dict(grid=(min(-(-lanes // (GPU_BLOCK // x)), GPU_MAX_BLOCKS),), block=(x, GPU_BLOCK // x),
                    rows_per_chunk=per_chunk)
    # one thread a block (its row loops vectorise), a contiguous run of rows each
    per_chunk = rows_per_chunk or -(-rows // CPU_BLOCKS)
    return dict(grid=(min(-(-rows // per_chunk), CPU_BLOCKS),), block=(1,), rows_per_chunk=per_chunk)
