"""Pooling and the parameter-free shortcut over NHWC activations, beside kernels/pool.cu.

    MaxPool, AvgPool        a size x size region at a stride, "same" (TensorFlow's) or "valid" padding
    GlobalAvgPool           the mean over space
    ParameterFreeShortcut   the reference's residual shortcut: average-pool by the stride, zero-pad channels

pool_ref and maxpool_backward_ref state the kernels in NumPy.
"""
import numpy as np

from .. import kernels, program
from .launch import launch, output_size



class Pool:
    """A size x size region at a stride over (H, W, C), "same" (TensorFlow's) or "valid" padding, and the launch
    of the pooling kernels (kernels/pool.cu), laid out as the BN kernels: a row per pixel, shaped by launch()."""

    def __init__(self, in_shape, *, kernel, stride, padding):
        self.H, self.W, self.C = in_shape
        self.size, self.stride = int(kernel), int(stride)
        self.Ho, self.pad_top = output_size(self.H, self.size, self.stride, padding)
        self.Wo, self.pad_left = output_size(self.W, self.size, self.stride, padding)
        self.Cy = self.C  # output channels

    @property
    def out_shape(self):
        return (self.Ho, self.Wo, self.Cy)

    def kernel_args(self, n):
        return dict(N=n, H=self.H, W=self.W, C=self.C, size=self.size, stride=self.stride, pad_top=self.pad_top,
                    pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def _kernel(self, name, images, *, backward=False, **arguments):
        """pool.cu's kernel name over images (N, H, W, C) (x or dx): a row per output (backward: input) pixel."""
        n = images.shape[0]
        rows = n * (self.H * self.W if backward else self.Ho * self.Wo)
        getattr(kernels.load("pool.cu", images.dtype), name)(**self.kernel_args(n), **arguments, **launch(rows, self.C))


class MaxPool(Pool):
    """size x size max pooling at a stride; padded taps are ignored."""

    def __init__(self, in_shape, *, kernel=3, stride=2, padding="same"):
        super().__init__(in_shape, kernel=kernel, stride=stride, padding=padding)

    def forward(self, x, y):
        self._kernel("maxpool_forward", x, x=x, y=y)

    def backward(self, x, dy, dx):
        """dx = dL/dx; reads x (the forward input) to find each region's argmax."""
        self._kernel("maxpool_backward", x, backward=True, x=x, dy=dy, dx=dx)


class AvgPool(Pool):
    """size x size average pooling at a stride ("valid"; always divides by size^2). With out_channels > C and
    accumulate=True it adds into y with the extra channels left alone: the parameter-free shortcut."""

    def __init__(self, in_shape, *, kernel=2, stride=2, padding="valid", out_channels=None):
        super().__init__(in_shape, kernel=kernel, stride=stride, padding=padding)
        self.Cy = self.C if out_channels is None else int(out_channels)
        if self.Cy < self.C:
            raise ValueError(f"average pooling cannot drop channels ({self.C} -> {self.Cy})")

    def kernel_args(self, n):
        return dict(super().kernel_args(n), Cy=self.Cy)

    def forward(self, x, y, *, accumulate=False):
        self._kernel("avgpool_forward", x, accumulate=accumulate, x=x, y=y)

    def backward(self, x, dy, dx):
        """dx = dL/dx (x is not read: the same signature as the other pools)."""
        self.backward_into(dy, dx)

    def backward_into(self, dy, dx, *, accumulate=False):
        self._kernel("avgpool_backward", dx, backward=True, accumulate=accumulate, dy=dy, dx=dx)


class GlobalAvgPool:
    """(N, H, W, C) -> (N, 1, 1, C), the mean over space (kernels/pool.cu: a thread per image and channel)."""

    def __init__(self, in_shape):
        self.H, self.W, self.C = in_shape

    @property
    def out_shape(self):
        return (1, 1, self.C)

    def forward(self, x, y):
        kernels.load("pool.cu", x.dtype).global_avgpool_forward(N=x.shape[0], HW=self.H * self.W, C=self.C, x=x, y=y,
                                                               threads=x.shape[0] * self.C)

    def backward(self, x, dy, dx):
        """dx = dL/dx (x is not read: the same signature as the other pools)."""
        n = dx.shape[0]
        kernels.load("pool.cu", dx.dtype).global_avgpool_backward(N=n, HW=self.H * self.W, C=self.C,
                                                                 scale=1.0 / (self.H * self.W), dy=dy, dx=dx,
                                                                 threads=dx.size)


def maxpool_backward_ref(x, dy, size, stride, pad_top, pad_left):
    """dx: each region's dy goes to its argmax, the first maximum in scan order among valid taps."""
    n, H, W, C = x.shape
    _, Ho, Wo, _ = dy.shape
    dx = np.zeros_like(x)
    for oh in range(Ho):
        for ow in range(Wo):
            h0, w0 = oh * stride - pad_top, ow * stride - pad_left
            taps = [(h, w) for h in range(h0, h0 + size) for w in range(w0, w0 + size) if 0 <= h < H and 0 <= w < W]
            values = np.stack([x[:, h, w, :] for h, w in taps])            # (taps, N, C)
            first = values.argmax(axis=0)                                  # argmax returns the first maximum
            for t, (h, w) in enumerate(taps):
                dx[:, h, w, :] += np.where(first == t, dy[:, oh, ow, :], 0)
    return dx


def pool_ref(x, size, stride, pad_top, pad_left, Ho, Wo, *, kind):
    """Max (padded taps ignored) or average (padded taps count 0, divided by size^2) pooling in NumPy."""
    n, H, W, C = x.shape
    fill = -np.inf if kind == "max" else 0.0
    padded = np.full((n, H + size + Ho * stride, W + size + Wo * stride, C), fill, x.dtype)
    padded[:, pad_top:pad_top + H, pad_left:pad_left + W] = x
    taps = np.stack([padded[:, i:i + Ho * stride:stride, j:j + Wo * stride:stride]
                     for i in range(size) for j in range(size)])
    if kind == "max":
        return taps.max(axis=0)
    return taps.sum(axis=0) * (x.dtype.type(1) / x.dtype.type(size * size))  # the kernel's rounding


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
            program.add(x, residual)
        else:
            self.pool.forward(residual, x, accumulate=True)

    def backward(self, dx, dresidual):
        """dresidual = shortcut^T(dx)."""
        if self.is_identity:
            program.copy(dresidual, dx)
        else:
            self.pool.backward_into(dx, dresidual)
