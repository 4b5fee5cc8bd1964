"""Layers with explicit forward and backward passes, on NHWC arrays, writing into given buffers.

Layers hold no activations. Each backward takes, as arguments, exactly the forward values it
reads (its input x, or the unit's store), so what must be kept is visible in one place: the unit
in net.py, which keeps a k-bit (or exact) store per unit and nothing else of size.

    Conv2D                  any kernel size and stride, padding "same" or "valid"; a 1x1 conv is one
                            GEMM of the (N*H*W, C) matrix, a k x k conv im2col + GEMM
    batchnorm_relu_*        batch-statistics BN, gamma/beta and ReLU of one unit, fused with its store
    MaxPool, AvgPool, GlobalAvgPool
    ParameterFreeShortcut   the reference's residual shortcut: average-pool by the stride, zero-pad channels
    softmax_cross_entropy   mean over the batch; loss, accuracy and dlogits

The *_ref functions are plain NumPy statements of what each kernel computes (for readers and tests).
"""

import numpy as np

from . import backend, kernels

GAMMA_MIN = 1e-8         # gamma is clamped to at least this (docs/method.md, "The unit")
ROWS_PER_CHUNK = 16      # rows a thread sums in the per-channel reductions; chunks are then summed by xp


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

class Conv2D:
    """y = conv(x, w) [+ bias]: x (N, H, W, Cin), w (Cout, kh, kw, Cin), y (N, Ho, Wo, Cout).

    Weights are (Cout, kh, kw, Cin), cuDNN's filter layout for NHWC data ("KRSC"), so the same buffer
    serves both paths; as a GEMM operand it is the (Cout, kh*kw*Cin) matrix w2, used transposed.
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

    def workspace_shape(self, batch, *, accumulate_dx=False):
        """(rows, cols) of the im2col buffer this conv needs. An unstrided 1x1 conv reads x in place and
        needs none, unless its data gradient is added into another (accumulate_dx): then the product
        goes through the workspace first."""
        if self.is_pointwise and self.stride == 1:
            return (batch * self.H * self.W, self.cin) if accumulate_dx else (0, 0)
        return (batch * self.Ho * self.Wo, self.kh * self.kw * self.cin)

    def _geometry(self, n):
        """The im2col/col2im kernels' shape arguments, by name."""
        return dict(N=n, H=self.H, W=self.W, C=self.cin, kh=self.kh, kw=self.kw, stride=self.stride,
                    pad_top=self.pad_top, pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def _columns(self, x, col):
        """The (N*Ho*Wo, kh*kw*Cin) matrix the GEMM reads: x itself, a subsampled copy, or im2col."""
        n = x.shape[0]
        rows, cols = n * self.Ho * self.Wo, self.kh * self.kw * self.cin
        if self.is_pointwise and self.stride == 1:
            return x.reshape(rows, cols)
        out = col.reshape(-1)[: rows * cols].reshape(rows, cols)
        if self.is_pointwise:  # strided 1x1: subsample
            backend.xp.copyto(out.reshape(n, self.Ho, self.Wo, self.cin), x[:, ::self.stride, ::self.stride, :])
        else:
            _k("conv.cu", x.dtype).im2col(**self._geometry(n), x=x, col=out, threads=rows * self.kh * self.kw)
        return out

    def forward(self, x, w, bias, y, *, col):
        """y (N, Ho, Wo, Cout) = conv(x (N, H, W, Cin)); col is the im2col workspace."""
        n = x.shape[0]
        if self.engine is not None and n == self.engine.batch:
            self.engine.forward(x, w, y)
            return
        y2 = y.reshape(n * self.Ho * self.Wo, self.cout)
        backend.xp.matmul(self._columns(x, col), w.reshape(self.cout, -1).T, out=y2)
        if self.has_bias:
            y2 += bias

    def backward(self, x, w, dy, *, dw, dbias=None, dx=None, accumulate_dx=False, col):
        """dw += dL/dw (and dbias); dx = dL/dx (+= with accumulate_dx) if dx is given. Reads x, the
        forward input. The weight gradient is taken first: the data gradient reuses col."""
        xp = backend.xp
        n = x.shape[0]
        if self.engine is not None and n == self.engine.batch and not accumulate_dx:
            self.engine.backward(x, w, dy, dw=dw, dx=dx)
            return
        dy2 = dy.reshape(n * self.Ho * self.Wo, self.cout)
        dw += (dy2.T @ self._columns(x, col)).reshape(dw.shape)  # (Cout, kh*kw*Cin): weight-sized
        if self.has_bias:
            dbias += dy2.sum(axis=0)
        if dx is None:
            return
        w2 = w.reshape(self.cout, -1)  # (Cout, kh*kw*Cin)
        rows = dy2.shape[0] if not (self.is_pointwise and self.stride == 1) else n * self.H * self.W
        if self.is_pointwise and self.stride == 1 and not accumulate_dx:
            xp.matmul(dy2, w2, out=dx.reshape(rows, self.cin))
            return
        dcol = col.reshape(-1)[: rows * w2.shape[1]].reshape(rows, w2.shape[1])
        xp.matmul(dy2, w2, out=dcol)
        if self.is_pointwise and self.stride == 1:
            dx += dcol.reshape(dx.shape)
        elif self.is_pointwise:  # strided 1x1: the subsampled positions get the gradient, the rest 0
            if not accumulate_dx:
                dx[...] = 0
            dx[:, ::self.stride, ::self.stride, :] += dcol.reshape(n, self.Ho, self.Wo, self.cin)
        else:
            _k("conv.cu", x.dtype).col2im(**self._geometry(n), accumulate=accumulate_dx, col=dcol, dx=dx,
                                          threads=n * self.H * self.W)


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
# stats is a unit's (5, C) table: mean, sigma = sqrt(var + eps), gamma clamped, b = beta / gamma, and
# the shift of channel c's k-bit code (kernels/bn.cu).
# The store is x_copy (exact mode, bits = 0) or the packed k-bit codes of v = xhat + b.

def reduction_chunks(rows):
    return -(-rows // ROWS_PER_CHUNK)


def batchnorm_statistics(x, stats, *, partial):
    """Batch mean and (biased) variance of x (..., C) into stats[0], stats[1]; partial is (>= chunks*C,) scratch.

    Two passes over x (sum, then squared deviations) so the variance has no cancellation.
    """
    xp = backend.xp
    C = x.shape[-1]
    rows = x.size // C
    chunks = reduction_chunks(rows)
    part = partial[: chunks * C]
    sums = _k("bn.cu", x.dtype).channel_sums
    sums(rows=rows, C=C, rows_per_chunk=ROWS_PER_CHUNK, x=x, center=None, partial=part, threads=chunks)
    xp.sum(part.reshape(chunks, C), axis=0, out=stats[0])
    stats[0] /= rows
    sums(rows=rows, C=C, rows_per_chunk=ROWS_PER_CHUNK, x=x, center=stats[0], partial=part, threads=chunks)
    xp.sum(part.reshape(chunks, C), axis=0, out=stats[1])
    stats[1] /= rows


def batchnorm_coefficients(gamma, beta, stats, *, eps, bits):
    """Turn stats[1] from the variance into sigma = sqrt(var + eps) and fill stats[2:5]: gamma clamped
    to >= 1e-8, b = beta / gamma, and the k-bit code's shift per channel (0 when bits = 0). One kernel."""
    C = gamma.shape[0]
    _k("bn.cu", gamma.dtype).batchnorm_coefficients(C=C, bits=bits, eps=eps, gamma=gamma, beta=beta, stats=stats,
                                                     threads=C)


def _store_args(bits, x_copy, codes):
    if bits == 0:
        return x_copy, None
    return None, codes


def batchnorm_relu_forward(x, stats, beta, a, *, bits=0, naive=False, x_copy=None, codes=None):
    """a = relu(gamma (x - mean) / sigma + beta) for x, a (..., C); writes the store when given
    (x_copy at bits = 0, codes otherwise). naive: a is the restored a~ (the ablation)."""
    C = x.shape[-1]
    rows = x.size // C
    if naive and (bits == 0 or codes is None):
        raise ValueError("naive mode feeds the k-bit codes forward: it needs bits > 0 and a codes buffer")
    _k("bn.cu", x.dtype).batchnorm_relu_forward(rows=rows, C=C, bits=bits, naive=naive, x=x, stats=stats, beta=beta,
                                                 a=a, x_copy=x_copy, codes=codes, threads=rows)


def batchnorm_relu_restore(stats, beta, a, *, bits, x_copy=None, codes=None):
    """a (the exact activation at bits = 0, else a~) from the unit's store."""
    x_copy, codes = _store_args(bits, x_copy, codes)
    rows = a.size // a.shape[-1]
    _k("bn.cu", a.dtype).batchnorm_relu_restore(rows=rows, C=a.shape[-1], bits=bits, x_copy=x_copy, codes=codes,
                                                 stats=stats, beta=beta, a=a, threads=rows)


def batchnorm_relu_backward(da, stats, beta, dx, *, bits, x_copy=None, codes=None, dgamma, dbeta, partial,
                            sums, residual_grad=None):
    """dx = dL/dx of the unit's BN + ReLU from da = dL/da and the store; dgamma, dbeta accumulate (+=).

    partial is (>= 2*chunks*C,) scratch and sums (2, C) receives this batch's dbeta, dgamma.
    residual_grad, when given, is added to dx (the residual gradient arriving at a block's input).
    """
    xp = backend.xp
    x_copy, codes = _store_args(bits, x_copy, codes)
    C = da.shape[-1]
    rows = da.size // C
    chunks = reduction_chunks(rows)
    part = partial[: 2 * chunks * C]
    module = _k("bn.cu", da.dtype)
    store = dict(bits=bits, x_copy=x_copy, codes=codes, stats=stats, beta=beta)
    module.batchnorm_relu_backward_sums(rows=rows, C=C, rows_per_chunk=ROWS_PER_CHUNK, da=da, partial=part, **store,
                                        threads=chunks)
    xp.sum(part.reshape(2, chunks, C), axis=1, out=sums)
    dbeta += sums[0]
    dgamma += sums[1]
    module.batchnorm_relu_backward_dx(rows=rows, C=C, da=da, sums=sums, inv_count=1.0 / rows,
                                      residual_grad=residual_grad, dx=dx, **store, threads=rows)


def batchnorm_relu_forward_ref(x, gamma, beta, *, eps):
    """(a, xhat, mean, sigma) of batch-statistics BN + ReLU over x (..., C), in NumPy."""
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes)
    sigma = np.sqrt(((x - mean) ** 2).mean(axis=axes) + eps)
    xhat = (x - mean) / sigma
    y = np.maximum(gamma, GAMMA_MIN) * xhat + beta
    return np.maximum(y, 0), xhat, mean, sigma


def batchnorm_relu_backward_ref(da, xhat, mask, gamma, sigma):
    """(dx, dgamma, dbeta) from da, given xhat and the ReLU mask (docs/method.md, "What a unit keeps and its backward pass")."""
    axes = tuple(range(da.ndim - 1))
    dy = da * mask
    dbeta, dgamma = dy.sum(axis=axes), (dy * xhat).sum(axis=axes)
    g = dy * np.maximum(gamma, GAMMA_MIN)
    dx = (g - g.mean(axis=axes) - xhat * (g * xhat).mean(axis=axes)) / sigma
    return dx, dgamma, dbeta


# ----------------------------------------------------------------------------- pooling

class MaxPool:
    """k x k max pooling at a stride, "same" (TensorFlow's) or "valid" padding; padded taps are ignored."""

    def __init__(self, in_shape, *, kernel=3, stride=2, padding="same"):
        self.H, self.W, self.C = in_shape
        self.k, self.stride = int(kernel), int(stride)
        self.Ho, self.pad_top = conv_output_size(self.H, self.k, self.stride, padding)
        self.Wo, self.pad_left = conv_output_size(self.W, self.k, self.stride, padding)

    @property
    def out_shape(self):
        return (self.Ho, self.Wo, self.C)

    def _geometry(self, n):
        return dict(N=n, H=self.H, W=self.W, C=self.C, k=self.k, stride=self.stride, pad_top=self.pad_top,
                    pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo)

    def forward(self, x, y):
        n = x.shape[0]
        _k("pool.cu", x.dtype).maxpool_forward(**self._geometry(n), x=x, y=y, threads=n * self.Ho * self.Wo)

    def backward(self, x, dy, dx):
        """dx = dL/dx; reads x (the forward input) to find each window's argmax."""
        _k("pool.cu", x.dtype).maxpool_backward(**self._geometry(x.shape[0]), x=x, dy=dy, dx=dx,
                                                threads=x.size // self.C)


class AvgPool:
    """k x k average pooling at a stride ("valid"; always divides by k*k). With out_channels > C and
    accumulate=True it adds into y with the extra channels left alone: the parameter-free shortcut."""

    def __init__(self, in_shape, *, kernel=2, stride=2, padding="valid", out_channels=None):
        self.H, self.W, self.C = in_shape
        self.k, self.stride = int(kernel), int(stride)
        self.Ho, self.pad_top = conv_output_size(self.H, self.k, self.stride, padding)
        self.Wo, self.pad_left = conv_output_size(self.W, self.k, self.stride, padding)
        self.Cy = self.C if out_channels is None else int(out_channels)
        if self.Cy < self.C:
            raise ValueError(f"average pooling cannot drop channels ({self.C} -> {self.Cy})")

    @property
    def out_shape(self):
        return (self.Ho, self.Wo, self.Cy)

    def _geometry(self, n):
        return dict(N=n, H=self.H, W=self.W, C=self.C, k=self.k, stride=self.stride, pad_top=self.pad_top,
                    pad_left=self.pad_left, Ho=self.Ho, Wo=self.Wo, Cy=self.Cy)

    def forward(self, x, y, *, accumulate=False):
        n = x.shape[0]
        _k("pool.cu", x.dtype).avgpool_forward(**self._geometry(n), accumulate=accumulate, x=x, y=y,
                                               threads=n * self.Ho * self.Wo)

    def backward(self, x, dy, dx):
        """dx = dL/dx (x is not read: the same signature as the other pools)."""
        self.backward_into(dy, dx)

    def backward_into(self, dy, dx, *, accumulate=False):
        _k("pool.cu", dy.dtype).avgpool_backward(**self._geometry(dx.shape[0]), accumulate=accumulate, dy=dy, dx=dx,
                                                 threads=dx.size // self.C)


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

def check_labels(labels, n, classes):
    """Labels must be an array of n integers in [0, classes)."""
    if not hasattr(labels, "dtype") or not hasattr(labels, "shape"):
        raise TypeError(f"labels must be an integer array of shape ({n},), got {type(labels).__name__}")
    if labels.shape != (n,) or labels.dtype.kind not in "iu":
        raise ValueError(f"labels must be {n} integers (shape ({n},)), got {labels.dtype} of shape {labels.shape}")
    if n and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise ValueError(f"labels must lie in [0, {classes}), got values from {int(labels.min())} to "
                         f"{int(labels.max())}")


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

