"""Units: the links of a net's chain, each owning its forward and backward pass.

A unit declares, once, what it needs: its parameters (`parameters()`), its own buffers (`own_buffers()`:
the activation store, the block window's windows and the batch-norm statistics) and how much of each
shared buffer it uses (`shared_sizes()`). The net turns these declarations into the one plan table
(net.py's `key()` names them "unit<i>.<role>"), allocates it, and hands every unit its views (`bind()`);
a unit reads its arrays by role, as `self.p["w"]`, `self.own["store"]` (the roles a unit may own:
params.OWN_ROLES). Nothing else spells a buffer name.

    ConvUnit      [BN -> ReLU, writing the k-bit store] -> [pool] -> conv [-> projection into the residual]
    ReluConvUnit  ReLU -> conv + bias, no batch norm: its input is stored in full precision

A unit's forward(x, out, step) reads x (N, H, W, C) in a shared buffer and writes out; its
backward(dy, dx, step) reads dy = dL/dout, accumulates its parameter gradients (+=) and writes
dx = dL/dx (dx None: not wanted). `step` carries the batch size, the mode, and views of the shared
buffers (Step.shared).
"""
from dataclasses import dataclass

import numpy as np

from . import backend, layers, quant


@dataclass(frozen=True)
class Param:
    role: str
    shape: tuple
    decayed: bool     # weight decay applies (conv and FC weights)
    init: str         # "he": N(0, 2/fan_in); "fan_in": N(0, 1/fan_in); "one"; "zero"


@dataclass(frozen=True)
class Own:
    role: str
    shape: tuple
    dtype: object
    category: str


def elements(n, shape):
    return n * int(np.prod(shape))


class ConvUnit:
    """[x += residual] -> BN -> gamma/beta -> ReLU -> [pool] -> conv: the paper's unit.

    Keeps for its backward pass only the store (the k-bit codes of v = xhat + b, or x itself in exact
    mode) and the (7, C) statistics: mean, sigma, gamma clamped, b = beta/gamma, the code's window.
    batchnorm=False (the unit on the data) keeps nothing: it reads the net's input buffer again.
    """

    def __init__(self, in_shape, channels, *, kernel=3, stride=1, padding="same", pool=None, batchnorm=True,
                 bias=False):
        self.in_shape, self.batchnorm = tuple(in_shape), batchnorm
        self.pool = {None: None, "max": lambda s: layers.MaxPool(s, kernel=3, stride=2, padding="same"),
                     "avg": lambda s: layers.AvgPool(s, kernel=2, stride=2),
                     "global": layers.GlobalAvgPool}[pool]
        self.pool = self.pool(self.in_shape) if self.pool else None
        self.conv_in_shape = self.pool.out_shape if self.pool else self.in_shape
        self.conv = layers.Conv2D(self.conv_in_shape, channels, kernel=kernel, stride=stride, padding=padding,
                                  bias=bias)
        self.out_shape = self.conv.out_shape
        self.projection = None  # a Conv2D of the conv's input into the residual buffer (Net.residual)
        self.is_classifier = pool == "global"

    # ------------------------------------------------------------------ declarations

    def parameters(self):
        params = [Param("w", self.conv.weight_shape, True, "fan_in" if self.is_classifier else "he")]
        if self.projection is not None:
            params.append(Param("projection", self.projection.weight_shape, True, "he"))
        if self.batchnorm:
            C = self.in_shape[2]
            params += [Param("gamma", (C,), False, "one"), Param("beta", (C,), False, "zero")]
        if self.conv.has_bias:
            params.append(Param("bias", (self.conv.cout,), False, "zero"))
        return params

    @property
    def bn_channels(self):
        """Channels whose running statistics the net keeps for this unit."""
        return self.in_shape[2] if self.batchnorm else 0

    def own_buffers(self, n, *, k, window, store):
        """k = 0: exact store (x, float); k = 8, 4, 2: packed codes, and the block window's windows;
        store=False (an evaluation): none. (dtype None: the net's.)"""
        if not self.batchnorm:
            return []
        values, C = elements(n, self.in_shape), self.in_shape[2]
        stores = [Own("store", (values,), None, "activation stores") if k == 0 else            # (N*H*W*C,) x
                  Own("store", (values * k // 8,), np.uint8, "activation stores")]            # (N*H*W*C*k/8,)
        if k and window == "block":
            blocks = quant.blocks(elements(n, self.in_shape[:2]))
            stores.append(Own("windows", (blocks, 3, C), None, "activation stores"))  # (ceil(N*H*W/256), 3, C)
        stats = Own("stats", (layers.STATS_ROWS, C), None, "batch-norm statistics")  # (7, C)
        return (stores if store else []) + [stats]

    def shared_sizes(self, n, *, training):
        """Elements of each shared buffer this unit uses."""
        sizes = {}
        if self.batchnorm:
            rows, C = elements(n, self.in_shape[:2]), self.in_shape[2]
            sizes["a"] = elements(n, self.in_shape)
            if training:
                sizes.update(da=elements(n, self.in_shape), partial=2 * layers.reduction_chunks(rows) * C,
                             bn_sums=2 * C)
        if self.pool is not None:
            sizes["pooled"] = elements(n, self.conv_in_shape)
            if training:
                sizes["dpooled"] = elements(n, self.conv_in_shape)
        work = [int(np.prod(self.conv.workspace_shape(n, accumulate_dx=self.projection is not None)))]
        if self.projection is not None:
            work.append(int(np.prod(self.projection.workspace_shape(n))))
        sizes["col"] = max(work)
        return sizes

    def bind(self, *, p, g, own, running):
        """The unit's views: parameters and gradients by role, own buffers by role, running (2, C)."""
        self.p, self.g, self.own, self.running = p, g, own, running

    # ------------------------------------------------------------------ forward

    def forward(self, x, out, s):
        """out = conv([pool](relu(bn(x)))); the store, the statistics and (training) the running ones."""
        n = s.n
        a = x
        if self.batchnorm:
            a = s.shared("a", self.in_shape)
            stats = self.own["stats"]
            window, extremes = s.window if s.train else "fixed", None  # evaluation codes only for the naive net
            if s.train:
                extremes = layers.batchnorm_statistics(x, stats, partial=s.shared("partial"), window=window)
                self._update_running(stats, n, momentum=s.bn_momentum, deferred=s.deferred_running.get(self.index))
            else:
                stats[0], stats[1] = self.running[0], self.running[1]
            windows = self._windows(n, window)
            layers.batchnorm_coefficients(self.p["gamma"], self.p["beta"], stats, eps=s.eps, bits=s.k, window=window,
                                          extremes=extremes, windows=windows)
            # the store is written in training, and read forward by the naive net in evaluation too
            x_copy, codes = self._store(n, k=s.k) if s.train or s.naive else (None, None)
            key = quant.rounding_key(*s.rounding_draw, self.index) if s.rounding_draw else None
            layers.batchnorm_relu_forward(x, stats, self.p["beta"], a, bits=s.k if codes is not None else 0,
                                          naive=s.naive, x_copy=x_copy, codes=codes, windows=windows,
                                          rounding_key=key)
        if self.pool is not None:
            pooled = s.shared("pooled", self.conv_in_shape)
            self.pool.forward(a, pooled)
            a = pooled
        self.conv.forward(a, self.p["w"], self.p.get("bias"), out, col=s.shared("col"))
        if self.projection is not None:
            self.projection.forward(a, self.p["projection"], None, s.shared("residual", self.projection.out_shape),
                                    col=s.shared("col"))

    def _update_running(self, stats, n, *, momentum, deferred=None):
        """running = momentum * running + increment, the increment (1 - momentum) * (batch mean, unbiased
        variance); deferred (2, C): the increment goes there and running stays (step.defer_running)."""
        rows = n * self.in_shape[0] * self.in_shape[1]
        increment = ((1 - momentum) * stats[0], (1 - momentum) * rows / max(rows - 1, 1) * stats[1])
        for row in (0, 1):
            if deferred is not None:
                deferred[row] = increment[row]
            else:
                self.running[row] *= momentum
                self.running[row] += increment[row]

    def _store(self, n, *, k):
        """(x_copy (n, H, W, C), None) in exact mode, (None, codes) at k bits: the store for a batch of n."""
        store, values = self.own["store"], elements(n, self.in_shape)
        if k == 0:
            return store[:values].reshape((n,) + self.in_shape), None
        return None, store[: values * k // 8]

    def _windows(self, n, window):
        """The block window's (blocks, 3, C) windows for a batch of n; None for the others (stats[4:7])."""
        return self.own["windows"][: quant.blocks(elements(n, self.in_shape[:2]))] if window == "block" else None

    # ------------------------------------------------------------------ backward

    def backward(self, dy, dx, s, *, residual_grad=None):
        """Gradients from dy; dx (may be None for the unit on the data) gets dL/dx [+ residual_grad]."""
        n = s.n
        if self.batchnorm:  # restore a~ (or recompute a exactly) from the store
            x_copy, codes = self._store(n, k=s.k)
            a = s.shared("a", self.in_shape)
            windows = self._windows(n, s.window)
            layers.batchnorm_relu_restore(self.own["stats"], self.p["beta"], a, bits=s.k, x_copy=x_copy, codes=codes,
                                          windows=windows)
        else:
            a = s.shared("input", self.in_shape)
        conv_in = a
        if self.pool is not None:
            conv_in = s.shared("pooled", self.conv_in_shape)
            self.pool.forward(a, conv_in)
        needs_dx = self.batchnorm or dx is not None
        if self.pool is not None:
            dconv_in = s.shared("dpooled", self.conv_in_shape)
        else:
            dconv_in = s.shared("da", self.in_shape) if self.batchnorm else dx
        col = s.shared("col")
        if self.projection is not None:  # the residual gradient waiting in the buffer came through it
            self.projection.backward(conv_in, self.p["projection"], s.shared("residual", self.projection.out_shape),
                                     dw=self.g["projection"], dx=dconv_in if needs_dx else None, col=col)
        self.conv.backward(conv_in, self.p["w"], dy, dw=self.g["w"], dbias=self.g.get("bias"),
                           dx=dconv_in if needs_dx else None, accumulate_dx=self.projection is not None, col=col)
        if not needs_dx:
            return
        if self.pool is not None:
            da = s.shared("da", self.in_shape) if self.batchnorm else dx
            self.pool.backward(a, dconv_in, da)
        else:
            da = dconv_in
        if self.batchnorm:
            C = self.in_shape[2]
            layers.batchnorm_relu_backward(da, self.own["stats"], self.p["beta"], dx, bits=s.k, x_copy=x_copy,
                                           codes=codes, windows=windows, dgamma=self.g["gamma"], dbeta=self.g["beta"],
                                           partial=s.shared("partial"),
                                           sums=s.shared("bn_sums")[: 2 * C].reshape(2, C),
                                           residual_grad=residual_grad)
        elif residual_grad is not None:
            dx += residual_grad


class ReluConvUnit:
    """ReLU -> conv + bias, with no batch norm. Without per-channel statistics there is no k-bit code
    for its input, so the unit keeps that input in full precision whatever the mode (a float store):
    a unit kind that costs memory, here to show that adding one touches this file only."""

    is_classifier, pool, projection, batchnorm, bn_channels = False, None, None, False, 0

    def __init__(self, in_shape, channels, *, kernel=3, stride=1, padding="same"):
        self.in_shape = tuple(in_shape)
        self.conv = layers.Conv2D(self.in_shape, channels, kernel=kernel, stride=stride, padding=padding, bias=True)
        self.out_shape = self.conv.out_shape

    def parameters(self):
        return [Param("w", self.conv.weight_shape, True, "he"), Param("bias", (self.conv.cout,), False, "zero")]

    def own_buffers(self, n, *, k, window, store):
        return [Own("store", (elements(n, self.in_shape),), None, "activation stores")] if store else []  # x

    def shared_sizes(self, n, *, training):
        size = elements(n, self.in_shape)
        return dict(a=size, da=size, col=int(np.prod(self.conv.workspace_shape(n)))) if training else \
            dict(a=size, col=int(np.prod(self.conv.workspace_shape(n))))

    def bind(self, *, p, g, own, running):
        self.p, self.g, self.own = p, g, own

    def forward(self, x, out, s):
        xp = backend.xp
        if s.train:
            xp.copyto(self.own["store"][: x.size].reshape(x.shape), x)
        a = s.shared("a", self.in_shape)
        xp.maximum(x, 0, out=a)
        self.conv.forward(a, self.p["w"], self.p["bias"], out, col=s.shared("col"))

    def backward(self, dy, dx, s, *, residual_grad=None):
        xp = backend.xp
        x = self.own["store"][: elements(s.n, self.in_shape)].reshape((s.n,) + self.in_shape)
        a = s.shared("a", self.in_shape)
        xp.maximum(x, 0, out=a)
        da = s.shared("da", self.in_shape) if dx is not None else None
        self.conv.backward(a, self.p["w"], dy, dw=self.g["w"], dbias=self.g["bias"], dx=da, col=s.shared("col"))
        if dx is None:
            return
        xp.sign(a, out=dx)  # the ReLU's mask, 1 where x > 0 (a = relu(x) >= 0), with no array beside the arena's
        dx *= da
        if residual_grad is not None:
            dx += residual_grad


class Step:
    """One call's view of the net for its units: batch n, the store's k and window, and the shared buffers."""

    def __init__(self, net, n, *, train):
        self.net, self.n, self.train = net, n, train
        self.k, self.naive, self.eps, self.bn_momentum = net.k, net.naive, net.eps, net.bn_momentum
        self.window = net.window
        # stochastic rounding: (seed, draw) of this training forward pass, each unit's key from them and its index
        self.rounding_draw = (net.seed, net.draw) if train and net.rounding == "stochastic" else None
        self.deferred_running = net.deferred_running if train else {}  # {unit index: (2, C)} (step.defer_running)

    def shared(self, name, shape=None):
        """A net buffer: whole and flat, or its first n*prod(shape) elements as (n,) + shape."""
        flat = self.net.arena[name].reshape(-1)
        return flat if shape is None else flat[: self.n * int(np.prod(shape))].reshape((self.n,) + tuple(shape))
