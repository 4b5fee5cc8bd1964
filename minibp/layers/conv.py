"""Conv2D: any kernel size and stride, padding "same" or "valid", NHWC, beside kernels/conv.cu.

A 1x1 conv is one GEMM of the (N*H*W, C) matrix, a k x k conv im2col + GEMM; on the CPU every float32 conv
takes conv_direct.py's kernels instead (a fast path with the same results), and on the GPU a net may run
its convs through cuDNN (conv_cudnn.py). im2col_ref and col2im_ref state the im2col kernels in NumPy.
"""
import numpy as np

from .. import backend, kernels
from . import conv_cudnn, conv_direct
from ..checks import positive_int
from .launch import output_size

CONV_PATHS = ("gemm", "cudnn")
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
        # whole numbers only: int() would make a width of 8.5 eight channels without a word
        self.kh = self.kw = positive_int(kernel, "a conv's kernel")
        self.stride, self.cout = positive_int(stride, "a conv's stride"), positive_int(channels, "a conv's channels")
        self.padding, self.has_bias = padding, bias
        self.Ho, self.pad_top = output_size(self.H, self.kh, self.stride, padding)
        self.Wo, self.pad_left = output_size(self.W, self.kw, self.stride, padding)
        self.is_pointwise = self.kh == 1 and self.pad_top == 0 and self.pad_left == 0
        self.engine = None  # a conv_cudnn.CudnnEngine when the net runs this conv through cuDNN

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
            kernels.load("conv.cu", x.dtype).im2col(**self._geometry(n), x=x, col=out, threads=rows * self.kh * self.kw)
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
            kernels.load("conv.cu", dx.dtype).col2im(**self._geometry(n), accumulate=accumulate, col=dcol, dx=dx,
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


class ConvPath:
    """Which code runs a net's convolutions, chosen once when it compiles (Net.compile(conv=...)):

        "gemm"   every Conv2D on its own path (im2col + GEMM; on the CPU the direct kernels), both devices
        "cudnn"  GPU: every conv but the classifier's through cuDNN graphs built for the compiled batch
                 (conv_cudnn.py); a forward at another batch takes the "gemm" path, with a warning

    The net asks it for the buffers its plan needs, attaches it to the convs once the arena exists, and
    shows it each forward's batch; it knows nothing else of the net."""

    def __init__(self, kind, units, *, batch, dtype):
        if kind not in CONV_PATHS:
            raise ValueError(f"conv must be one of {', '.join(map(repr, CONV_PATHS))}, got {kind!r}")
        self.kind, self.convs = kind, [c for u in units for c in u.convs()]
        # {Conv2D: its built conv_cudnn.ConvGraphs}; the classifier's conv stays on GEMM
        self.graphs = conv_cudnn.net_graphs(units, batch=batch, dtype=dtype) if kind == "cudnn" else {}

    def plan_buffers(self, plan, *, dtype):
        """Add this path's buffers to a step's plan: none for "gemm"; cuDNN's workspace and weight scratch."""
        if self.graphs:
            conv_cudnn.plan_buffers(plan, self.graphs, dtype=dtype)

    def attach(self, arena):
        """Point every conv at its engine (None: its own path) with the arena's buffers."""
        conv_cudnn.attach_engines(self.convs, self.graphs, arena)

    def check_batch(self, n):
        conv_cudnn.warn_on_other_batch(self.convs, n)
