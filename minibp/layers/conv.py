"""Conv2D: any kernel size and stride, padding "same" or "valid", NHWC, beside kernels/conv.cu.

A conv computes through the path object it holds, one of three, which a net chooses for each conv once,
when it compiles (Net.compile(conv=...), ConvPath below):

    GemmPath      here: a 1x1 conv is one GEMM of the (N*H*W, C) matrix, a k x k conv im2col + GEMM (any
                  device, any dtype: the reference path, and a Conv2D's own until a net chooses)
    DirectPath    conv_direct.py: the CPU's float32 kernels, a fast path with the same results
    CudnnPath     conv_cudnn.py: cuDNN graphs on the GPU

Each keeps one protocol, without the bias (Conv2D adds it, whatever the path):

    path.forward(x, w, y, *, col)                                 y = conv(x, w)
    path.backward_data(w, dy, dx, *, accumulate, col)             dx = (+= with accumulate) dL/dx
    path.backward_weights(x, dy, dw, *, accumulate, col)          dw = (+= with accumulate) dL/dw

Every device call goes through program.issue (kernels, blas.gemm, program's array operations), so a
recorded pass holds a conv's calls bound.

col is the conv's workspace, planned by Conv2D.workspace_shape for whichever path runs on the device
(Net.plan has no path to ask: a plan's sizes do not depend on it); a path's net-wide buffers (cuDNN's)
come from ConvPath.plan_buffers. im2col_ref and col2im_ref state the im2col kernels in NumPy.
"""
import warnings

import numpy as np

from .. import backend, blas, kernels, program
from . import conv_cudnn, conv_direct
from ..checks import positive_int
from .launch import output_size

CONV_PATHS = ("auto", "gemm", "direct", "cudnn", "cudnn-tf32")
# The names of the device calls a conv issues, whatever its path (bench/speed.py times them)
CONV_CALLS = ("gemm", "im2col", "col2im", "subsample", "bias_grad", "conv_direct", "conv weights", "conv_weight_grad",
              "conv_weight_grad_finish", "cudnn fprop", "cudnn dgrad", "cudnn wgrad")
COL_ELEMENTS = 1 << 20         # CPU: values a chunk of the im2col matrix holds (4 MiB of float32, cache-sized)


class Conv2D:
    """y = conv(x, w) [+ bias]: x (N, H, W, Cin), w (Cout, kh, kw, Cin), y (N, Ho, Wo, Cout).

    Weights are (Cout, kh, kw, Cin), cuDNN's filter layout for NHWC data ("KRSC"), so the same buffer
    serves every path; as a GEMM operand it is the (Cout, kh*kw*Cin) matrix w2, used transposed.
    self.path computes it (GemmPath until use() gives it another: the module docstring lists them).
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
        self.path = GemmPath(self)

    def use(self, path):
        """Compute through path from now on (a net's ConvPath gives each conv its own when it compiles)."""
        self.path = path
        return self

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

    def workspace_shape(self, n, *, accumulate_dx=False):
        """(rows, cols) of the workspace col this conv needs for a pass of n images on either path of the device:
        one chunk of the im2col matrix and, on the CPU, the direct path's (conv_direct.workspace_rows). An
        unstrided 1x1 conv reads x in place and needs no im2col chunk, unless its data gradient is added into
        another (accumulate_dx) on the GEMM path: then the product goes through the workspace first."""
        im2col = not (self.is_pointwise and self.stride == 1) or accumulate_dx
        rows = max(self._images_per_chunk(n) * self.Ho * self.Wo if im2col else 0,
                   conv_direct.workspace_rows(self, n))
        return (rows, self.kh * self.kw * self.cin) if rows else (0, 0)

    def _workspace(self, col, shape):
        """The first prod(shape) values of col, as that shape."""
        size = int(np.prod(shape))
        if col is None or col.size < size:
            raise ValueError(f"the conv workspace col holds {0 if col is None else col.size} values, this "
                             f"{self.kh}x{self.kw} conv needs {size}: size it by workspace_shape(n)")
        return col.reshape(-1)[:size].reshape(shape)

    def kernel_args(self, n):
        """The shape arguments of the im2col/col2im (and conv_weight_grad) kernels, by name."""
        return dict(N=n, H=self.H, W=self.W, C=self.cin, kh=self.kh, kw=self.kw, stride=self.stride,
                    pad_top=self.pad_top, pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def forward(self, x, w, bias, y, *, col):
        """y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin)) [+ bias]; col is the workspace (workspace_shape)."""
        self.path.forward(x, w, y, col=col)
        if self.has_bias:
            program.add(y.reshape(-1, self.cout), bias)

    def backward(self, x, w, dy, *, dw, dbias=None, dx=None, accumulate_dx=False, col):
        """Both gradients: dx = dL/dx (+= with accumulate_dx) if dx is given, then dw += dL/dw (and dbias)."""
        if dx is not None:
            self.backward_data(w, dy, dx, accumulate=accumulate_dx, col=col)
        self.backward_weights(x, dy, dw=dw, dbias=dbias, col=col)

    def backward_data(self, w, dy, dx, *, accumulate=False, col):
        """dx = dL/dx (+= with accumulate) from dy = dL/dy."""
        self.path.backward_data(w, dy, dx, accumulate=accumulate, col=col)

    def backward_weights(self, x, dy, *, dw, dbias=None, accumulate=True, col):
        """dw += dL/dw (and dbias += dL/dbias), from x, the forward input, and dy; accumulate=False: dw = (and
        dbias =) them, a step's first sub-batch's, which needs no zeroed gradients before it."""
        if self.has_bias:
            rows = dy.size // self.cout
            kernels.load("conv.cu", dy.dtype).bias_grad(rows=rows, C=self.cout, accumulate=accumulate, dy=dy,
                                                        dbias=dbias, threads=self.cout)
        self.path.backward_weights(x, dy, dw, accumulate=accumulate, col=col)


class GemmPath:
    """im2col + GEMM for one Conv2D, any device and dtype. An unstrided 1x1 conv is one GEMM of x itself;
    the rest go through the workspace a chunk of images at a time: the whole pass on the GPU (one GEMM, as
    cuBLAS likes it), COL_ELEMENTS on the CPU; col2im takes the data gradient. cublas: the net's binding on the
    GPU (blas.Cublas, with the arena's workspace: ConvPath.attach gives it), else None."""

    def __init__(self, conv, *, cublas=None):
        self.conv, self.cublas = conv, cublas

    def _columns(self, x, col):
        """The (n*Ho*Wo, kh*kw*Cin) matrix the GEMM reads for the n images of x: x itself, a subsampled
        copy, or im2col."""
        c, n = self.conv, x.shape[0]
        rows, cols = n * c.Ho * c.Wo, c.kh * c.kw * c.cin
        if c.is_pointwise and c.stride == 1:
            return x.reshape(rows, cols)
        out = c._workspace(col, (rows, cols))
        if c.is_pointwise:  # strided 1x1: subsample
            program.copy(out.reshape(n, c.Ho, c.Wo, c.cin), x[:, ::c.stride, ::c.stride, :], name="subsample")
        else:
            kernels.load("conv.cu", x.dtype).im2col(**c.kernel_args(n), x=x, col=out, threads=rows * c.kh * c.kw)
        return out

    def _add_columns(self, dcol, dx, *, accumulate):
        """dx = (or += with accumulate) the adjoint of _columns applied to dcol, for the images of dx."""
        c, n = self.conv, dx.shape[0]
        if c.is_pointwise and c.stride == 1:
            (program.add if accumulate else program.copy)(dx, dcol.reshape(dx.shape))
        elif c.is_pointwise:  # strided 1x1: the subsampled positions get the gradient, the rest 0
            if not accumulate:
                program.fill(dx, 0)
            program.add(dx[:, ::c.stride, ::c.stride, :], dcol.reshape(n, c.Ho, c.Wo, c.cin))
        else:
            kernels.load("conv.cu", dx.dtype).col2im(**c.kernel_args(n), accumulate=accumulate, col=dcol, dx=dx,
                                                     threads=n * c.H * c.W)

    def _chunks(self, n, *, columns=True):
        """(first, end) images of each chunk the workspace holds; columns: of _columns, which an unstrided 1x1
        conv reads in place, all n at once."""
        c = self.conv
        step = n if columns and c.is_pointwise and c.stride == 1 else c._images_per_chunk(n)
        return [(first, min(n, first + step)) for first in range(0, n, step)]

    def forward(self, x, w, y, *, col):
        c, n = self.conv, x.shape[0]
        pixels, w2 = c.Ho * c.Wo, w.reshape(c.cout, -1)  # (Cout, kh*kw*Cin)
        y2 = y.reshape(n * pixels, c.cout)
        for first, end in self._chunks(n):
            blas.gemm(self._columns(x[first:end], col), w2, y2[first * pixels:end * pixels], trans_b=True,
                      cublas=self.cublas)

    def backward_data(self, w, dy, dx, *, accumulate, col):
        """The data gradient: an unstrided 1x1 conv's is one GEMM into dx (unless added in); the rest go through
        the workspace, a chunk of images at a time, and col2im."""
        c, n = self.conv, dy.shape[0]
        pixels, w2 = c.Ho * c.Wo, w.reshape(c.cout, -1)
        dy2 = dy.reshape(n * pixels, c.cout)
        if c.is_pointwise and c.stride == 1 and not accumulate:
            blas.gemm(dy2, w2, dx.reshape(n * pixels, c.cin), cublas=self.cublas)
            return
        for first, end in self._chunks(n, columns=False):
            dcol = c._workspace(col, ((end - first) * pixels, w2.shape[1]))
            blas.gemm(dy2[first * pixels:end * pixels], w2, dcol, cublas=self.cublas)
            self._add_columns(dcol, dx[first:end], accumulate=accumulate)

    def backward_weights(self, x, dy, dw, *, accumulate, col):
        """dw (Cout, kh*kw*Cin) = (or += with accumulate) dy^T @ columns, added in the GEMM (beta = 1), a chunk of
        images at a time."""
        c, n = self.conv, x.shape[0]
        pixels = c.Ho * c.Wo
        dy2, dw2 = dy.reshape(n * pixels, c.cout), dw.reshape(c.cout, -1)
        for i, (first, end) in enumerate(self._chunks(n)):
            blas.gemm(dy2[first * pixels:end * pixels], self._columns(x[first:end], col), dw2, trans_a=True,
                      accumulate=accumulate or i > 0, cublas=self.cublas)


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
    """Which path runs each of a net's convolutions, chosen once when it compiles (Net.compile(conv=...)):

        "auto"        the default: DirectPath where conv_direct.applies (the CPU, float32), else GemmPath
        "gemm"        GemmPath for every conv, both devices
        "direct"      DirectPath for every conv: the CPU in float32 only (the kernels take every shape), a
                      ValueError elsewhere
        "cudnn"       GPU: CudnnPath for every conv but the classifier's, through graphs built for the compiled
                      pass_images, float32 plans only (conv_cudnn.py); the classifier, a pass of another size
                      (with a warning) and a data gradient added into another take "auto"'s path
        "cudnn-tf32"  "cudnn" with TF32 plans allowed: faster, and 10-bit mantissas in the convolutions

    The net asks it for the buffers its plan needs, has it give each conv its path once the arena exists,
    and shows it each pass's images; it knows nothing else of the net. On the GPU the GEMM paths compute
    through one cuBLAS binding of the net's (blas.Cublas), whose workspace the plan holds."""

    def __init__(self, kind, units, *, pass_images, dtype):
        if kind not in CONV_PATHS:
            raise ValueError(f"conv must be one of {', '.join(map(repr, CONV_PATHS))}, got {kind!r}")
        direct = conv_direct.applies(dtype)
        if kind == "direct" and not direct:
            raise ValueError(f"conv='direct' runs on the CPU in float32 only, not on the {backend.device} in "
                             f"{np.dtype(dtype).name}: use conv='auto' or 'gemm'")
        self.own = conv_direct.DirectPath if direct and kind != "gemm" else GemmPath
        self.kind, self.pass_images = kind, pass_images
        self.convs = [c for u in units for c in u.convs()]
        # {Conv2D: its built conv_cudnn.ConvGraphs}; the classifier's conv keeps its own path
        self.graphs = conv_cudnn.net_graphs(units, pass_images=pass_images, dtype=dtype, tf32=kind == "cudnn-tf32") \
            if kind.startswith("cudnn") else {}

    def plan_buffers(self, plan, *, dtype):
        """Add this path's buffers to a step's plan: cuBLAS's workspace on the GPU, cuDNN's workspace and weight
        scratch."""
        if backend.device == "gpu":
            plan.add("cublas_workspace", (blas.WORKSPACE_BYTES,), np.uint8, "workspace")
        if self.graphs:
            conv_cudnn.plan_buffers(plan, self.graphs, dtype=dtype)

    def attach(self, arena):
        """Give every conv its path, the cuDNN ones with the arena's buffers, the GEMM ones the net's cuBLAS."""
        cublas = blas.Cublas.loaded(workspace=arena["cublas_workspace"]) if backend.device == "gpu" else None
        for conv in self.convs:
            path = self.own(conv) if self.own is not GemmPath else GemmPath(conv, cublas=cublas)
            if conv in self.graphs:
                path = conv_cudnn.CudnnPath(self.graphs[conv], fallback=path, workspace=arena["cudnn_workspace"],
                                            dw_scratch=arena["cudnn_dw"])
            conv.use(path)

    def check_pass(self, n):
        """Warn that a pass of n images other than the compiled pass_images runs without cuDNN (the graphs are
        built for one size); Python shows it once."""
        if self.graphs and n != self.pass_images:
            warnings.warn(f"the cuDNN plans are built for passes of {self.pass_images} images: a pass of {n} runs "
                          "through GEMM")
