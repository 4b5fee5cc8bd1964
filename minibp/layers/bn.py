"""Batch norm + ReLU of one unit, fused with writing and reading its activation store, beside kernels/bn.cu.

    BatchNormReLU            the layer a unit holds: its statistics, its store and windows, one call a pass
    StoreView                a unit's store at one batch size: the buffers the kernels read and write
    batchnorm_statistics     the kernels' wrappers, one per pass, on arrays the caller gives (tests call them)
    batchnorm_finish         (the statistics' finish; code_windows, a k-bit store's windows after it;
    rounding_keys             stochastic rounding's keys of a pass)
    batchnorm_relu_forward / _restore / _backward
    batchnorm_relu_*_ref     the same in plain NumPy

"""
from dataclasses import dataclass, fields

import numpy as np

from .. import kernels, program, quant
from ..constants import GAMMA_MIN  # gamma is clamped to at least this (docs/method.md, "The unit")
from ..params import Own, elements
from ..quant import check_window
from .launch import finish_launch, launch, window_launch

ROWS_PER_CHUNK = 16      # rows the backward's reduction sums in order into one row of partial sums
# rows a chunk of the statistics' sums, about its own shift; a block window's rows are whole chunks
STATS_CHUNK = 64
STATS_VALUES = {False: 3, True: 5}  # the statistics' partial rows (kernels/bn.cu PartialRow): with the extremes, 5

# stats is a unit's (4, C) statistics: mean, sigma = sqrt(var + eps), gamma clamped, b = beta / gamma
# (kernels/bn.cu). The store is x_copy (exact mode, bits = 0) or the packed k-bit codes of v = xhat + b
# through the unit's windows (windows, 3, C): the window (shift, below, above) of each channel's codes
# (minibp/quant.py), one a channel under the fixed and range windows, one each quant.WINDOW_ROWS rows under
# the block window.
#
# The kernels' layout (kernels/bn.cu): launch.py.

STATS_ROWS = 4         # a unit's statistics: (4, C), as above (bn_walk.cuh's STATS_ROWS)
assert quant.WINDOW_ROWS % STATS_CHUNK == 0


def reduction_chunks(rows):
    """The scratch `partial` of a unit's reductions over `rows` rows holds 2 * reduction_chunks(rows) * C values: the
    backward's two sums over chunks of ROWS_PER_CHUNK rows, or the statistics' three or five (the sums, each chunk's
    shift, the range windows' least and largest x) over chunks of STATS_CHUNK rows, whichever is more."""
    return max(-(-rows // ROWS_PER_CHUNK), -(-STATS_VALUES[True] * -(-rows // STATS_CHUNK) // 2))


def _partial(partial, *, values, chunks, C, who):
    """The (values, chunks, C) view of a reduction's scratch, refused in one line when it is too small."""
    if partial.size < values * chunks * C:
        raise ValueError(f"partial holds {partial.size} values; {who} over {chunks} chunks of {C} channels needs "
                         f"{values * chunks * C}")
    return partial[: values * chunks * C].reshape(values, chunks, C)


def _check_stats(stats, C):
    if stats.shape != (STATS_ROWS, C):  # the kernels write all its rows
        raise ValueError(f"stats must be ({STATS_ROWS}, {C}), got {stats.shape}")


def batchnorm_statistics(x, *, partial, window="fixed", residual=None, saved=None):
    """The first pass of a training forward over x (..., C): the partial sums of its statistics, one kernel.
    Returns the view of partial it wrote, (values, chunks, C), for batchnorm_finish: for each chunk of STATS_CHUNK
    rows the sums of d = x - s and d^2 about s, the chunk's first x (a shift near its rows' mean, so that the
    variance keeps its digits whatever the mean), s itself, and (range and block windows, values = 5) the least and
    largest x. residual (..., C), when given, is added to x first, in place (a residual block's shortcut), and
    saved, when given, receives x (a residual block's input, kept). partial is (>= 2 * reduction_chunks(rows) *
    C,) scratch. batchnorm_statistics_ref states it in NumPy."""
    C = x.shape[-1]
    rows = x.size // C
    extremes = check_window(window) != "fixed"
    part = _partial(partial, values=STATS_VALUES[extremes], chunks=-(-rows // STATS_CHUNK), C=C,
                    who="batchnorm_statistics")
    kernels.load("bn.cu", x.dtype).batchnorm_statistics(
        rows=rows, C=C, extremes=extremes, x=x, residual=residual, saved=saved, partial=part,
        **launch(rows, C, rows_per_chunk=STATS_CHUNK))
    return part


def batchnorm_finish(gamma, beta, stats, *, eps, part=None, rows=None, running=None, offset=0, momentum=0.9,
                     running_before=None, increments=None, bits=0, window="fixed", windows=None, stochastic=False,
                     clip=None):
    """The second pass, a kernel a channel, and at k bits code_windows's after it. Training (part:
    batchnorm_statistics's, over `rows` rows): the batch's mean and variance, and the running statistics (2, S),
    this unit's channels from offset, updated as update_running does (their values kept in running_before (2, S)
    first), or their increments written to increments (2, S) instead (Net.defer_running), or (running None)
    neither. Evaluation (part None): the running statistics. Then stats holds the mean, sigma = sqrt(var + eps),
    gamma clamped to >= GAMMA_MIN and b = beta / gamma, and at k bits the windows (windows, 3, C) hold those the
    codes go through: fixed, or the range or block window of part's extremes (stochastic: for levels on the bins'
    edges; clip: the range or block window's, None: quant.clip_of's). batchnorm_finish_ref states it."""
    C = gamma.shape[0]
    _check_stats(stats, C)
    window = check_window(window)
    if part is not None and window != "fixed" and part.shape[0] != STATS_VALUES[True]:
        raise ValueError(f"the {window} window reads the extremes of batchnorm_statistics(window={window!r})")
    if part is not None and (rows is None or part.shape[1] != -(-rows // STATS_CHUNK)):
        raise ValueError(f"part holds {part.shape[1]} chunks of {STATS_CHUNK} rows: give their rows, got {rows}")
    if part is None and window != "fixed" and bits:
        raise ValueError(f"the {window} window is the batch's: an evaluation codes through the fixed one")
    if bits:
        count = quant.windows_per_channel(rows) if window == "block" else 1
        if _windows(stats, windows).shape[0] != count:
            raise ValueError(f"the {window} window over {rows} rows takes {count} {window} window(s) a channel, got "
                             f"{windows.shape[0]}")
    if part is None and running is None:
        raise ValueError("an evaluation's statistics are the running ones: give running (2, S)")
    S = C if running is None else running.shape[1]
    if running is not None and (running.shape != (2, S) or not 0 <= offset <= S - C):
        raise ValueError(f"running must be (2, S) with this unit's {C} channels from offset {offset}, got "
                         f"{running.shape}")
    module = kernels.load("bn.cu", gamma.dtype)
    module.batchnorm_finish(
        rows=rows or 1, C=C, rows_per_chunk=STATS_CHUNK, eps=eps, momentum=momentum, S=S, offset=offset, gamma=gamma,
        beta=beta, partial=part, running=running,
        running_before=running_before if part is not None and increments is None else None, increments=increments,
        stats=stats, **finish_launch(C))
    if bits:
        _code_windows(module, stats, None if window == "fixed" else part[3:], windows, bits=bits, window=window,
                      stochastic=stochastic, clip=clip)


WINDOW_KIND = {None: 0, "fixed": 1, "range": 2, "block": 3}  # kernels/bn.cu's WindowKind: what code_windows takes


def code_windows(stats, extremes, windows, *, bits, window, stochastic=False, clip=None):
    """The range or block window's windows (windows, 3, C) from stats (batchnorm_finish's) and extremes (2, chunks,
    C), each chunk's least and largest x (batchnorm_statistics's part[3:]): one window of all the chunks (range),
    or one each quant.WINDOW_ROWS rows (block). A kernel over windows and channels (launch.window_launch)."""
    C, chunks = stats.shape[1], extremes.shape[1]
    count = -(-chunks * STATS_CHUNK // quant.WINDOW_ROWS) if check_window(window) == "block" else 1
    if window == "fixed" or extremes.shape != (2, chunks, C) or _windows(stats, windows).shape[0] != count:
        raise ValueError(f"the {window} window's {count} window(s) of {C} channels come from extremes (2, chunks, "
                         f"{C}), got {extremes.shape} for windows {windows.shape}")
    _code_windows(kernels.load("bn.cu", stats.dtype), stats, extremes, windows, bits=bits, window=window,
                  stochastic=stochastic, clip=clip)


def _code_windows(module, stats, extremes, windows, *, bits, window, stochastic, clip):
    """The kernel code_windows on checked arguments (extremes None: the fixed window's, of b alone)."""
    C, chunks = stats.shape[1], 0 if extremes is None else extremes.shape[1]
    clip = 0.0 if window == "fixed" else quant.clip_of(window, bits) if clip is None else clip
    module.code_windows(C=C, chunks=chunks, rows_per_chunk=STATS_CHUNK, window=WINDOW_KIND[window], bits=bits,
                        clip=clip, below_weight=quant.BELOW_WEIGHT, stochastic=stochastic, stats=stats,
                        extremes=extremes, windows=windows, **window_launch(windows.shape[0], C))


def _windows(stats, windows):
    """The k-bit windows (windows, 3, C), checked against the stats (4, C) they go with."""
    C = stats.shape[1]
    if windows is None:
        raise ValueError(f"a k-bit store codes through its windows: give windows (windows, 3, {C})")
    if windows.ndim != 3 or windows.shape[1:] != (3, C) or windows.dtype != stats.dtype:
        raise ValueError(f"windows must be (windows, 3, {C}) {stats.dtype}, got {windows.dtype} {windows.shape}")
    return windows


def store_args(stats, rows, *, bits=0, stochastic=False, x_copy=None, codes=None, windows=None):
    """The store's arguments, in the one order every kernel of bn.cu takes them: bits, stochastic, x_copy (exact),
    codes (k bits), windows and window_rows (one window a channel, or quant.WINDOW_ROWS rows a window), then the
    stats."""
    if windows is None:
        window_rows = max(rows, 1)
    else:
        windows = _windows(stats, windows)
        if windows.shape[0] not in (1, quant.windows_per_channel(rows)):
            raise ValueError(f"{rows} rows take {quant.windows_per_channel(rows)} block windows a channel, got "
                             f"{windows.shape[0]}")
        window_rows = max(rows, 1) if windows.shape[0] == 1 else quant.WINDOW_ROWS
    return dict(bits=bits, stochastic=stochastic, x_copy=x_copy, codes=codes, windows=windows, window_rows=window_rows,
                stats=stats)


def rounding_keys(keys, draw, *, seed):
    """keys (units,) int64 = each unit's stochastic-rounding key in the training forward pass that takes draw[0]
    (a device (1,) int64), which then counts on to the next pass's (quant.rounding_key states the key): one
    kernel of one thread, a pass's first."""
    kernels.load("bn.cu", np.float32).rounding_keys(units=keys.size, seed_hash=quant.seed_hash(seed), draw=draw,
                                                    keys=keys, grid=(1,), block=(1,))


def batchnorm_relu_forward(x, stats, beta, a, *, bits=0, naive=False, x_copy=None, codes=None, windows=None,
                           stochastic=False, rounding_key=None):
    """a = relu(gamma (x - mean) / sigma + beta) for x, a (..., C); writes the store when given
    (x_copy at bits = 0, codes otherwise, through the windows: _windows). naive: a is the restored a~.
    stochastic: the codes are rounded at random to the levels on the bins' edges, element (r, c) by its draw
    from rounding_key, a device int64 (1,) array holding the key (quant.rounding_key; quant.uniform_ref); else
    each value to its bin's midpoint."""
    C = x.shape[-1]
    rows = x.size // C
    if naive and (bits == 0 or codes is None):
        raise ValueError("naive mode feeds the k-bit codes forward: it needs bits > 0 and a codes buffer")
    if stochastic != (rounding_key is not None):
        raise ValueError("stochastic rounding draws from its rounding_key: give both or neither")
    kernels.load("bn.cu", x.dtype).batchnorm_relu_forward(
        rows=rows, C=C, **store_args(stats, rows, bits=bits, stochastic=stochastic, x_copy=x_copy, codes=codes,
                                     windows=windows),
        beta=beta, naive=naive, rounding_key=rounding_key, x=x, a=a, **launch(rows, C, bits=bits))


def batchnorm_relu_restore(stats, beta, a, *, bits, x_copy=None, codes=None, windows=None, stochastic=False):
    """a (the exact activation at bits = 0, else a~) from the unit's store (stochastic: its levels are the
    bins' edges)."""
    C = a.shape[-1]
    rows = a.size // C
    kernels.load("bn.cu", a.dtype).batchnorm_relu_restore(
        rows=rows, C=C, **store_args(stats, rows, bits=bits, stochastic=stochastic, x_copy=x_copy, codes=codes,
                                     windows=windows),
        beta=beta, a=a, **launch(rows, C, bits=bits))


def batchnorm_relu_backward(da, stats, beta, dx, *, bits, x_copy=None, codes=None, windows=None, stochastic=False,
                            dgamma, dbeta, partial, sums, residual_grad=None, shortcut_grad=None, restored=None,
                            accumulate=True):
    """dx = dL/dx of the unit's BN + ReLU from da = dL/da and the store (stochastic: its levels are the bins'
    edges); dgamma, dbeta accumulate (+=), or with accumulate=False are set (=). Three kernels: the partial sums of
    dbeta and dgamma (and, given restored (..., C), the restored activation batchnorm_relu_restore writes, from
    the same read of the store), their sums, dx.

    partial is (>= 2 * reduction_chunks(rows) * C,) scratch and sums (2, C) receives this batch's dbeta, dgamma.
    residual_grad, when given, is added to dx (the residual gradient arriving at a block's input); shortcut_grad,
    when given, receives dx then (the gradient a block's shortcut takes back: it may be residual_grad's buffer).
    """
    C = da.shape[-1]
    rows = da.size // C
    module = kernels.load("bn.cu", da.dtype)
    store = store_args(stats, rows, bits=bits, stochastic=stochastic, x_copy=x_copy, codes=codes, windows=windows)
    part = _partial(partial, values=2, chunks=-(-rows // ROWS_PER_CHUNK), C=C, who="batchnorm_relu_backward_sums")
    module.batchnorm_relu_backward_sums(rows=rows, C=C, **store, beta=beta, da=da, partial=part, a=restored,
                                        **launch(rows, C, bits=bits, rows_per_chunk=ROWS_PER_CHUNK))
    module.batchnorm_backward_finish(C=C, chunks=part.shape[1], accumulate=accumulate, partial=part, sums=sums,
                                     dbeta=dbeta, dgamma=dgamma, **finish_launch(C))
    module.batchnorm_relu_backward_dx(rows=rows, C=C, **store, beta=beta, da=da, sums=sums, inv_count=1.0 / rows,
                                      residual_grad=residual_grad, shortcut_grad=shortcut_grad, dx=dx,
                                      **launch(rows, C, bits=bits))


def batchnorm_statistics_ref(x, *, window="fixed"):
    """part (values, chunks, C) as batchnorm_statistics computes it, in x's dtype: for each chunk of STATS_CHUNK rows
    the sums, in order, of d = x - s and d^2 about s, its first row, s, and (range, block) its least and largest x."""
    C = x.shape[-1]
    x2 = np.asarray(x).reshape(-1, C)
    chunks = [x2[r:r + STATS_CHUNK] for r in range(0, len(x2), STATS_CHUNK)]
    part = [[np.add.reduce(c - c[0], axis=0) for c in chunks], [np.add.reduce((c - c[0]) * (c - c[0]), axis=0)
                                                                   for c in chunks], [c[0] for c in chunks]]
    if check_window(window) != "fixed":
        part += [[c.min(axis=0) for c in chunks], [c.max(axis=0) for c in chunks]]
    return np.array(part, x2.dtype)


def batchnorm_finish_ref(gamma, beta, part, *, rows, eps, running, momentum, bits=0, window="fixed",
                         stochastic=False, clip=None):
    """(stats (4, C), running (2, C) after the update, windows (windows, 3, C) or None) as batchnorm_finish computes
    them from batchnorm_statistics_ref's part over `rows` rows, in its dtype: the chunks combined in order in
    float64, the mean first, then the squares about it."""
    t = part.dtype.type
    n = np.minimum(rows - np.arange(part.shape[1]) * STATS_CHUNK, STATS_CHUNK).astype(np.float64)[:, None]
    s1, s2, shift = (part[i].astype(np.float64) for i in range(3))
    mean = np.cumsum(s1 + n * shift, axis=0)[-1] / rows  # (cumsum: in order)
    off = shift - mean
    squares = np.cumsum(s2 + 2 * off * s1 + n * off * off, axis=0)[-1]
    mean, var = mean.astype(part.dtype), np.where(squares > 0, squares / rows, np.where(np.isnan(squares), squares,
                                                                                        0)).astype(part.dtype)
    increment = np.array([t(1 - momentum) * mean, t((1 - momentum) * rows / max(rows - 1, 1)) * var])
    gamma = np.where(gamma < t(GAMMA_MIN), t(GAMMA_MIN), gamma).astype(part.dtype)  # (NaN passes through)
    stats = np.array([mean, np.sqrt(var + t(eps)), gamma, beta / gamma], part.dtype)
    windows = None
    if bits:
        b = stats[3]
        v = lambda x: (x - stats[0]) / stats[1] + b  # noqa: E731  (v of an x, as the forward pass computes it)
        if window == "fixed":
            windows = quant.window_ref(b, bits=bits)[None]
        else:
            per_window = quant.WINDOW_ROWS // STATS_CHUNK if window == "block" else part.shape[1]
            spans = [slice(k, k + per_window) for k in range(0, part.shape[1], per_window)]  # each window's chunks
            lo = np.array([part[3, k].min(axis=0) for k in spans])
            hi = np.array([part[4, k].max(axis=0) for k in spans])
            windows = np.moveaxis(quant.window_ref(b, bits=bits, kind=window, lo=v(lo), hi=v(hi), clip=clip,
                                                   stochastic=stochastic), 0, 1)
    return stats, np.asarray(running) * t(momentum) + increment, windows


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
    """running = momentum * running + increment, in place: the rule batchnorm_finish applies to a unit's running
    statistics in its kernel, here for a whole net's deferred increments (Net.add_running)."""
    running *= momentum
    running += increment


@dataclass(frozen=True)
class StoreView:
    """A unit's store at a batch of n, as its launches take it: the second link of the chain quant.Store (the
    unit's policy) -> StoreView (this unit's buffers at n, and the policy's decisions, made here once) -> the
    unit's launches, bound once when a pass is recorded (program.py) -> UnitTables and StoreIn / StoreOut
    (kernels/bn_walk.cuh) -> the row a thread is dealt (LaneRow or WideRow). Built once per batch size
    (BatchNormReLU.view); every pass of the unit reads this one. Its first fields are the store's arguments, in
    the order every kernel of bn.cu takes them (kernel_args):

        bits        0 (exact: x_copy) or k (codes)
        stochastic  the codes' levels are the bins' edges (quant.Store.stochastic)
        x_copy      (n, H, W, C) float      exact mode's copy of x
        codes       (n*H*W*C*k/8,) uint8    the packed k-bit codes
        windows     (windows, 3, C)         k bits: windows_per_channel(n*H*W) a channel (block window) or 1

    and then what the statistics' and the finish's launches read of the policy:

        window      the window the codes go through ("fixed" where nothing is coded): the statistics find each
                    chunk's extremes for the range and block windows
        clip        the range or block window's clip in standard deviations (None: quant.clip_of's)
        naive       the codes are fed forward too (the ablation)
    """
    bits: int = 0
    stochastic: bool = False
    x_copy: object = None
    codes: object = None
    windows: object = None
    window: str = "fixed"
    clip: float = None
    naive: bool = False

    KERNEL_ARGS = ("bits", "stochastic", "x_copy", "codes", "windows")

    def kernel_args(self):
        """The keywords of the kernels' wrappers above (batchnorm_relu_forward, _restore, _backward)."""
        return {name: getattr(self, name) for name in self.KERNEL_ARGS}  # (views: no copies)


UNCODED = StoreView()  # an evaluation's forward: no store written, no window taken


class BatchNormReLU:
    """A unit's batch norm (batch statistics) -> gamma/beta -> ReLU over (N, H, W, C), fused with its store.
    The layer owns the unit's buffers of the method and reads them through views of a batch of n:

        stats    (4, C)                                    the statistics above: written forward, read backward
        store    (N*H*W*C,) float         exact            x itself
                 (N*H*W*C*k/8,) uint8     k bits           the packed codes of v = xhat + b
        windows  (windows, 3, C)          k bits, block    a window a channel each quant.WINDOW_ROWS rows:
                                                           windows = quant.windows_per_channel(N*H*W)
                 (1, 3, C)                k bits, else     the fixed or range window per channel

    A training forward is three kernels, four at k bits (the statistics' sums, their finish with the running
    statistics' update, the windows, then a and the store), an evaluation's two (the naive net's three), and the
    backward three (the sums, with a~ restored from the same read; their finish; dx), given the net's store
    (quant.Store: which of these buffers exist, how codes are made)."""

    def __init__(self, in_shape):
        self.in_shape, self.C = tuple(in_shape), in_shape[2]
        self.own = self.running = None  # bind()
        self._views = {}

    def own_buffers(self, n, *, store, keep):
        """The buffers above for a pass of n images, the store's (x_copy, or codes and windows) only when kept
        (training, or the naive net's evaluation, which feeds its codes forward). (dtype None: the net's.)"""
        values, rows = elements(n, self.in_shape), elements(n, self.in_shape[:2])
        stores = [Own("x_copy", (values,), None, "activation stores") if not store.k else
                  Own("codes", (values * store.k // 8,), np.uint8, "activation stores")]
        if store.k:  # the windows' one home: one each WINDOW_ROWS rows (block window), else one, which
            # does not grow with the batch and is counted with the statistics
            stores.append(Own("windows", (quant.windows_per_channel(rows), 3, self.C), None, "activation stores")
                          if store.block
                          else Own("windows", (1, 3, self.C), None, "batch-norm statistics"))
        return (stores if keep else []) + [Own("stats", (STATS_ROWS, self.C), None, "batch-norm statistics")]

    def bind(self, *, own, running):
        """own: the views of the buffers above by role; running: the unit's params.Running share."""
        self.own, self.running = own, running
        self._views = {}  # (n, store) -> StoreView: a compile binds new buffers

    def view(self, n, store):
        """The StoreView of a pass of n images under the store (quant.Store), made at its first use: the one place the
        store's buffers are cut to n and its window decided."""
        view = self._views.get((n, store))
        if view is None:
            values = elements(n, self.in_shape)
            if not store.k:
                view = StoreView(x_copy=self.own["x_copy"][:values].reshape((n,) + self.in_shape))
            else:
                count = quant.windows_per_channel(elements(n, self.in_shape[:2])) if store.block else 1
                windows = self.own["windows"][:count]
                view = StoreView(bits=store.k, stochastic=store.stochastic,
                                 codes=self.own["codes"][: values * store.k // 8], windows=windows,
                                 window=store.window, clip=store.window_clip, naive=store.naive)
            self._views[n, store] = view
        return view

    def forward(self, x, a, *, store, train, gamma, beta, eps, partial=None, momentum=None, running_before=None,
                increments=None, rounding_key=None, residual=None, saved=None):
        """a = relu(bn(x)), x and a (n, H, W, C), x += residual first when given (a residual block's shortcut) and
        saved = x then (a block's input, kept). Training: the batch's statistics (their pass adds and saves), the
        running ones updated (their values before kept in running_before, the net's (2, S)), or their increments
        written to increments (2, S) instead (Net.defer_running), and the store written (a stochastic store's codes
        rounded at random by the draws of rounding_key, a device (1,) int64 array; other stores ignore it).
        Evaluation: the running statistics, and no store but the naive net's, whose codes go forward."""
        n, stats = x.shape[0], self.own["stats"]
        view = self.view(n, store) if train or store.naive else UNCODED  # (uncoded: no codes, so no window)
        if train:
            part = batchnorm_statistics(x, partial=partial, window=view.window, residual=residual, saved=saved)
        else:
            part = None
            add_and_save(x, residual=residual, saved=saved)
        batchnorm_finish(gamma, beta, stats, eps=eps, part=part, rows=elements(n, self.in_shape[:2]),
                         running=self.running.array, offset=self.running.offset, momentum=momentum,
                         running_before=running_before, increments=increments, bits=view.bits, window=view.window,
                         windows=view.windows, stochastic=view.stochastic, clip=view.clip)
        batchnorm_relu_forward(x, stats, beta, a, naive=view.naive,
                               rounding_key=rounding_key if view.stochastic else None, **view.kernel_args())

    def restore(self, a, *, store, beta):
        """a (n, H, W, C) from the store: the exact activation (exact mode) or a~."""
        batchnorm_relu_restore(self.own["stats"], beta, a, **self.view(a.shape[0], store).kernel_args())

    def backward(self, da, dx, *, store, beta, dgamma, dbeta, partial, sums, residual_grad=None, shortcut_grad=None,
                 restored=None, accumulate=True):
        """dx = dL/dx [+ residual_grad] [and shortcut_grad = dx] from da = dL/da and the store; dgamma, dbeta
        accumulate (+=, or = without accumulate); restored, when given, receives a (restore's) from the same read of
        the store."""
        batchnorm_relu_backward(da, self.own["stats"], beta, dx, **self.view(da.shape[0], store).kernel_args(),
                                dgamma=dgamma, dbeta=dbeta, partial=partial, sums=sums, residual_grad=residual_grad,
                                shortcut_grad=shortcut_grad, restored=restored, accumulate=accumulate)


def add_and_save(x, *, residual=None, saved=None):
    """x += residual and saved = x, each when given: a residual block's schedule around a unit, as array
    operations, where no pass of the unit's takes them in (batchnorm_statistics does in a training forward)."""
    if residual is not None:
        program.add(x, residual)
    if saved is not None:
        program.copy(saved, x)


def add_and_keep_grad(dx, *, residual_grad=None, shortcut_grad=None):
    """dx += residual_grad and shortcut_grad = dx, each when given: the backward's add_and_save, as array
    operations, where batch norm's backward does not take them in."""
    if residual_grad is not None:
        program.add(dx, residual_grad)
    if shortcut_grad is not None:
        program.copy(shortcut_grad, dx)
