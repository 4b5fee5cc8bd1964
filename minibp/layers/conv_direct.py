"""The CPU's fast path for float32 convolutions: kernels/conv_direct.cu, not part of the method.

DirectPath computes a Conv2D (conv.py) where a net compiles with conv="auto" (the default) or "direct" on
the CPU in float32: conv_direct and conv_weight_grad read x and dy in place (the data gradient is
conv_direct of dy, dilated by the stride, with the flipped kernel), with no im2col matrix and no BLAS.
Why not BLAS: OpenBLAS's threads spin for a while after each GEMM and take the cores from the OpenMP
kernels that run between (measured 2x slower kernels after a GEMM, 2 cores). One source serves every CPU:
its vectors are as wide as the build's CPU target (build.py: AVX-512, AVX2, SSE or NEON), and geometry()
reads the tile sizes the build chose. The results agree with the im2col path (conv.py's GemmPath) to
float32 rounding; tests/layers/test_conv.py checks both.
"""
import functools

import numpy as np

from .. import backend, build, kernels, program
from ..constants import CONV_VECTORS

GRAD_CHUNK_ELEMENTS = 1 << 18  # values of x and dy one conv_weight_grad task reads (1 MiB: it stays in L2)


class Geometry:
    """conv_direct.cu's register blocking in this build, read from the library (defined there once): floats a
    vector (lanes); a tile's pixels and a weight-gradient task's input channels, each by its vectors (1 or 2) of
    output channels."""

    def __init__(self, lanes, tile_pixels, grad_inputs):
        self.lanes, self.tile_pixels, self.grad_inputs = lanes, tile_pixels, grad_inputs

    def vectors(self, channels):
        """The vectors of output channels a tile or task holds for a conv of that many: no more than they fill."""
        return min(CONV_VECTORS, -(-channels // self.lanes))


@functools.lru_cache(maxsize=None)
def geometry():
    values = np.zeros(1 + 2 * CONV_VECTORS, np.int32)
    with program.paused():  # (asked while a pass is recorded: the answer is needed now)
        kernels.load("conv_direct.cu").conv_direct_geometry(geometry=values, grid=(1,), block=(1,))
    lanes, tile_pixels, grad_inputs = int(values[0]), values[1:1 + CONV_VECTORS], values[1 + CONV_VECTORS:]
    return Geometry(lanes, {v: int(n) for v, n in enumerate(tile_pixels, 1)},
                    {v: int(n) for v, n in enumerate(grad_inputs, 1)})


def path(dtype=np.float32):
    """The way a net compiled with conv="auto" computes convolutions on arrays of dtype here, in words (the
    benchmarks print it)."""
    if not applies(dtype):
        return f"im2col + {'cuBLAS' if backend.device == 'gpu' else 'BLAS'} GEMM"
    return f"direct, {build.cpu_target()[0]} ({geometry().lanes} floats a vector)"


def applies(dtype):
    """True when the direct kernels can compute convs on arrays of dtype here, and their gradients (any
    shape: the kernels' plain loops take what their vector ones do not)."""
    return backend.device == "cpu" and dtype == np.float32


def grad_chunks(conv, n):
    """(chunks, images a chunk) of the direct weight gradient: chunks of GRAD_CHUNK_ELEMENTS of x and dy."""
    per_image = conv.H * conv.W * conv.cin + conv.Ho * conv.Wo * conv.cout
    chunks = -(-n // max(1, GRAD_CHUNK_ELEMENTS // per_image))
    images = -(-n // chunks)
    return -(-n // images), images


def workspace_rows(conv, n):
    """Rows (of kh*kw*Cin values) of Conv2D's workspace that the weight gradient's partial sums of a pass of n
    images take on the CPU, Cout a chunk of images; 0 on the GPU."""
    return grad_chunks(conv, n)[0] * conv.cout if backend.device == "cpu" else 0


def _tasks(count):
    """A launch of count one-thread blocks (a grid-stride loop takes any beyond 2^31 - 1): the CPU shim hands
    whole blocks to its threads, so even a few tasks use every core."""
    return dict(grid=(min(count, 2**31 - 1),), block=(1,))


def _convolve(conv, x, wt, y, *, accumulate, transposed=False):
    """y = (or +=) the direct convolution of x with wt (kh, kw, in channels, out channels). transposed:
    the data gradient, x = dy and y = dx: the stride-1 convolution of dy dilated by the stride (zeros
    between its pixels) with the flipped kernel, whose padding is the rest of the window; wt is then the conv's
    own weights w (Cout, kh, kw, Cin), which the kernel reads flipped in place."""
    if transposed:
        shape = dict(H=conv.Ho, W=conv.Wo, C=conv.cout, stride=1, dilation=conv.stride,
                     pad_top=conv.kh - 1 - conv.pad_top, pad_left=conv.kw - 1 - conv.pad_left, Ho=conv.H,
                     Wo=conv.W, Cout=conv.cin)
    else:
        shape = dict(H=conv.H, W=conv.W, C=conv.cin, stride=conv.stride, dilation=1, pad_top=conv.pad_top,
                     pad_left=conv.pad_left, Ho=conv.Ho, Wo=conv.Wo, Cout=conv.cout)
    n, g = x.shape[0], geometry()
    pixels = n * shape["Ho"] * shape["Wo"]
    if conv.is_pointwise and conv.stride == 1 and pixels < 2**31:  # each pixel on its own: the batch as one row,
        shape.update(H=1, W=pixels, Ho=1, Wo=pixels)  # whose tiles are all whole but the last (an 8x8 image's
        n = 1                                          # are half empty with AVX2's 6 pixels)
    vectors = g.vectors(shape["Cout"])
    tasks = -(-n * shape["Ho"] * shape["Wo"] // g.tile_pixels[vectors])
    kernels.load("conv_direct.cu", x.dtype).conv_direct(
        N=n, kh=conv.kh, kw=conv.kw, **shape, vectors=vectors, accumulate=accumulate, flipped=transposed, x=x, wt=wt,
        y=y, **_tasks(tasks))


class DirectPath:
    """conv_direct.cu's kernels for one Conv2D (the CPU, float32): the protocol of conv.py's paths. The forward reads
    the weights as (kh*kw*Cin, Cout), copied into the conv's workspace col first (workspace_rows leaves room for
    them); the data gradient reads w itself, flipped."""

    def __init__(self, conv):
        self.conv = conv

    def forward(self, x, w, y, *, col):
        """y = conv(x), w (Cout, kh, kw, Cin)."""
        c = self.conv
        wt = c._workspace(col, (c.kh * c.kw * c.cin, c.cout))
        program.copy(wt, w.reshape(c.cout, -1).T, name="conv weights")
        _convolve(c, x, wt, y, accumulate=False)

    def backward_data(self, w, dy, dx, *, accumulate, col):
        """dx = (or += with accumulate) dL/dx: conv_direct of dy with the flipped kernel."""
        _convolve(self.conv, dy, w, dx, accumulate=accumulate, transposed=True)

    def backward_weights(self, x, dy, dw, *, accumulate, col):
        """dw = (+= with accumulate) dL/dw: conv_weight_grad's partial sums over chunks of images (in col, L2-sized
        chunks), then conv_weight_grad_finish adds them up, in order, into dw."""
        c, n = self.conv, x.shape[0]
        chunks, images = grad_chunks(c, n)
        partial = c._workspace(col, (chunks, c.kh * c.kw * c.cin, c.cout))
        g = geometry()
        vectors = g.vectors(c.cout)
        tasks = chunks * c.kh * c.kw * -(-c.cin // g.grad_inputs[vectors]) * -(-c.cout // (vectors * g.lanes))
        module = kernels.load("conv_direct.cu", x.dtype)
        module.conv_weight_grad(**c.kernel_args(n), Cout=c.cout, vectors=vectors, images_per_chunk=images, x=x, dy=dy,
                                partial=partial, **_tasks(tasks))
        module.conv_weight_grad_finish(chunks=chunks, K=c.kh * c.kw * c.cin, Cout=c.cout, accumulate=accumulate,
                                       partial=partial, dw=dw, threads=dw.size)


def conv_weight_grad_finish_ref(partial, dw):
    """dw (Cout, kh, kw, Cin) + the sum over chunks of partial (chunks, kh*kw*Cin, Cout), added in order."""
    return dw + np.cumsum(partial, axis=0, dtype=partial.dtype)[-1].T.reshape(dw.shape)
