"""Units: the links of a net's chain, each owning its forward and backward pass.

A unit declares, once, what it needs: its parameters (`parameters()`), its own buffers (`own_buffers()`:
the store's buffer, x_copy or codes, the codes' windows and the batch-norm statistics) and how much of each
shared buffer it uses (`shared_sizes()`). The net turns these declarations into the one plan table
(net.py's `key()` names them "unit<i>.<role>"), allocates it, and hands every unit its views (`bind()`);
a unit reads its arrays by role, as `self.p["w"]`, `self.own["codes"]` (the roles a unit may own:
params.OWN_ROLES). Nothing else spells a buffer name.

    ConvUnit      [BN -> ReLU, writing the k-bit store] -> [pool] -> conv [-> projection into the residual]
    ReluConvUnit  ReLU -> conv + bias, no batch norm: its input is stored in full precision

A unit's forward(x, out, s) reads x (N, H, W, C) in a shared buffer and writes out; its backward(dy, dx, s) reads
dy = dL/dout, accumulates its parameter gradients (+=; =, where the pass's accumulate is False) and writes dx = dL/dx
(dx None: not wanted). `s`, the Pass, carries the pass's images n, the mode, and views of the shared buffers
(Pass.shared).
"""
import functools
import math

import numpy as np

from . import backend, program
from .layers.bn import BatchNormReLU, add_and_keep_grad, add_and_save, reduction_chunks
from .layers.conv import Conv2D
from .layers.pool import AvgPool, GlobalAvgPool, MaxPool
from .params import Own, Param, elements


class Unit:
    """What every unit has and does; the net (net.py, chain.py, params.py) reads nothing else of a unit.

    Declared by the unit:
        in_shape, out_shape       (H, W, C) of its input and output
        is_classifier             it ends the net: its output is the logits
        bn_channels               channels whose running statistics the net keeps for it (0: none)
        parameters()              [Param]: its parameters by role
        own_buffers(n, *, store, keep)   [Own]: its own buffers for a pass of n images under its quant.Store;
                                  keep=False (an evaluation): only what an evaluation needs
        shared_sizes(n, *, training)     {shared buffer name: elements it uses} (net.py's SHARED)
        bind(*, p, g, own, running)      its views: parameters and gradients by role, own buffers by role,
                                  running (2, bn_channels)
        forward(x, out, s, *, residual=None, saved=None)     x += residual first and saved = x then (a residual
                                  block's schedule, net.py), each when given; then the unit's own work
        backward(dy, dx, s, *, residual_grad=None, shortcut_grad=None)   dx += residual_grad and
                                  shortcut_grad = dx at the end, each when given (forward's in reverse)
    Set by the chain (chain.py) as it wires residual blocks:
        index                     its place in the chain
        saves_input               the first unit of a block: its input is copied to the residual buffer
        shortcut                  the unit after a block adds the residual to its input through this
                                  ParameterFreeShortcut (or None)
        adds_projection           the unit after a block adds the projection its first unit wrote
        convs()                   its Conv2D layers (the cuDNN path runs them: layers/conv_cudnn.py)
    A unit that can start a projection block (ConvUnit) also implements add_projection().
    """

    is_classifier, bn_channels = False, 0
    index, saves_input, shortcut, adds_projection = None, False, None, False

    def add_projection(self, out_shape):
        raise ValueError(f"a {type(self).__name__} cannot start a projection block: it has no conv input to project")

    def convs(self):
        return []


class ConvUnit(Unit):
    """[x += residual] -> BN -> gamma/beta -> ReLU -> [pool] -> conv: the paper's unit.

    Keeps for its backward pass only what its BatchNormReLU layer owns: the store (the k-bit codes of
    v = xhat + b, or x itself in exact mode), its windows (k bits) and the (4, C) statistics.
    batchnorm=False (the unit on the data) keeps nothing: it reads the net's input buffer again.
    """

    def __init__(self, in_shape, channels, *, kernel=3, stride=1, padding="same", pool=None, batchnorm=True,
                 bias=False):
        self.in_shape = tuple(in_shape)
        self.bn = BatchNormReLU(self.in_shape) if batchnorm else None
        self.pool = {None: None, "max": lambda s: MaxPool(s, kernel=3, stride=2, padding="same"),
                     "avg": lambda s: AvgPool(s, kernel=2, stride=2),
                     "global": GlobalAvgPool}[pool]
        self.pool = self.pool(self.in_shape) if self.pool else None
        self.conv_in_shape = self.pool.out_shape if self.pool else self.in_shape
        self.conv = Conv2D(self.conv_in_shape, channels, kernel=kernel, stride=stride, padding=padding,
                                  bias=bias)
        self.out_shape = self.conv.out_shape
        self.projection = None  # a Conv2D of the conv's input into the residual buffer (add_projection)
        self.is_classifier = pool == "global"
        self.bn_channels = self.in_shape[2] if batchnorm else 0

    batchnorm = property(lambda self: self.bn is not None)

    def add_projection(self, out_shape):
        """This unit starts a projection block whose output is out_shape: a strided 1x1 conv of its conv's input
        (pre-activated and pooled) writes the block's residual, which the unit after the block adds to its input."""
        H, Ho = self.conv_in_shape[0], out_shape[0]
        if H % Ho:
            raise ValueError(f"no projection maps {self.in_shape} to {out_shape} with an integer stride")
        self.projection = Conv2D(self.conv_in_shape, out_shape[2], kernel=1, stride=H // Ho)

    def convs(self):
        return [self.conv] + ([self.projection] if self.projection is not None else [])

    # ------------------------------------------------------------------ declarations

    def parameters(self):
        params = [Param("w", self.conv.weight_shape, True, "fan_in" if self.is_classifier else "he")]
        if self.projection is not None:
            params.append(Param("projection", self.projection.weight_shape, True, "he"))
        if self.bn is not None:
            C = self.in_shape[2]
            params += [Param("gamma", (C,), False, "one"), Param("beta", (C,), False, "zero")]
        if self.conv.has_bias:
            params.append(Param("bias", (self.conv.cout,), False, "zero"))
        return params

    def own_buffers(self, n, *, store, keep):
        """The BatchNormReLU layer's (layers/bn.py: the store, windows and statistics); none without it."""
        return self.bn.own_buffers(n, store=store, keep=keep) if self.bn is not None else []

    def shared_sizes(self, n, *, training):
        """Elements of each shared buffer this unit uses."""
        sizes = {}
        if self.bn is not None:
            rows, C = elements(n, self.in_shape[:2]), self.in_shape[2]
            sizes["a"] = elements(n, self.in_shape)
            if training:
                sizes.update(da=elements(n, self.in_shape), partial=2 * reduction_chunks(rows) * C,
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
        self.p, self.g = p, g
        if self.bn is not None:
            self.bn.bind(own=own, running=running)

    # ------------------------------------------------------------------ forward

    def forward(self, x, out, s, *, residual=None, saved=None):
        """out = conv([pool](relu(bn(x)))); the store, the statistics and (training) the running ones. The residual
        block's add and save go into batch norm's passes (a training forward's statistics take them in)."""
        a = x
        if self.bn is not None:
            a = s.shared("a", self.in_shape)
            self.bn.forward(x, a, store=s.stores[self.index], train=s.train, gamma=self.p["gamma"], beta=self.p["beta"],
                            eps=s.eps, partial=s.shared("partial") if s.train else None, momentum=s.bn_momentum,
                            running_before=s.running_before, increments=s.increments,
                            rounding_key=s.rounding_key(self.index), residual=residual, saved=saved)
        else:
            add_and_save(x, residual=residual, saved=saved)
        if self.pool is not None:
            pooled = s.shared("pooled", self.conv_in_shape)
            self.pool.forward(a, pooled)
            a = pooled
        self.conv.forward(a, self.p["w"], self.p.get("bias"), out, col=s.shared("col"))
        if self.projection is not None:
            self.projection.forward(a, self.p["projection"], None, s.shared("residual", self.projection.out_shape),
                                    col=s.shared("col"))

    # ------------------------------------------------------------------ backward

    def backward(self, dy, dx, s, *, residual_grad=None, shortcut_grad=None):
        """Gradients from dy; dx (may be None for the unit on the data) gets dL/dx [+ residual_grad], and
        shortcut_grad then dx (batch norm's backward takes both in). The data gradients first, then batch norm's
        backward, which restores the unit's activation a from the store as it reads it (but where a pool's backward
        needs a before it: then a is restored first), then the weight gradients, which read a."""
        bn, pool, col = self.bn, self.pool, s.shared("col")
        a = s.shared("a", self.in_shape) if bn is not None else s.shared("input", self.in_shape)
        restore_first = bn is not None and pool is not None
        if restore_first:
            bn.restore(a, store=s.stores[self.index], beta=self.p["beta"])
        conv_in = a
        if pool is not None:
            conv_in = s.shared("pooled", self.conv_in_shape)
            pool.forward(a, conv_in)
        # A projection's weight gradient reads the residual gradient after batch norm's backward: the shortcut's
        # gradient, which overwrites that buffer, waits until then.
        late, shortcut_grad = (shortcut_grad, None) if self.projection is not None else (None, shortcut_grad)
        if bn is not None or dx is not None:
            self._backward_data(dy, dx, a, s, col=col, residual_grad=residual_grad, shortcut_grad=shortcut_grad,
                                restore=not restore_first)
        if self.projection is not None:
            self.projection.backward_weights(conv_in, s.shared("residual", self.projection.out_shape),
                                             dw=self.g["projection"], accumulate=s.accumulate, col=col)
        self.conv.backward_weights(conv_in, dy, dw=self.g["w"], dbias=self.g.get("bias"), accumulate=s.accumulate,
                                   col=col)
        if late is not None:
            add_and_keep_grad(dx, shortcut_grad=late)

    def _backward_data(self, dy, dx, a, s, *, col, residual_grad, shortcut_grad, restore):
        """dx from dy: the convs' data gradients (the projection's first: the residual gradient waiting in the
        buffer came through it), the pool's, then batch norm's (restoring a into `a` as it reads the store, when
        restore)."""
        bn, pool = self.bn, self.pool
        da = s.shared("da", self.in_shape) if bn is not None else dx
        dconv_in = s.shared("dpooled", self.conv_in_shape) if pool is not None else da
        if self.projection is not None:
            self.projection.backward_data(self.p["projection"], s.shared("residual", self.projection.out_shape),
                                          dconv_in, col=col)
        self.conv.backward_data(self.p["w"], dy, dconv_in, accumulate=self.projection is not None, col=col)
        if pool is not None:
            pool.backward(a, dconv_in, da)
        if bn is None:
            add_and_keep_grad(dx, residual_grad=residual_grad, shortcut_grad=shortcut_grad)
            return
        C = self.in_shape[2]
        bn.backward(da, dx, store=s.stores[self.index], beta=self.p["beta"], dgamma=self.g["gamma"],
                    dbeta=self.g["beta"], partial=s.shared("partial"), sums=s.shared("bn_sums")[: 2 * C].reshape(2, C),
                    residual_grad=residual_grad, shortcut_grad=shortcut_grad, restored=a if restore else None,
                    accumulate=s.accumulate)


class ReluConvUnit(Unit):
    """ReLU -> conv + bias, with no batch norm. Without per-channel statistics there is no k-bit code
    for its input, so the unit keeps that input in full precision whatever the mode (a float store):
    a unit kind that costs memory, here to show that adding one touches this file only."""

    def __init__(self, in_shape, channels, *, kernel=3, stride=1, padding="same"):
        self.in_shape = tuple(in_shape)
        self.conv = Conv2D(self.in_shape, channels, kernel=kernel, stride=stride, padding=padding, bias=True)
        self.out_shape = self.conv.out_shape

    def parameters(self):
        return [Param("w", self.conv.weight_shape, True, "he"), Param("bias", (self.conv.cout,), False, "zero")]

    def convs(self):
        return [self.conv]

    def own_buffers(self, n, *, store, keep):
        return [Own("x_copy", (elements(n, self.in_shape),), None, "activation stores")] if keep else []  # (N*H*W*C,)

    def shared_sizes(self, n, *, training):
        size = elements(n, self.in_shape)
        return dict(a=size, da=size, col=int(np.prod(self.conv.workspace_shape(n)))) if training else \
            dict(a=size, col=int(np.prod(self.conv.workspace_shape(n))))

    def bind(self, *, p, g, own, running):
        self.p, self.g, self.own = p, g, own

    def forward(self, x, out, s, *, residual=None, saved=None):
        xp = backend.xp
        add_and_save(x, residual=residual, saved=saved)
        if s.train:
            program.copy(self.own["x_copy"][: x.size].reshape(x.shape), x)
        a = s.shared("a", self.in_shape)
        program.issue("relu", functools.partial(xp.maximum, out=a), x, 0)
        self.conv.forward(a, self.p["w"], self.p["bias"], out, col=s.shared("col"))

    def backward(self, dy, dx, s, *, residual_grad=None, shortcut_grad=None):
        xp = backend.xp
        x = self.own["x_copy"][: elements(s.n, self.in_shape)].reshape((s.n,) + self.in_shape)
        a = s.shared("a", self.in_shape)
        program.issue("relu", functools.partial(xp.maximum, out=a), x, 0)
        if dx is not None:
            da = s.shared("da", self.in_shape)
            self.conv.backward_data(self.p["w"], dy, da, col=s.shared("col"))
            program.issue("relu mask", xp.sign, a, dx)  # 1 where x > 0 (a = relu(x) >= 0), no array beside the arena's
            program.issue("multiply", xp.multiply, dx, da, dx)
            add_and_keep_grad(dx, residual_grad=residual_grad, shortcut_grad=shortcut_grad)
        self.conv.backward_weights(a, dy, dw=self.g["w"], dbias=self.g["bias"], accumulate=s.accumulate,
                                   col=s.shared("col"))


class Pass:
    """One pass's view of the net for its units: its images n, each unit's store (quant.Store: stores[index]), the
    shared buffers, and where a training forward's running statistics and rounding keys go."""

    def __init__(self, net, n, *, train, accumulate=True):
        self.net, self.n, self.train, self.accumulate = net, n, train, accumulate  # accumulate: a backward's grads +=
        self.stores, self.eps, self.bn_momentum = net.stores, net.eps, net.bn_momentum
        self.running_before = net.arena["running_before"] if train else None
        self.increments = net.deferred_running if train else None  # (2, S) while Net.defer_running defers them
        # stochastic rounding: the (units,) keys of this training forward (rounding_keys, kernels/bn.cu)
        self.keys = net.arena["rounding_keys"] if train and net.stochastic else None

    def rounding_key(self, index):
        """Unit index's stochastic-rounding key in this pass, a device (1,) int64 view; None when it does not round
        at random."""
        return None if self.keys is None else self.keys[index:index + 1]

    def shared(self, name, shape=None):
        """A net buffer: whole and flat, or its first n*prod(shape) elements as (n,) + shape."""
        flat = self.net.arena[name].reshape(-1)
        return flat if shape is None else flat[: self.n * math.prod(shape)].reshape((self.n,) + tuple(shape))
