"""The CPU's fast path for float32 convolutions: kernels/conv_direct.cu, not part of the method.

DirectPath computes a Conv2D (conv.py) where a net compiles with conv="auto" (the default) or "direct" on
the CPU in float32: conv_direct and conv_weight_grad read x and dy in place (the data gradient is
conv_direct of dy, dilated by the stride, with the flipped kernel), with no im2col matrix and no BLAS.
Why not BLAS: OpenBLAS's threads spin for a while after each GEMM and take the cores from the OpenMP
kernels that run between (measured 2x slower kernels after a GEMM, 2 cores). One source serves every CPU:
its vectors are as wide as the build's CPU target (build.py: AVX-512, AVX2, SSE or NEON), and geometry()
reads the tile sizes the build chose. The results agree with the im2col path (conv.py's GemmPath) to
float32 rounding; tests/test_conv.py checks both.
"""
import functools

import numpy as np

from .. import backend, build, kernels

GRAD_CHUNK_ELEMENTS = 1 << 18  # values of x and dy one conv_weight_grad task reads (1 MiB: it stays in L2)


class Geometry:
    """conv_direct.cu's register blocking in this build, read from the library (defined there once):
    floats a vector (lanes), a tile's pixels and most vectors of output channels, a weight-gradient
    task's input channels and vectors of output channels."""

    def __init__(self, lanes, tile_pixels, tile_vectors, grad_inputs, grad_vectors):
        self.lanes, self.tile_pixels, self.tile_vectors = lanes, tile_pixels, tile_vectors
        self.grad_inputs, self.grad_outputs = grad_inputs, grad_vectors * lanes


@functools.lru_cache(maxsize=None)
def geometry():
    values = np.zeros(5, np.int32)
    kernels.load("conv_direct.cu").conv_direct_geometry(geometry=values, grid=(1,), block=(1,))
    return Geometry(*(int(v) for v in values))


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


def workspace_rows(conv, batch):
    """Rows (of kh*kw*Cin values) of Conv2D's workspace that the weight gradient's partial sums take on the
    CPU, Cout a chunk of images; 0 on the GPU."""
    return grad_chunks(conv, batch)[0] * conv.cout if backend.device == "cpu" else 0


def _tasks(count):
    """A launch of count one-thread blocks (a grid-stride loop takes any beyond 2^31 - 1): the CPU shim hands
    whole blocks to its threads, so even a few tasks use every core."""
    return dict(grid=(min(count, 2**31 - 1),), block=(1,))


def _convolve(conv, x, wt, y, *, accumulate, transposed=False):
    """y = (or +=) the direct convolution of x with wt (kh, kw, in channels, out channels). transposed:
    the data gradient, x = dy and y = dx: the stride-1 convolution of dy dilated by the stride (zeros
    between its pixels) with the flipped kernel, whose padding is the rest of the window."""
    if transposed:
        shape = dict(H=conv.Ho, W=conv.Wo, C=conv.cout, stride=1, dilation=conv.stride,
                     pad_top=conv.kh - 1 - conv.pad_top, pad_left=conv.kw - 1 - conv.pad_left, Ho=conv.H,
                     Wo=conv.W, Cout=conv.cin)
    else:
        shape = dict(H=conv.H, W=conv.W, C=conv.cin, stride=conv.stride, dilation=1, pad_top=conv.pad_top,
                     pad_left=conv.pad_left, Ho=conv.Ho, Wo=conv.Wo, Cout=conv.cout)
    n, g = x.shape[0], geometry()
    vectors = min(g.tile_vectors, -(-shape["Cout"] // g.lanes))  # no tile wider than the output channels
    tiles = n * shape["Ho"] * -(-shape["Wo"] // g.tile_pixels) * -(-shape["Cout"] // (vectors * g.lanes))
    kernels.load("conv_direct.cu", x.dtype).conv_direct(
        N=n, kh=conv.kh, kw=conv.kw, **shape, vectors=vectors, accumulate=accumulate, x=x, wt=wt, y=y,
        **_tasks(tiles))


class DirectPath:
    """conv_direct.cu's kernels for one Conv2D (the CPU, float32): the protocol of conv.py's paths."""

    def __init__(self, conv):
        self.conv = conv

    def forward(self, x, w, y, *, col):
        """y = conv(x), w (Cout, kh, kw, Cin); no workspace."""
        c = self.conv
        _convolve(c, x, backend.xp.ascontiguousarray(w.reshape(c.cout, -1).T), y, accumulate=False)

    def backward(self, x, w, dy, *, dw, dx, accumulate_dx, col):
        """dw += dL/dw: conv_weight_grad's partial sums over chunks of images (in col, L2-sized chunks), then
        their sum; dx = (or += with accumulate_dx) dL/dx when dx is given."""
        c, n = self.conv, x.shape[0]
        chunks, images = grad_chunks(c, n)
        partial = c._workspace(col, (chunks, c.kh * c.kw * c.cin, c.cout))
        g = geometry()
        tasks = chunks * c.kh * c.kw * -(-c.cin // g.grad_inputs) * -(-c.cout // g.grad_outputs)
        kernels.load("conv_direct.cu", x.dtype).conv_weight_grad(
            **c._geometry(n), Cout=c.cout, images_per_chunk=images, x=x, dy=dy, partial=partial, **_tasks(tasks))
        dw += partial.sum(axis=0).T.reshape(dw.shape)
        if dx is not None:
            flipped = backend.xp.ascontiguousarray(w[:, ::-1, ::-1, :].transpose(1, 2, 0, 3))  # (kh, kw, Cout, Cin)
            _convolve(c, dy, flipped, dx, accumulate=accumulate_dx, transposed=True)
