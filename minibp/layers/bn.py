"""Batch norm + ReLU of one unit, fused with writing and reading its activation store, beside kernels/bn.cu.

    BatchNormReLU            the layer a unit holds: its statistics, its store and windows, one call a pass
    StoreView                a unit's store at one batch size: the buffers the kernels read and write
    batchnorm_statistics     the kernels' wrappers, one per pass, on arrays the caller gives (tests call them)
    batchnorm_coefficients
    batchnorm_relu_forward / _restore / _backward
    batchnorm_relu_*_ref     the same in plain NumPy

"""
from dataclasses import dataclass, fields

import numpy as np

from .. import backend, kernels, quant
from ..constants import GAMMA_MIN  # gamma is clamped to at least this (docs/method.md, "The unit")
from ..params import Own, elements
from ..quant import check_window
from .launch import launch

ROWS_PER_CHUNK = 16      # rows a reduction sums in order into one row of partial sums, which xp adds up

# stats is a unit's (4, C) statistics: mean, sigma = sqrt(var + eps), gamma clamped, b = beta / gamma
# (kernels/bn.cu). The store is x_copy (exact mode, bits = 0) or the packed k-bit codes of v = xhat + b
# through the unit's windows (blocks, 3, C): the window (shift, below, above) of each channel's codes
# (minibp/quant.py), one block under the fixed and range windows, a block of quant.BLOCK_ROWS rows each
# under the block window.
#
# The kernels' layout (kernels/bn.cu): launch.py.

SHIFT_ROWS = 32        # rows, spread over the batch, whose mean is the statistics' shift
STATS_ROWS = 4         # a unit's statistics: (4, C), as above (bn_walk.cuh's STATS_ROWS)
STATS_CHUNK = 2 * ROWS_PER_CHUNK  # rows a chunk of the statistics' sums; a block window's block is whole chunks
assert quant.BLOCK_ROWS % STATS_CHUNK == 0


def reduction_chunks(rows):
    """The scratch `partial` of a reduction over `rows` rows holds 2 * reduction_chunks(rows) * C values:
    the backward's two sums over chunks of ROWS_PER_CHUNK rows, or the statistics' four (two sums and
    the range windows' least and largest x) over chunks twice as long (STATS_CHUNK), their count rounded
    up to an even one so that the four fit where two do."""
    return 2 * -(-rows // STATS_CHUNK)


def _chunk_sums(kernel, *, rows, C, rows_per_chunk, partial, out=None, values=2, **arguments):
    """The (2, C) sums of a reduction kernel, which writes `values` values per chunk of rows_per_chunk rows
    into partial as (values, chunks, C), two sums first, for xp to add up; and the (values, chunks, C) view."""
    chunks = -(-rows // rows_per_chunk)
    if partial.size < values * chunks * C:
        raise ValueError(f"partial holds {partial.size} values; {kernel.name} over {rows} rows of {C} channels "
                         f"needs {values * chunks * C}")
    part = partial[: values * chunks * C].reshape(values, chunks, C)
    kernel(rows=rows, C=C, partial=part, **arguments,
           **launch(rows, C, bits=arguments.get("bits", 0), rows_per_chunk=rows_per_chunk))
    return backend.xp.sum(part[:2], axis=1, out=out), part


def _check_stats(stats, C):
    if stats.shape != (STATS_ROWS, C):  # the kernels write all its rows
        raise ValueError(f"stats must be ({STATS_ROWS}, {C}), got {stats.shape}")


def batchnorm_statistics(x, stats, *, partial, window="fixed"):
    """Batch mean and (biased) variance of x (..., C) into stats[0], stats[1]; partial is
    (>= 2 * reduction_chunks(rows) * C,) scratch. Returns the extremes a window is taken from, the least and
    largest x per channel of each chunk of STATS_CHUNK rows as (2, chunks, C), a view of partial to be read
    before partial is used again (range and block), or None (fixed).

    One pass over x: the sums of d = x - s and d^2, with s the mean of SHIFT_ROWS rows spread over the
    batch (other images: a shift near the mean), so that var = mean(d^2) - mean(d)^2 keeps its digits.
    """
    xp = backend.xp
    C = x.shape[-1]
    rows = x.size // C
    _check_stats(stats, C)
    extremes = check_window(window) != "fixed"
    xp.mean(x.reshape(rows, C)[:: -(-rows // SHIFT_ROWS)], axis=0, out=stats[0])
    moments, part = _chunk_sums(kernels.load("bn.cu", x.dtype).channel_sums, rows=rows, C=C, rows_per_chunk=STATS_CHUNK,
                                partial=partial, values=4 if extremes else 2, extremes=extremes, x=x, shift=stats[0])
    moments /= rows  # mean(d), mean(d^2)
    stats[0] += moments[0]
    xp.maximum(moments[1] - moments[0] * moments[0], 0, out=stats[1])
    return part[2:4] if extremes else None


def batchnorm_coefficients(gamma, beta, stats, *, eps, bits, window="fixed", extremes=None, windows=None,
                           stochastic=False, clip=None):
    """Turn stats[1] from the variance into sigma = sqrt(var + eps) and fill stats[2:4], gamma clamped
    to >= 1e-8 and b = beta / gamma, and at k bits the code's windows (blocks, 3, C), fixed or from the
    extremes that batchnorm_statistics returned: the range window's one block spans all their chunks, the
    block window's each quant.BLOCK_ROWS rows of them (stochastic: windows for levels on the bins' edges,
    quant.window_ref). clip: the range or block window's, in standard deviations (None: quant.clip_of's). A
    kernel for the coefficients, and at k bits one for the windows, a thread per block and channel."""
    C = gamma.shape[0]
    _check_stats(stats, C)
    module = kernels.load("bn.cu", gamma.dtype)
    if bits:
        windows = _windows(stats, windows)
        chunks = 0 if extremes is None else extremes.shape[1]  # (2, chunks, C): a block is per_block chunks
        per_block = quant.BLOCK_ROWS // STATS_CHUNK if window == "block" else max(chunks, 1)
        blocks = windows.shape[0]
        if check_window(window) != "fixed" and (extremes is None or extremes.shape != (2, chunks, C)
                                                or -(-chunks // per_block) != blocks):
            raise ValueError(f"the {window} window needs the extremes of {blocks} block(s) of {C} channels "
                             f"(batchnorm_statistics), got {getattr(extremes, 'shape', None)}")
    module.batchnorm_coefficients(C=C, eps=eps, gamma=gamma, beta=beta, stats=stats, threads=C)
    if bits:
        module.code_windows(C=C, blocks=blocks, chunks=chunks, chunks_per_block=per_block, bits=bits,
                            range=window != "fixed", clip=quant.clip_of(window, bits) if clip is None else clip,
                            below_weight=quant.BELOW_WEIGHT, stochastic=stochastic, stats=stats, extremes=extremes,
                            windows=windows, threads=blocks * C)


def _windows(stats, windows):
    """The k-bit windows (blocks, 3, C), checked against the stats (4, C) they go with."""
    C = stats.shape[1]
    if windows is None:
        raise ValueError(f"a k-bit store codes through its windows: give windows (blocks, 3, {C})")
    if windows.ndim != 3 or windows.shape[1:] != (3, C) or windows.dtype != stats.dtype:
        raise ValueError(f"windows must be (blocks, 3, {C}) {stats.dtype}, got {windows.dtype} {windows.shape}")
    return windows


def _window_args(stats, windows, rows):
    """windows and block_rows for a kernel over `rows` rows: one block, or quant.BLOCK_ROWS rows a block;
    none in exact mode (its kernels read no window)."""
    if windows is None:
        return dict(windows=None, block_rows=max(rows, 1))
    windows = _windows(stats, windows)
    if windows.shape[0] == 1:
        return dict(windows=windows, block_rows=max(rows, 1))
    if windows.shape[0] != quant.blocks(rows):
        raise ValueError(f"{rows} rows take {quant.blocks(rows)} block windows, got {windows.shape[0]}")
    return dict(windows=windows, block_rows=quant.BLOCK_ROWS)


def batchnorm_relu_forward(x, stats, beta, a, *, bits=0, naive=False, x_copy=None, codes=None, windows=None,
                           stochastic=False, rounding_key=None):
    """a = relu(gamma (x - mean) / sigma + beta) for x, a (..., C); writes the store when given
    (x_copy at bits = 0, codes otherwise, through the windows: _windows). naive: a is the restored a~.
    stochastic: the codes are rounded at random to the levels on the bins' edges, element (r, c) by its draw
    from rounding_key (an int64, quant.rounding_key; quant.uniform_ref); else each value to its bin's midpoint."""
    C = x.shape[-1]
    rows = x.size // C
    if naive and (bits == 0 or codes is None):
        raise ValueError("naive mode feeds the k-bit codes forward: it needs bits > 0 and a codes buffer")
    if stochastic != (rounding_key is not None):
        raise ValueError("stochastic rounding draws from its rounding_key: give both or neither")
    kernels.load("bn.cu", x.dtype).batchnorm_relu_forward(rows=rows, C=C, bits=bits, naive=naive,
                                                 stochastic=stochastic, rounding_key=rounding_key or 0,
                                                 x=x, stats=stats, beta=beta, a=a, x_copy=x_copy, codes=codes,
                                                 **_window_args(stats, windows, rows), **launch(rows, C, bits=bits))


def batchnorm_relu_restore(stats, beta, a, *, bits, x_copy=None, codes=None, windows=None, stochastic=False):
    """a (the exact activation at bits = 0, else a~) from the unit's store (stochastic: its levels are the
    bins' edges)."""
    C = a.shape[-1]
    rows = a.size // C
    kernels.load("bn.cu", a.dtype).batchnorm_relu_restore(rows=rows, C=C, bits=bits, x_copy=x_copy, codes=codes, stats=stats,
                                                 beta=beta, a=a, stochastic=stochastic, **_window_args(stats, windows, rows),
                                                 **launch(rows, C, bits=bits))


def batchnorm_relu_backward(da, stats, beta, dx, *, bits, x_copy=None, codes=None, windows=None, stochastic=False,
                            dgamma, dbeta, partial, sums, residual_grad=None):
    """dx = dL/dx of the unit's BN + ReLU from da = dL/da and the store (stochastic: its levels are the bins'
    edges); dgamma, dbeta accumulate (+=).

    partial is (>= 2 * reduction_chunks(rows) * C,) scratch and sums (2, C) receives this batch's dbeta, dgamma.
    residual_grad, when given, is added to dx (the residual gradient arriving at a block's input).
    """
    C = da.shape[-1]
    rows = da.size // C
    module = kernels.load("bn.cu", da.dtype)
    store = dict(bits=bits, da=da, x_copy=x_copy, codes=codes, stats=stats, beta=beta, stochastic=stochastic,
                 **_window_args(stats, windows, rows))
    _chunk_sums(module.batchnorm_relu_backward_sums, rows=rows, C=C, rows_per_chunk=ROWS_PER_CHUNK,
                partial=partial, out=sums, **store)
    dbeta += sums[0]
    dgamma += sums[1]
    module.batchnorm_relu_backward_dx(rows=rows, C=C, sums=sums, inv_count=1.0 / rows, residual_grad=residual_grad,
                                      dx=dx, **store, **launch(rows, C, bits=bits))


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


def update_running(running, increment, *, momentum):
    """running = momentum * running + increment, in place: the running statistics' one rule, for a unit's
    (BatchNormReLU) and for a whole net's deferred increments (Net.add_running)."""
    running *= momentum
    running += increment


@dataclass(frozen=True)
class StoreView:
    """A unit's store at a batch of n, as the kernels take it: the second link of the chain quant.Store (the
    policy) -> StoreView (this unit's buffers at n) -> Unit and StoreIn / StoreOut (kernels/bn_walk.cuh, one
    launch's) -> the row a thread is dealt (LaneRow or WideRow). Built once per batch size
    (BatchNormReLU.view); every pass of the unit reads this one.

        bits        0 (exact: x_copy) or k (codes)
        x_copy      (n, H, W, C) float      exact mode's copy of x
        codes       (n*H*W*C*k/8,) uint8    the packed k-bit codes
        windows     (blocks, 3, C)          k bits: a window per channel, blocks(n*H*W) blocks (block window) or 1
        stochastic  the codes' levels are the bins' edges (quant.Store.stochastic)
    """
    bits: int = 0
    x_copy: object = None
    codes: object = None
    windows: object = None
    stochastic: bool = False

    def kernel_args(self):
        """The keywords of the kernels' wrappers below (batchnorm_relu_forward, _restore, _backward)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}  # (no copies)


UNCODED = StoreView()  # an evaluation's forward: no store written, no window taken


class BatchNormReLU:
    """A unit's batch norm (batch statistics) -> gamma/beta -> ReLU over (N, H, W, C), fused with its store.
    The layer owns the unit's buffers of the method and reads them through views of a batch of n:

        stats    (4, C)                                    the statistics above: written forward, read backward
        store    (N*H*W*C,) float         exact            x itself
                 (N*H*W*C*k/8,) uint8     k bits           the packed codes of v = xhat + b
        windows  (blocks(N*H*W), 3, C)    k bits, block    a window per channel for each block of rows
                 (1, 3, C)                k bits, else     the fixed or range window per channel

    Each pass is one call, given the net's store (quant.Store: which of these exist, how codes are made)."""

    def __init__(self, in_shape):
        self.in_shape, self.C = tuple(in_shape), in_shape[2]
        self.own = self.running = None  # bind()
        self._views = {}

    def own_buffers(self, n, *, store, keep):
        """The buffers above for a batch of n, the store and windows only when kept (training, or the naive
        net's evaluation, which feeds its codes forward). (dtype None: the net's.)"""
        values, rows = elements(n, self.in_shape), elements(n, self.in_shape[:2])
        stores = [Own("store", (values,), None, "activation stores") if not store.k else
                  Own("store", (values * store.k // 8,), np.uint8, "activation stores")]
        if store.k:  # the windows' one home: a block each BLOCK_ROWS rows (block window), else one, which
            # does not grow with the batch and is counted with the statistics
            stores.append(Own("windows", (quant.blocks(rows), 3, self.C), None, "activation stores") if store.block
                          else Own("windows", (1, 3, self.C), None, "batch-norm statistics"))
        return (stores if keep else []) + [Own("stats", (STATS_ROWS, self.C), None, "batch-norm statistics")]

    def bind(self, *, own, running):
        """own: the views of the buffers above by role; running: the unit's (2, C) running mean and variance."""
        self.own, self.running = own, running
        self._views = {}  # (n, store) -> StoreView: a compile binds new buffers

    def view(self, n, store):
        """The StoreView of a batch of n under the store (quant.Store), made at its first use; whether there
        are block windows is decided here, once (store.block)."""
        view = self._views.get((n, store))
        if view is None:
            values = elements(n, self.in_shape)
            if not store.k:
                view = StoreView(x_copy=self.own["store"][:values].reshape((n,) + self.in_shape))
            else:
                windows = self.own["windows"][: quant.blocks(elements(n, self.in_shape[:2])) if store.block else 1]
                view = StoreView(bits=store.k, codes=self.own["store"][: values * store.k // 8], windows=windows,
                                 stochastic=store.stochastic)
            self._views[n, store] = view
        return view

    def forward(self, x, a, *, store, train, gamma, beta, eps, partial=None, momentum=None, deferred=None,
                rounding_key=None):
        """a = relu(bn(x)), x and a (n, H, W, C). Training: the batch's statistics, the running ones updated
        (deferred (2, C): their increment goes there instead, Net.defer_running), the store written (a
        stochastic store's codes rounded at random by rounding_key's draws). Evaluation: the running statistics, and no
        store but the naive net's, whose codes go forward."""
        n, stats = x.shape[0], self.own["stats"]
        extremes = None
        if train:
            extremes = batchnorm_statistics(x, stats, partial=partial, window=store.window)
            self._update_running(stats, n, momentum=momentum, deferred=deferred)
        else:
            stats[0], stats[1] = self.running[0], self.running[1]
        coded = train or store.naive  # (uncoded: no codes, so no window to take)
        view = self.view(n, store) if coded else UNCODED
        batchnorm_coefficients(gamma, beta, stats, eps=eps, bits=view.bits, window=store.window if coded else "fixed",
                               extremes=extremes, windows=view.windows, stochastic=view.stochastic,
                               clip=store.window_clip)
        batchnorm_relu_forward(x, stats, beta, a, naive=store.naive, rounding_key=rounding_key, **view.kernel_args())

    def _update_running(self, stats, n, *, momentum, deferred=None):
        """The running statistics' increment (1 - momentum) * (batch mean, unbiased variance), read before
        batchnorm_coefficients turns stats[1] into sigma: applied (update_running), or written to deferred."""
        rows = elements(n, self.in_shape[:2])
        increment = ((1 - momentum) * stats[0], (1 - momentum) * rows / max(rows - 1, 1) * stats[1])
        for row in (0, 1):
            if deferred is not None:
                deferred[row] = increment[row]
            else:
                update_running(self.running[row], increment[row], momentum=momentum)

    def restore(self, a, *, store, beta):
        """a (n, H, W, C) from the store: the exact activation (exact mode) or a~."""
        batchnorm_relu_restore(self.own["stats"], beta, a, **self.view(a.shape[0], store).kernel_args())

    def backward(self, da, dx, *, store, beta, dgamma, dbeta, partial, sums, residual_grad=None):
        """dx = dL/dx [+ residual_grad] from da = dL/da and the store; dgamma, dbeta accumulate (+=)."""
        batchnorm_relu_backward(da, self.own["stats"], beta, dx, **self.view(da.shape[0], store).kernel_args(),
                                dgamma=dgamma, dbeta=dbeta, partial=partial, sums=sums, residual_grad=residual_grad)
