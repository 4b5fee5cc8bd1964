"""Layers with explicit forward and backward passes, on NHWC arrays, writing into given buffers.

Layers hold no activations. Each backward takes, as arguments, exactly the forward values it
reads (its input x, or the unit's store), so what must be kept is visible in one place: the unit
in net.py, which keeps a k-bit (or exact) store per unit and nothing else of size.

    Conv2D                  any kernel size and stride, padding "same" or "valid": a 1x1 conv is one GEMM
                            of the (N*H*W, C) matrix, a k x k conv im2col + GEMM (in float32 on the CPU
                            the direct kernels of conv_direct.py, a fast path with the same results)
    batchnorm_relu_*        batch-statistics BN, gamma/beta and ReLU of one unit, fused with its store
    MaxPool, AvgPool, GlobalAvgPool
    ParameterFreeShortcut   the reference's residual shortcut: average-pool by the stride, zero-pad channels
    softmax_cross_entropy   mean over the batch; loss, accuracy and dlogits

The *_ref functions are plain NumPy statements of what each kernel computes (for readers and tests).
"""

import numpy as np

from . import backend, conv_direct, kernels, quant
from .quant import check_window

GAMMA_MIN = 1e-8         # gamma is clamped to at least this (docs/method.md, "The unit")
ROWS_PER_CHUNK = 16      # rows a reduction sums in order into one row of partial sums, which xp adds up


def _k(filename, dtype):
    return kernels.load(filename, dtype)


def conv_output_size(size, kernel, stride, padding):
    """(output size, padding before) along one axis, TensorFlow's convention for "same"."""
    if padding == "valid":
        if size < kernel:
            raise ValueError(f"a {kernel}-wide 'valid' window does not fit an input of size {size}")
        return (size - kernel) // stride + 1, 0
    if padding == "same":
        out = -(-size // stride)
        total = max((out - 1) * stride + kernel - size, 0)
        return out, total // 2
    raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")


# ----------------------------------------------------------------------------- convolution

COL_ELEMENTS = 1 << 20         # CPU: values a chunk of the im2col matrix holds (4 MiB of float32, cache-sized)


def _add_weight_grad(dw, dy2, cols):
    """dw (Cout, ...) += dy2^T @ cols, computed as the GEMM whose output has the longer side as rows (OpenBLAS
    runs these thin products up to 2x faster so)."""
    dw2 = dw.reshape(dy2.shape[1], cols.shape[1])
    if cols.shape[1] > dy2.shape[1]:
        dw2 += (cols.T @ dy2).T
    else:
        dw2 += dy2.T @ cols


class Conv2D:
    """y = conv(x, w) [+ bias]: x (N, H, W, Cin), w (Cout, kh, kw, Cin), y (N, Ho, Wo, Cout).

    Weights are (Cout, kh, kw, Cin), cuDNN's filter layout for NHWC data ("KRSC"), so the same buffer
    serves both paths; as a GEMM operand it is the (Cout, kh*kw*Cin) matrix w2, used transposed.

    How it is computed (the results agree to float32 rounding):
      direct   CPU, float32: conv_direct.py's kernels, a fast path that reads x and dy in place.
      GEMM     an unstrided 1x1 conv otherwise: x itself is the GEMM operand.
      im2col   the rest: im2col + GEMM, col2im for the data gradient, a chunk of images at a time in the
               workspace: the whole batch on the GPU (one GEMM, as cuBLAS likes it), COL_ELEMENTS on the CPU.
    """

    def __init__(self, in_shape, channels, *, kernel=3, stride=1, padding="same", bias=False):
        self.H, self.W, self.cin = in_shape
        self.kh = self.kw = int(kernel)
        self.stride, self.padding, self.cout, self.has_bias = int(stride), padding, int(channels), bias
        if self.kh < 1 or self.stride < 1 or self.cout < 1:
            raise ValueError(f"kernel, stride and channels must be positive, got {kernel}, {stride}, {channels}")
        self.Ho, self.pad_top = conv_output_size(self.H, self.kh, self.stride, padding)
        self.Wo, self.pad_left = conv_output_size(self.W, self.kw, self.stride, padding)
        self.is_pointwise = self.kh == 1 and self.pad_top == 0 and self.pad_left == 0
        self.engine = None  # a cudnn_conv.CudnnEngine when the net runs this conv through cuDNN

    @property
    def out_shape(self):
        return (self.Ho, self.Wo, self.cout)

    @property
    def weight_shape(self):
        return (self.cout, self.kh, self.kw, self.cin)

    @property
    def flops_per_image(self):
        """Multiply-adds x 2 of the forward pass for one image."""
        return 2 * self.Ho * self.Wo * self.cout * self.kh * self.kw * self.cin

    def _images_per_chunk(self, n):
        """Images an im2col chunk holds: all n on the GPU, as many as fill COL_ELEMENTS (at least 1) on the CPU."""
        if backend.device == "gpu":
            return n
        return max(1, min(n, COL_ELEMENTS // (self.Ho * self.Wo * self.kh * self.kw * self.cin)))

    def workspace_shape(self, batch, *, accumulate_dx=False):
        """(rows, cols) of the workspace col this conv needs: one chunk of the im2col matrix and, on the
        CPU, the direct path's (conv_direct.workspace_rows). An unstrided 1x1 conv reads x in place and
        needs no im2col chunk, unless its data gradient is added into another (accumulate_dx) on the GEMM
        path: then the product goes through the workspace first."""
        im2col = not (self.is_pointwise and self.stride == 1) or accumulate_dx
        rows = max(self._images_per_chunk(batch) * self.Ho * self.Wo if im2col else 0,
                   conv_direct.workspace_rows(self, batch))
        return (rows, self.kh * self.kw * self.cin) if rows else (0, 0)

    def _workspace(self, col, shape):
        """The first prod(shape) values of col, as that shape."""
        size = int(np.prod(shape))
        if col is None or col.size < size:
            raise ValueError(f"the conv workspace col holds {0 if col is None else col.size} values, this "
                             f"{self.kh}x{self.kw} conv needs {size}: size it by workspace_shape(batch)")
        return col.reshape(-1)[:size].reshape(shape)

    def _geometry(self, n):
        """The shape arguments of the im2col/col2im (and conv_weight_grad) kernels, by name."""
        return dict(N=n, H=self.H, W=self.W, C=self.cin, kh=self.kh, kw=self.kw, stride=self.stride,
                    pad_top=self.pad_top, pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def _columns(self, x, col):
        """The (n*Ho*Wo, kh*kw*Cin) matrix the GEMM reads for the n images of x: x itself, a subsampled
        copy, or im2col."""
        n = x.shape[0]
        rows, cols = n * self.Ho * self.Wo, self.kh * self.kw * self.cin
        if self.is_pointwise and self.stride == 1:
            return x.reshape(rows, cols)
        out = self._workspace(col, (rows, cols))
        if self.is_pointwise:  # strided 1x1: subsample
            backend.xp.copyto(out.reshape(n, self.Ho, self.Wo, self.cin), x[:, ::self.stride, ::self.stride, :])
        else:
            _k("conv.cu", x.dtype).im2col(**self._geometry(n), x=x, col=out, threads=rows * self.kh * self.kw)
        return out

    def _add_columns(self, dcol, dx, *, accumulate):
        """dx = (or += with accumulate) the adjoint of _columns applied to dcol, for the images of dx."""
        n = dx.shape[0]
        if self.is_pointwise and self.stride == 1:
            if accumulate:
                dx += dcol.reshape(dx.shape)
            else:
                backend.xp.copyto(dx, dcol.reshape(dx.shape))
        elif self.is_pointwise:  # strided 1x1: the subsampled positions get the gradient, the rest 0
            if not accumulate:
                dx[...] = 0
            dx[:, ::self.stride, ::self.stride, :] += dcol.reshape(n, self.Ho, self.Wo, self.cin)
        else:
            _k("conv.cu", dx.dtype).col2im(**self._geometry(n), accumulate=accumulate, col=dcol, dx=dx,
                                           threads=n * self.H * self.W)

    def _chunks(self, n):
        """(first, end) images of each im2col chunk."""
        step = self._images_per_chunk(n)
        return [(first, min(n, first + step)) for first in range(0, n, step)]

    def forward(self, x, w, bias, y, *, col):
        """y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin)); col is the workspace (workspace_shape)."""
        xp = backend.xp
        n = x.shape[0]
        if self.engine is not None and n == self.engine.batch:
            self.engine.forward(x, w, y)
            return
        y2 = y.reshape(n * self.Ho * self.Wo, self.cout)
        w2 = w.reshape(self.cout, -1)
        if conv_direct.applies(x.dtype):
            conv_direct.forward(self, x, w, y)
        elif self.is_pointwise and self.stride == 1:
            xp.matmul(x.reshape(-1, self.cin), w2.T, out=y2)
        else:
            pixels = self.Ho * self.Wo
            for first, end in self._chunks(n):
                xp.matmul(self._columns(x[first:end], col), w2.T, out=y2[first * pixels:end * pixels])
        if self.has_bias:
            y2 += bias

    def backward(self, x, w, dy, *, dw, dbias=None, dx=None, accumulate_dx=False, col):
        """dw += dL/dw (and dbias); dx = dL/dx (+= with accumulate_dx) if dx is given. Reads x, the
        forward input. What the direct kernels or a plain GEMM do not cover goes through im2col chunks:
        in each, the weight gradient first, then the data gradient in the same workspace."""
        xp = backend.xp
        n = x.shape[0]
        if self.engine is not None and n == self.engine.batch and not accumulate_dx:
            self.engine.backward(x, w, dy, dw=dw, dx=dx)
            return
        pixels = self.Ho * self.Wo
        dy2 = dy.reshape(n * pixels, self.cout)
        w2 = w.reshape(self.cout, -1)  # (Cout, kh*kw*Cin)
        if self.has_bias:
            dbias += dy2.sum(axis=0)
        if conv_direct.applies(x.dtype):
            conv_direct.backward(self, x, w, dy, dw=dw, dx=dx, accumulate_dx=accumulate_dx, col=col)
            return
        dw_left = not (self.is_pointwise and self.stride == 1)
        if not dw_left:
            _add_weight_grad(dw, dy2, x.reshape(n * pixels, self.cin))
            if dx is not None and not accumulate_dx:
                xp.matmul(dy2, w2, out=dx.reshape(n * pixels, self.cin))
                dx = None
        if not dw_left and dx is None:
            return
        for first, end in self._chunks(n):
            rows = slice(first * pixels, end * pixels)
            if dw_left:
                _add_weight_grad(dw, dy2[rows], self._columns(x[first:end], col))
            if dx is not None:
                dcol = self._workspace(col, (end * pixels - first * pixels, w2.shape[1]))
                xp.matmul(dy2[rows], w2, out=dcol)
                self._add_columns(dcol, dx[first:end], accumulate=accumulate_dx)


def im2col_ref(x, kh, kw, stride, pad_top, pad_left, Ho, Wo):
    n, H, W, C = x.shape
    padded = np.zeros((n, H + kh + Ho * stride, W + kw + Wo * stride, C), x.dtype)
    padded[:, pad_top:pad_top + H, pad_left:pad_left + W] = x
    taps = [padded[:, i:i + Ho * stride:stride, j:j + Wo * stride:stride] for i in range(kh) for j in range(kw)]
    return np.stack(taps, axis=3).reshape(n * Ho * Wo, kh * kw * C)


def col2im_ref(col, x_shape, kh, kw, stride, pad_top, pad_left, Ho, Wo):
    n, H, W, C = x_shape
    padded = np.zeros((n, H + kh + Ho * stride, W + kw + Wo * stride, C), col.dtype)
    taps = col.reshape(n, Ho, Wo, kh, kw, C)
    for i in range(kh):
        for j in range(kw):
            padded[:, i:i + Ho * stride:stride, j:j + Wo * stride:stride] += taps[:, :, :, i, j]
    return padded[:, pad_top:pad_top + H, pad_left:pad_left + W]


# ----------------------------------------------------------------------------- batch norm + ReLU
#
# stats is a unit's (7, C) table: mean, sigma = sqrt(var + eps), gamma clamped, b = beta / gamma, and
# the window (shift, below, above) of channel c's k-bit code (kernels/bn.cu, minibp/quant.py) under the
# fixed and range windows; the block window's are the unit's own (blocks, 3, C) windows (_windows).
# The store is x_copy (exact mode, bits = 0) or the packed k-bit codes of v = xhat + b.
#
# The kernels' layout (kernels/bn.cu): blocks walk rows in chunks, a block's threads walk a row's groups
# (channels, or code bytes at k bits). _launch chooses the shape by device, here only.

GPU_BLOCK = 256       # threads a GPU block: a row's groups (x) times row lanes (y)
GPU_MAX_BLOCKS = 4096  # more rows than that covers: the lanes stride over them
CPU_BLOCKS = 64        # one-thread blocks the CPU's OpenMP threads share: a contiguous run of rows each
SHIFT_ROWS = 32        # rows, spread over the batch, whose mean is the statistics' shift
STATS_ROWS = 7         # a unit's statistics table: (7, C), as above
STATS_CHUNK = 2 * ROWS_PER_CHUNK  # rows a chunk of the statistics' sums; a block window's block is whole chunks
assert quant.BLOCK_ROWS % STATS_CHUNK == 0


def reduction_chunks(rows):
    """The scratch `partial` of a reduction over `rows` rows holds 2 * reduction_chunks(rows) * C values:
    the backward's two sums over chunks of ROWS_PER_CHUNK rows, or the statistics' four (two sums and
    the range windows' least and largest x) over chunks twice as long (STATS_CHUNK), their count rounded
    up to an even one so that the four fit where two do."""
    return 2 * -(-rows // STATS_CHUNK)


def _launch(rows, C, *, bits=0, rows_per_chunk=None):
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


def _chunk_sums(kernel, *, rows, C, rows_per_chunk, partial, out=None, values=2, **arguments):
    """The (2, C) sums of a reduction kernel, which writes `values` values per chunk of rows_per_chunk rows
    into partial as (values, chunks, C), two sums first, for xp to add up; and the (values, chunks, C) view."""
    chunks = -(-rows // rows_per_chunk)
    if partial.size < values * chunks * C:
        raise ValueError(f"partial holds {partial.size} values; {kernel.name} over {rows} rows of {C} channels "
                         f"needs {values * chunks * C}")
    part = partial[: values * chunks * C].reshape(values, chunks, C)
    kernel(rows=rows, C=C, partial=part, **arguments,
           **_launch(rows, C, bits=arguments.get("bits", 0), rows_per_chunk=rows_per_chunk))
    return backend.xp.sum(part[:2], axis=1, out=out), part


def _check_stats(stats, C):
    if stats.shape != (STATS_ROWS, C):  # the kernels write all its rows
        raise ValueError(f"stats must be ({STATS_ROWS}, {C}), got {stats.shape}")


def batchnorm_statistics(x, stats, *, partial, window="fixed"):
    """Batch mean and (biased) variance of x (..., C) into stats[0], stats[1]; partial is
    (>= 2 * reduction_chunks(rows) * C,) scratch. Returns the extremes a window is taken from, the least and
    largest x per channel as (2, chunks, C): the batch's (range: in stats[5:7], chunks = 1), each chunk's of
    STATS_CHUNK rows (block: in partial, read before partial is used again), or None (fixed).

    One pass over x: the sums of d = x - s and d^2, with s the mean of SHIFT_ROWS rows spread over the
    batch (other images: a shift near the mean), so that var = mean(d^2) - mean(d)^2 keeps its digits.
    """
    xp = backend.xp
    C = x.shape[-1]
    rows = x.size // C
    _check_stats(stats, C)
    extremes = check_window(window) != "fixed"
    xp.mean(x.reshape(rows, C)[:: -(-rows // SHIFT_ROWS)], axis=0, out=stats[0])
    moments, part = _chunk_sums(_k("bn.cu", x.dtype).channel_sums, rows=rows, C=C, rows_per_chunk=STATS_CHUNK,
                                partial=partial, values=4 if extremes else 2, extremes=extremes, x=x, shift=stats[0])
    if window == "range":
        xp.min(part[2], axis=0, out=stats[5])
        xp.max(part[3], axis=0, out=stats[6])
    moments /= rows  # mean(d), mean(d^2)
    stats[0] += moments[0]
    xp.maximum(moments[1] - moments[0] * moments[0], 0, out=stats[1])
    return {"fixed": None, "range": stats[5:7].reshape(2, 1, C), "block": part[2:4]}[window]


def batchnorm_coefficients(gamma, beta, stats, *, eps, bits, window="fixed", extremes=None, windows=None):
    """Turn stats[1] from the variance into sigma = sqrt(var + eps) and fill stats[2:4], gamma clamped
    to >= 1e-8 and b = beta / gamma, and at k bits the code's windows (_windows: stats[4:7] or the block
    windows), fixed or from the extremes that batchnorm_statistics returned. A kernel for the coefficients, and
    at k bits one for the windows, a thread per block and channel."""
    C = gamma.shape[0]
    _check_stats(stats, C)
    windows = _windows(stats, windows)
    blocks, per_block = windows.shape[0], quant.BLOCK_ROWS // STATS_CHUNK if window == "block" else 1
    chunks = 0 if extremes is None else extremes.shape[1]  # (2, chunks, C): a block is per_block chunks
    if check_window(window) != "fixed" and (extremes is None or extremes.shape != (2, chunks, C)
                                            or -(-chunks // per_block) != blocks):
        raise ValueError(f"the {window} window needs the extremes of {blocks} block(s) of {C} channels "
                         f"(batchnorm_statistics), got {getattr(extremes, 'shape', None)}")
    module = _k("bn.cu", gamma.dtype)
    module.batchnorm_coefficients(C=C, eps=eps, gamma=gamma, beta=beta, stats=stats, threads=C)
    if bits:
        module.code_windows(C=C, blocks=blocks, chunks=chunks, chunks_per_block=per_block, bits=bits,
                            range=window != "fixed", clip=quant.clip_of(window, bits),
                            below_weight=quant.BELOW_WEIGHT, stats=stats, extremes=extremes, windows=windows,
                            threads=blocks * C)


def _windows(stats, windows):
    """The k-bit windows as (blocks, 3, C): the one per channel in stats[4:7], or a block window's own."""
    C = stats.shape[1]
    if windows is None:
        return stats[4:7].reshape(1, 3, C)
    if windows.ndim != 3 or windows.shape[1:] != (3, C) or windows.dtype != stats.dtype:
        raise ValueError(f"windows must be (blocks, 3, {C}) {stats.dtype}, got {windows.dtype} {windows.shape}")
    return windows


def _window_args(stats, windows, rows):
    """windows and block_rows for a kernel over `rows` rows: one block, or quant.BLOCK_ROWS rows a block."""
    windows = _windows(stats, windows)
    if windows.shape[0] == 1:
        return dict(windows=windows, block_rows=max(rows, 1))
    if windows.shape[0] != quant.blocks(rows):
        raise ValueError(f"{rows} rows take {quant.blocks(rows)} block windows, got {windows.shape[0]}")
    return dict(windows=windows, block_rows=quant.BLOCK_ROWS)


def _store_args(bits, x_copy, codes):
    if bits == 0:
        return x_copy, None
    return None, codes


def batchnorm_relu_forward(x, stats, beta, a, *, bits=0, naive=False, x_copy=None, codes=None, windows=None,
                           rounding_key=None):
    """a = relu(gamma (x - mean) / sigma + beta) for x, a (..., C); writes the store when given
    (x_copy at bits = 0, codes otherwise, through the windows: _windows). naive: a is the restored a~.
    rounding_key (an int64, quant.rounding_key): the codes are rounded at random, element (r, c) by its
    draw from the key (quant.uniform_ref); None: each value to its bin's midpoint."""
    C = x.shape[-1]
    rows = x.size // C
    if naive and (bits == 0 or codes is None):
        raise ValueError("naive mode feeds the k-bit codes forward: it needs bits > 0 and a codes buffer")
    _k("bn.cu", x.dtype).batchnorm_relu_forward(rows=rows, C=C, bits=bits, naive=naive,
                                                 stochastic=rounding_key is not None, rounding_key=rounding_key or 0,
                                                 x=x, stats=stats, beta=beta, a=a, x_copy=x_copy, codes=codes,
                                                 **_window_args(stats, windows, rows), **_launch(rows, C, bits=bits))


def batchnorm_relu_restore(stats, beta, a, *, bits, x_copy=None, codes=None, windows=None):
    """a (the exact activation at bits = 0, else a~) from the unit's store."""
    x_copy, codes = _store_args(bits, x_copy, codes)
    C = a.shape[-1]
    rows = a.size // C
    _k("bn.cu", a.dtype).batchnorm_relu_restore(rows=rows, C=C, bits=bits, x_copy=x_copy, codes=codes, stats=stats,
                                                 beta=beta, a=a, **_window_args(stats, windows, rows),
                                                 **_launch(rows, C, bits=bits))


def batchnorm_relu_backward(da, stats, beta, dx, *, bits, x_copy=None, codes=None, windows=None, dgamma, dbeta,
                            partial, sums, residual_grad=None):
    """dx = dL/dx of the unit's BN + ReLU from da = dL/da and the store; dgamma, dbeta accumulate (+=).

    partial is (>= 2 * reduction_chunks(rows) * C,) scratch and sums (2, C) receives this batch's dbeta, dgamma.
    residual_grad, when given, is added to dx (the residual gradient arriving at a block's input).
    """
    x_copy, codes = _store_args(bits, x_copy, codes)
    C = da.shape[-1]
    rows = da.size // C
    module = _k("bn.cu", da.dtype)
    store = dict(bits=bits, da=da, x_copy=x_copy, codes=codes, stats=stats, beta=beta,
                 **_window_args(stats, windows, rows))
    _chunk_sums(module.batchnorm_relu_backward_sums, rows=rows, C=C, rows_per_chunk=ROWS_PER_CHUNK,
                partial=partial, out=sums, **store)
    dbeta += sums[0]
    dgamma += sums[1]
    module.batchnorm_relu_backward_dx(rows=rows, C=C, sums=sums, inv_count=1.0 / rows, residual_grad=residual_grad,
                                      dx=dx, **store, **_launch(rows, C, bits=bits))


def batchnorm_relu_forward_ref(x, gamma, beta, *, eps):
    """(a, xhat, mean, sigma) of batch-statistics BN + ReLU over x (..., C), in NumPy."""
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes)
    sigma = np.sqrt(((x - mean) ** 2).mean(axis=axes) + eps)
    xhat = (x - mean) / sigma
    y = np.maximum(gamma, GAMMA_MIN) * xhat + beta
    return np.maximum(y, 0), xhat, mean, sigma


def batchnorm_relu_backward_ref(da, xhat, mask, gamma, sigma):
    """(dx, dgamma, dbeta) from da, given xhat and the ReLU mask (docs/method.md, "What a unit keeps and its
    backward pass")."""
    axes = tuple(range(da.ndim - 1))
    dy = da * mask
    dbeta, dgamma = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
    g = dy * np.maximum(gamma, GAMMA_MIN)
    dx = (g - g.mean(axis=axes) - xhat * (g * xhat).mean(axis=axes)) / sigma
    return dx, dgamma, dbeta


# ----------------------------------------------------------------------------- pooling

class _Window:
    """A k x k window at a stride over (H, W, C), "same" (TensorFlow's) or "valid" padding, and the launch of
    the pooling kernels (kernels/pool.cu), laid out as the BN kernels: a row per pixel, shaped by _launch."""

    def __init__(self, in_shape, *, kernel, stride, padding):
        self.H, self.W, self.C = in_shape
        self.k, self.stride = int(kernel), int(stride)
        self.Ho, self.pad_top = conv_output_size(self.H, self.k, self.stride, padding)
        self.Wo, self.pad_left = conv_output_size(self.W, self.k, self.stride, padding)
        self.Cy = self.C  # output channels

    @property
    def out_shape(self):
        return (self.Ho, self.Wo, self.Cy)

    def _geometry(self, n):
        return dict(N=n, H=self.H, W=self.W, C=self.C, k=self.k, stride=self.stride, pad_top=self.pad_top,
                    pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def _kernel(self, name, images, *, backward=False, **arguments):
        """pool.cu's kernel name over images (N, H, W, C) (x or dx): a row per output (backward: input) pixel."""
        n = images.shape[0]
        rows = n * (self.H * self.W if backward else self.Ho * self.Wo)
        getattr(_k("pool.cu", images.dtype), name)(**self._geometry(n), **arguments, **_launch(rows, self.C))


class MaxPool(_Window):
    """k x k max pooling at a stride; padded taps are ignored."""

    def __init__(self, in_shape, *, kernel=3, stride=2, padding="same"):
        super().__init__(in_shape, kernel=kernel, stride=stride, padding=padding)

    def forward(self, x, y):
        self._kernel("maxpool_forward", x, x=x, y=y)

    def backward(self, x, dy, dx):
        """dx = dL/dx; reads x (the forward input) to find each window's argmax."""
        self._kernel("maxpool_backward", x, backward=True, x=x, dy=dy, dx=dx)


class AvgPool(_Window):
    """k x k average pooling at a stride ("valid"; always divides by k*k). With out_channels > C and
    accumulate=True it adds into y with the extra channels left alone: the parameter-free shortcut."""

    def __init__(self, in_shape, *, kernel=2, stride=2, padding="valid", out_channels=None):
        super().__init__(in_shape, kernel=kernel, stride=stride, padding=padding)
        self.Cy = self.C if out_channels is None else int(out_channels)
        if self.Cy < self.C:
            raise ValueError(f"average pooling cannot drop channels ({self.C} -> {self.Cy})")

    def _geometry(self, n):
        return dict(super()._geometry(n), Cy=self.Cy)

    def forward(self, x, y, *, accumulate=False):
        self._kernel("avgpool_forward", x, accumulate=accumulate, x=x, y=y)

    def backward(self, x, dy, dx):
        """dx = dL/dx (x is not read: the same signature as the other pools)."""
        self.backward_into(dy, dx)

    def backward_into(self, dy, dx, *, accumulate=False):
        self._kernel("avgpool_backward", dx, backward=True, accumulate=accumulate, dy=dy, dx=dx)


class GlobalAvgPool:
    """(N, H, W, C) -> (N, 1, 1, C), the mean over space (a reduction: through xp)."""

    def __init__(self, in_shape):
        self.H, self.W, self.C = in_shape

    @property
    def out_shape(self):
        return (1, 1, self.C)

    def forward(self, x, y):
        n = x.shape[0]
        backend.xp.mean(x.reshape(n, self.H * self.W, self.C), axis=1, out=y.reshape(n, self.C))

    def backward(self, x, dy, dx):
        n = dx.shape[0]
        dx.reshape(n, self.H * self.W, self.C)[...] = dy.reshape(n, 1, self.C) * (1.0 / (self.H * self.W))


def maxpool_backward_ref(x, dy, k, stride, pad_top, pad_left):
    """dx: each window's dy goes to its argmax, the first maximum in scan order among valid taps."""
    n, H, W, C = x.shape
    _, Ho, Wo, _ = dy.shape
    dx = np.zeros_like(x)
    for oh in range(Ho):
        for ow in range(Wo):
            h0, w0 = oh * stride - pad_top, ow * stride - pad_left
            taps = [(h, w) for h in range(h0, h0 + k) for w in range(w0, w0 + k) if 0 <= h < H and 0 <= w < W]
            values = np.stack([x[:, h, w, :] for h, w in taps])            # (taps, N, C)
            first = values.argmax(axis=0)                                  # argmax returns the first maximum
            for t, (h, w) in enumerate(taps):
                dx[:, h, w, :] += np.where(first == t, dy[:, oh, ow, :], 0)
    return dx


def pool_ref(x, k, stride, pad_top, pad_left, Ho, Wo, *, kind):
    """Max (padded taps ignored) or average (padded taps count 0, divided by k*k) pooling in NumPy."""
    n, H, W, C = x.shape
    fill = -np.inf if kind == "max" else 0.0
    padded = np.full((n, H + k + Ho * stride, W + k + Wo * stride, C), fill, x.dtype)
    padded[:, pad_top:pad_top + H, pad_left:pad_left + W] = x
    taps = np.stack([padded[:, i:i + Ho * stride:stride, j:j + Wo * stride:stride]
                     for i in range(k) for j in range(k)])
    if kind == "max":
        return taps.max(axis=0)
    return taps.sum(axis=0) * (x.dtype.type(1) / x.dtype.type(k * k))  # the kernel's rounding


class ParameterFreeShortcut:
    """The reference's shortcut where a block changes shape: average-pool by the stride and zero-pad
    the channels (the residual goes to the first C channels). Identity when the shapes agree."""

    def __init__(self, in_shape, out_shape):
        (H, W, C), (Ho, Wo, Co) = in_shape, out_shape
        if H % Ho or W % Wo or H // Ho != W // Wo or Co < C:
            raise ValueError(f"no parameter-free shortcut maps {in_shape} to {out_shape}: the spatial size must "
                             "shrink by an integer stride and the channels must not shrink (use a projection)")
        self.in_shape, self.stride = tuple(in_shape), H // Ho
        self.pool = AvgPool(in_shape, kernel=self.stride, stride=self.stride, out_channels=Co)
        self.is_identity = self.stride == 1 and Co == C

    def add(self, residual, x):
        """x += shortcut(residual)."""
        if self.is_identity:
            x += residual
        else:
            self.pool.forward(residual, x, accumulate=True)

    def backward(self, dx, dresidual):
        """dresidual = shortcut^T(dx)."""
        if self.is_identity:
            backend.xp.copyto(dresidual, dx)
        else:
            self.pool.backward_into(dx, dresidual)


# ----------------------------------------------------------------------------- loss

def softmax_cross_entropy(logits, labels):
    """(loss, accuracy) as device scalars: mean softmax cross-entropy of logits (N, K), labels (N,)."""
    xp = backend.xp
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = xp.log(xp.exp(shifted).sum(axis=1))
    loss = (log_z - shifted[xp.arange(logits.shape[0]), labels]).mean()
    accuracy = (logits.argmax(axis=1) == labels).mean()
    return loss, accuracy


def softmax_cross_entropy_backward(logits, labels, dlogits, *, scale=1.0):
    """dlogits (N, K) = scale * dL/dlogits = scale * (softmax(logits) - onehot(labels)) / N."""
    xp = backend.xp
    n = logits.shape[0]
    xp.subtract(logits, logits.max(axis=1, keepdims=True), out=dlogits)
    xp.exp(dlogits, out=dlogits)
    dlogits /= dlogits.sum(axis=1, keepdims=True)
    dlogits[xp.arange(n), labels] -= 1
    dlogits *= scale / n

