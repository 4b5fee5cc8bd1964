"""The net: a chain of units, residual wiring, and the approximate-activation schedule.

A unit (METHOD.md) is   [x += residual] -> BN -> gamma/beta -> ReLU -> [pool] -> conv.
The first unit, on the data, has no BN/ReLU; the classifier unit ends in global average pooling,
a fully connected layer and softmax cross-entropy.

    net = Net(input_shape=(32, 32, 3))
    net.conv(16, kernel=3)                       # unit 0, on the data
    with net.residual():                         # the next unit's input is saved ...
        net.conv(16, kernel=1)
        net.conv(16, kernel=3)
        net.conv(64, kernel=1)
    net.classifier(10)                           # ... and added to this unit's input
    print(net.plan(batch=128, mode="4").summary())
    net.compile(batch=128, mode="4", seed=0)     # one allocation for the whole step
    loss, accuracy = net.forward(images, labels) # exact forward; each unit writes its k-bit store
    net.backward()                               # reads only the stores; grads += dL/dparams

Forward writes each unit's exact output into one of two shared buffers (act0/act1, used in
turn) and, while its exact input is there, that input's store: the k-bit codes of
v = xhat + beta/gamma (modes "8", "4", "2"), or a float copy of x (mode "exact": ordinary
backprop). Mode "naive" (4 bits) also feeds the restored a~ forward: the ablation whose errors
compound. Backward walks the units in reverse; each restores its activation from its store.
One residual is outstanding at a time, in the shared `residual` buffer (and its gradient,
in the same buffer, during the backward pass).
"""
import contextlib

import numpy as np

from . import backend, layers
from .arena import Arena, Plan
from .cudnn_conv import ConvGraphs, CudnnEngine, make_handle

MODE_BITS = {"exact": 0, "8": 8, "4": 4, "2": 2, "naive": 4}


def positive_int(value, what):
    """value as an int if it is a positive whole number (not a bool, not 2.7), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer, float, np.floating)) \
            or not float(value).is_integer() or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def parse_mode(mode):
    """'exact' | '8' | '4' | '2' | 'naive' (also the ints 8, 4, 2) -> (name, bits, naive)."""
    name = str(mode)
    if name not in MODE_BITS:
        raise ValueError(f"mode must be one of {', '.join(MODE_BITS)}, got {mode!r}")
    return name, MODE_BITS[name], name == "naive"


class Unit:
    """One link of the chain, as built: its layers and residual wiring (no arrays)."""

    def __init__(self, index, in_shape, conv, *, batchnorm, pool):
        self.index, self.in_shape, self.conv, self.batchnorm, self.pool = index, in_shape, conv, batchnorm, pool
        self.shortcut = None        # ParameterFreeShortcut: x += shortcut(residual) at this unit's input
        self.adds_projection = False  # x += residual, which a projection already shaped
        self.saves_input = False    # this unit's input (after any add) is the next residual
        self.projection = None      # Conv2D on this unit's conv input, written to the residual buffer
        self.conv_in_shape = pool.out_shape if pool is not None else in_shape

    @property
    def out_shape(self):
        return self.conv.out_shape

    @property
    def is_classifier(self):
        return isinstance(self.pool, layers.GlobalAvgPool)


class Net:
    """A chain of units; build it with conv/residual/classifier, then plan, compile and train."""

    def __init__(self, input_shape, *, dtype=np.float32, eps=1e-5, bn_momentum=0.9):
        if len(input_shape) != 3 or min(input_shape) < 1:
            raise ValueError(f"input_shape is (H, W, C), got {input_shape}")
        self.input_shape = tuple(int(s) for s in input_shape)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 (or float64 for gradient checks), got {self.dtype}")
        self.eps, self.bn_momentum = eps, bn_momentum
        self.units = []
        self.classes = None
        self._shape = self.input_shape  # the output shape of the chain so far
        self._block = None              # (the unit whose input is saved, its shortcut kind) while open
        self._pending = None            # ("shortcut", layer) or ("projection",) for the next unit
        self.arena = None
        self._n = 0  # the batch of the last training forward, which backward reads (0: none)

    # ------------------------------------------------------------------ building

    def conv(self, channels, *, kernel=3, stride=1, padding="same", pool=None):
        """Append a unit: [BN-ReLU] -> [pool: None, 'max' (3x3/2), 'avg' (2x2/2)] -> conv. Returns the unit."""
        if self.classes is not None:
            raise ValueError("the classifier ends the net: add units before it")
        if pool not in (None, "max", "avg"):
            raise ValueError(f"pool must be None, 'max' or 'avg', got {pool!r}")
        pool_layer = {None: None, "max": lambda s: layers.MaxPool(s, kernel=3, stride=2, padding="same"),
                      "avg": lambda s: layers.AvgPool(s, kernel=2, stride=2)}[pool]
        pool_layer = pool_layer(self._shape) if pool_layer else None
        conv_in = pool_layer.out_shape if pool_layer else self._shape
        conv = layers.Conv2D(conv_in, channels, kernel=kernel, stride=stride, padding=padding)
        return self._append(conv, pool_layer)

    def classifier(self, classes):
        """End the net: BN-ReLU -> global average pool -> fully connected -> softmax cross-entropy."""
        if self.classes is not None:
            raise ValueError("the net already has a classifier")
        if self._block is not None:
            raise ValueError("close the residual block before the classifier")
        if int(classes) < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {classes}")
        pool = layers.GlobalAvgPool(self._shape)
        fc = layers.Conv2D(pool.out_shape, int(classes), kernel=1, bias=True)
        self._append(fc, pool)
        self.classes = int(classes)

    @contextlib.contextmanager
    def residual(self, *, shortcut="parameter-free"):
        """A residual block: the input of its first unit is added to the input of the unit after it.

        shortcut="parameter-free" (the reference): identity, or average-pool by the stride and
        zero-pad the channels where the block changes shape. shortcut="projection": a 1x1 conv
        (with the stride) of the first unit's pre-activated input, as in pre-activation ResNets.
        """
        if shortcut not in ("parameter-free", "projection"):
            raise ValueError(f"shortcut must be 'parameter-free' or 'projection', got {shortcut!r}")
        if self._block is not None:
            raise ValueError("residual blocks cannot nest: minibp keeps one outstanding residual (METHOD.md)")
        if not self.units:
            raise ValueError("a residual block needs a unit on the data before it")
        first_index, in_shape = len(self.units), self._shape
        self._block = shortcut
        yield
        self._block = None
        if len(self.units) == first_index:
            raise ValueError("a residual block needs at least one unit")
        first = self.units[first_index]
        if shortcut == "projection":
            Ho, Wo, Co = self._shape
            H = first.conv_in_shape[0]
            if H % Ho:
                raise ValueError(f"no projection maps {in_shape} to {self._shape} with an integer stride")
            first.projection = layers.Conv2D(first.conv_in_shape, Co, kernel=1, stride=H // Ho)
            self._pending = ("projection", None)
        else:
            self._pending = ("shortcut", layers.ParameterFreeShortcut(in_shape, self._shape))
        first.saves_input = shortcut == "parameter-free"

    def _append(self, conv, pool):
        unit = Unit(len(self.units), self._shape, conv, batchnorm=bool(self.units), pool=pool)
        if self._pending is not None:
            kind, layer = self._pending
            unit.shortcut, unit.adds_projection = layer, kind == "projection"
            self._pending = None
        self.units.append(unit)
        self._shape = conv.out_shape
        return unit

    # ------------------------------------------------------------------ parameters

    def parameter_table(self):
        """[(name, shape, decayed)]: conv/FC weights (decayed) first, then BN gamma/beta and biases."""
        decayed, other = [], []
        for u in self.units:
            decayed.append((f"unit{u.index}.w", u.conv.weight_shape, True))
            if u.projection is not None:
                decayed.append((f"unit{u.index}.projection", u.projection.weight_shape, True))
            if u.batchnorm:
                other += [(f"unit{u.index}.gamma", (u.in_shape[2],), False),
                          (f"unit{u.index}.beta", (u.in_shape[2],), False)]
            if u.conv.has_bias:
                other.append((f"unit{u.index}.bias", (u.conv.cout,), False))
        return decayed + other

    @property
    def num_parameters(self):
        return sum(int(np.prod(s)) for _, s, _ in self.parameter_table())

    @property
    def num_decayed(self):
        return sum(int(np.prod(s)) for _, s, d in self.parameter_table() if d)

    # ------------------------------------------------------------------ planning

    def _check_complete(self):
        if self.classes is None:
            raise ValueError("the net has no classifier yet: call net.classifier(classes)")

    def plan(self, *, batch, mode="4", input_grad=False, cudnn_workspace_bytes=None):
        """The table of every buffer a training step at this batch needs; allocates nothing.

        cudnn_workspace_bytes: the cuDNN path's workspace (known once its plans are built on the GPU);
        None for the GEMM path."""
        self._check_complete()
        _, bits, _ = parse_mode(mode)
        N, dtype, units = positive_int(batch, "batch"), self.dtype, self.units
        for u in units:
            if bits and u.batchnorm and u.in_shape[2] % (8 // bits):
                raise ValueError(f"unit {u.index} has {u.in_shape[2]} channels: at {bits} bits the channel "
                                 f"count must be a multiple of {8 // bits}")
        size = lambda shape: N * int(np.prod(shape))  # noqa: E731 - elements of a batch of this shape
        plan = Plan()
        plan.add("input", (N,) + self.input_shape, dtype, "input batch")                 # (N, H, W, C)
        plan.add("labels", (N,), np.int64, "input batch")                                # (N,)
        shared = "shared activations/gradients"
        acts = [size(u.out_shape) for u in units[:-1]] + [size(u.in_shape) for u in units[1:]]
        plan.add("act0", (max(acts + [1]),), dtype, shared)   # unit outputs, then gradients, in turn
        plan.add("act1", (max(acts + [1]),), dtype, shared)
        plan.add("a", (max(size(u.in_shape) for u in units),), dtype, shared)     # BN-ReLU output / a~
        plan.add("da", (max(size(u.in_shape) for u in units),), dtype, shared)    # its gradient
        pooled = [size(u.conv_in_shape) for u in units if u.pool is not None]
        if pooled:
            plan.add("pooled", (max(pooled),), dtype, shared)
            plan.add("dpooled", (max(pooled),), dtype, shared)
        residuals = [size(u.in_shape) for u in units if u.saves_input]
        residuals += [size(u.in_shape) for u in units if u.adds_projection]  # the projection's output
        if residuals:
            plan.add("residual", (max(residuals),), dtype, "residual (and its gradient)")
        workspace = [int(np.prod(u.conv.workspace_shape(N, accumulate_dx=u.projection is not None)))
                     for u in units]
        workspace += [int(np.prod(u.projection.workspace_shape(N))) for u in units if u.projection is not None]
        plan.add("col", (max(workspace + [1]),), dtype, "workspace")                   # im2col / dcol
        bn_units = [u for u in units if u.batchnorm]
        channels = [u.in_shape[2] for u in bn_units] or [1]
        chunks = [layers.reduction_chunks(size(u.in_shape) // u.in_shape[2]) * u.in_shape[2] for u in bn_units]
        plan.add("partial", (2 * max(chunks + [1]),), dtype, "workspace")            # per-channel partial sums
        plan.add("bn_sums", (2 * max(channels),), dtype, "workspace")                # this batch's dbeta, dgamma
        plan.add("logits", (N, self.classes), dtype, "workspace")
        plan.add("dlogits", (N, self.classes), dtype, "workspace")
        for u in bn_units:
            C = u.in_shape[2]
            if bits == 0:
                plan.add(f"store{u.index}", (size(u.in_shape),), dtype, "activation stores")      # x, exact
            else:
                plan.add(f"store{u.index}", (size(u.in_shape) * bits // 8,), np.uint8, "activation stores")
            plan.add(f"stats{u.index}", (5, C), dtype, "batch-norm statistics")  # mean, sigma, gamma_c, b, shift
        S = sum(u.in_shape[2] for u in bn_units)
        # running mean and variance of every BN unit, channels concatenated in unit order, and their values
        # before this step's forward: a step whose loss is not finite puts them back
        plan.add("running", (2, S), dtype, "batch-norm statistics")           # (2, S)
        plan.add("running_before", (2, S), dtype, "batch-norm statistics")    # (2, S)
        n_params = self.num_parameters
        plan.add("params", (n_params,), dtype, "parameters")
        plan.add("grads", (n_params,), dtype, "gradients")
        plan.add("velocity", (n_params,), dtype, "momentum")
        if input_grad:
            plan.add("input_grad", (N,) + self.input_shape, dtype, "input gradient")
        if cudnn_workspace_bytes is not None:
            plan.add("cudnn_workspace", (max(cudnn_workspace_bytes, 1),), np.uint8, "workspace")
            plan.add("cudnn_dw", (max(int(np.prod(s)) for _, s, d in self.parameter_table() if d),), dtype,
                     "workspace")  # one weight gradient before it is added in
        return plan

    def compile(self, *, batch, mode="4", seed=0, input_grad=False, conv="gemm"):
        """Allocate the arena for a training step at this batch and mode, and initialise parameters.

        conv="gemm" (im2col + xp.matmul, both devices) or "cudnn" (GPU: NVIDIA's cuDNN frontend, for
        every convolution but the classifier; see cudnn_conv.py)."""
        if conv not in ("gemm", "cudnn"):
            raise ValueError(f"conv must be 'gemm' or 'cudnn', got {conv!r}")
        plan = self.plan(batch=batch, mode=mode, input_grad=input_grad)  # checks everything before allocating
        self.mode, self.bits, self.naive = parse_mode(mode)
        self.batch = positive_int(batch, "batch")
        for u in self.units:  # a recompile starts from the GEMM path
            for layer in (u.conv, u.projection):
                if layer is not None:
                    layer.engine = None
        engines = self._cudnn_graphs(self.batch) if conv == "cudnn" else {}
        workspace = max([g.workspace_bytes for g in engines.values()] + [0]) if engines else None
        if workspace is not None:
            plan = self.plan(batch=batch, mode=mode, input_grad=input_grad, cudnn_workspace_bytes=workspace)
        self.arena = Arena(plan)
        for layer, graphs in engines.items():
            layer.engine = CudnnEngine(graphs, workspace=self.arena["cudnn_workspace"],
                                       dw_scratch=self.arena["cudnn_dw"])
        self.params, self.grads = self.arena["params"], self.arena["grads"]
        self.param_views, self.grad_views = {}, {}
        offset = 0
        for name, shape, _ in self.parameter_table():
            n = int(np.prod(shape))
            self.param_views[name] = self.params[offset:offset + n].reshape(shape)
            self.grad_views[name] = self.grads[offset:offset + n].reshape(shape)
            offset += n
        self.running_views, offset = {}, 0  # unit index -> its (2, C) columns of the running statistics
        for u in self.units:
            if u.batchnorm:
                C = u.in_shape[2]
                self.running_views[u.index] = self.arena["running"][:, offset:offset + C]
                offset += C
        self.initialize(seed=seed)
        self._n = 0
        return self

    def _cudnn_graphs(self, batch):
        """{conv layer: built ConvGraphs} for every conv but the classifier's (GPU only)."""
        if self.dtype != np.float32:
            raise ValueError("the cuDNN path is float32 only")
        handle = make_handle()
        layers_ = [u.conv for u in self.units if not u.is_classifier]
        layers_ += [u.projection for u in self.units if u.projection is not None]
        graphs = {}
        for layer in layers_:
            graphs[layer] = ConvGraphs(layer, batch=batch)
            graphs[layer].build(handle)
        return graphs

    def initialize(self, *, seed=0):
        """He-normal conv weights, N(0, 1/fan_in) classifier weights, gamma 1, beta 0, bias 0; running stats
        (0, 1); zero gradients and momentum."""
        rng = np.random.default_rng(seed)
        host = np.empty(self.num_parameters, self.dtype)
        offset = 0
        for name, shape, decayed in self.parameter_table():
            n = int(np.prod(shape))
            if decayed:
                fan_in = int(np.prod(shape[1:]))  # (Cout, kh, kw, Cin)
                gain = 1.0 if name == f"unit{self.units[-1].index}.w" else 2.0
                host[offset:offset + n] = rng.standard_normal(n) * np.sqrt(gain / fan_in)
            else:
                host[offset:offset + n] = 1.0 if name.endswith(".gamma") else 0.0
            offset += n
        self.params[...] = backend.xp.asarray(host)
        self.grads[...] = 0
        self.arena["velocity"][...] = 0
        self.arena["running"][0], self.arena["running"][1] = 0, 1

    # ------------------------------------------------------------------ buffers

    def _view(self, name, shape, n):
        """The first n*prod(shape) elements of a shared buffer, as (n,) + shape."""
        flat = self.arena[name].reshape(-1)
        return flat[: n * int(np.prod(shape))].reshape((n,) + tuple(shape))

    def _store(self, u, n):
        """(x_copy, None) in exact mode, (None, codes) at k bits: unit u's store for a batch of n."""
        store, values = self.arena[f"store{u.index}"], n * int(np.prod(u.in_shape))
        if self.bits == 0:
            return store[:values].reshape((n,) + u.in_shape), None
        return None, store[: values * self.bits // 8]

    # ------------------------------------------------------------------ forward

    def _check_batch(self, images, labels):
        if self.arena is None:
            raise RuntimeError("compile the net first: net.compile(batch=..., mode=...)")
        if not hasattr(images, "shape") or images.ndim != 4 or tuple(images.shape[1:]) != self.input_shape:
            raise ValueError(f"images must be (N, {', '.join(map(str, self.input_shape))}) NHWC, got "
                             f"{getattr(images, 'shape', type(images).__name__)}")
        n = images.shape[0]
        if not 1 <= n <= self.batch:
            raise ValueError(f"a batch of {n} images does not fit the {self.batch} the net was compiled for")
        if images.dtype != self.dtype:
            raise ValueError(f"images must be {self.dtype} (the net's dtype), got {images.dtype}")
        if labels is not None:
            layers.check_labels(labels, n, self.classes)
        return n

    def forward(self, images, labels, *, train=True, check_finite=True):
        """Run the chain on a batch (N <= the compiled batch); returns (loss, accuracy) as floats.

        train=True uses batch statistics, updates the running ones and writes every unit's store for
        backward(); train=False uses the running statistics and writes no store. A loss that is not
        finite leaves the running statistics as they were and raises FloatingPointError (unless
        check_finite=False).
        """
        if labels is None:
            raise ValueError("forward() needs labels (N,) to compute the loss")
        n = self._check_batch(images, labels)
        xp = backend.xp
        if train:
            xp.copyto(self.arena["running_before"], self.arena["running"])
        x = self._view("input", self.input_shape, n)
        xp.copyto(x, xp.asarray(images))
        labels_device = self.arena["labels"][:n]
        xp.copyto(labels_device, xp.asarray(labels).astype(np.int64, copy=False))
        act = 0
        for u in self.units:
            if u.is_classifier:
                out = self.arena["logits"][:n].reshape((n,) + u.out_shape)
            else:
                out = self._view(f"act{act}", u.out_shape, n)
                act = 1 - act
            self._forward_unit(u, x, out, n, train=train)
            x = out
        logits = self.arena["logits"][:n]
        loss, accuracy = layers.softmax_cross_entropy(logits, labels_device)
        loss, accuracy = float(loss), float(accuracy)  # the one host round-trip of a step
        self._n = n if train else 0
        if not np.isfinite(loss):
            if train:  # this batch's statistics must not reach later evaluations
                xp.copyto(self.arena["running"], self.arena["running_before"])
            if check_finite:
                self._n = 0
                raise FloatingPointError(f"the loss is {loss}")
        return loss, accuracy

    def _forward_unit(self, u, x, out, n, *, train):
        p = self.param_views
        if u.shortcut is not None:
            u.shortcut.add(self._view("residual", u.shortcut.in_shape, n), x)
        elif u.adds_projection:
            x += self._view("residual", u.in_shape, n)
        if u.saves_input:
            backend.xp.copyto(self._view("residual", u.in_shape, n), x)
        a = x
        if u.batchnorm:
            a = self._view("a", u.in_shape, n)
            stats, running = self.arena[f"stats{u.index}"], self.running_views[u.index]
            gamma, beta = p[f"unit{u.index}.gamma"], p[f"unit{u.index}.beta"]
            if train:
                layers.batchnorm_statistics(x, stats, partial=self.arena["partial"])
                rows = n * u.in_shape[0] * u.in_shape[1]
                m = self.bn_momentum
                running[0] *= m
                running[0] += (1 - m) * stats[0]
                running[1] *= m
                running[1] += (1 - m) * rows / max(rows - 1, 1) * stats[1]  # unbiased variance
            else:
                stats[0], stats[1] = running[0], running[1]
            layers.batchnorm_coefficients(gamma, beta, stats, eps=self.eps, bits=self.bits)
            if train:
                x_copy, codes = self._store(u, n)
            elif self.naive:  # the naive net feeds a~ forward when it is evaluated, too
                x_copy, codes = None, self._store(u, n)[1]
            else:
                x_copy = codes = None
            layers.batchnorm_relu_forward(x, stats, beta, a, bits=self.bits if codes is not None else 0,
                                          naive=self.naive, x_copy=x_copy, codes=codes)
        if u.pool is not None:
            pooled = self._view("pooled", u.conv_in_shape, n)
            u.pool.forward(a, pooled)
            a = pooled
        col = self.arena["col"]
        u.conv.forward(a, p[f"unit{u.index}.w"], p.get(f"unit{u.index}.bias"), out, col=col)
        if u.projection is not None:
            u.projection.forward(a, p[f"unit{u.index}.projection"], None,
                                 self._view("residual", u.projection.out_shape, n), col=col)

    # ------------------------------------------------------------------ backward

    def backward(self, *, loss_scale=1.0):
        """Accumulate (+=) scale * dL/dparams into the gradients, reading only the units' stores.

        Call after forward(train=True). With input_grad=True at compile, dL/dimages lands in
        net.arena["input_grad"].
        """
        if self.arena is None:
            raise RuntimeError("compile the net first: net.compile(batch=..., mode=...)")
        if not self._n:
            raise RuntimeError("backward() needs a training forward() first")
        n = self._n
        logits, labels = self.arena["logits"][:n], self.arena["labels"][:n]
        dlogits = self.arena["dlogits"][:n]
        layers.softmax_cross_entropy_backward(logits, labels, dlogits, scale=loss_scale)
        dy = dlogits.reshape((n,) + self.units[-1].out_shape)
        act = 0
        for u in reversed(self.units):
            if u.index == 0:
                dx = self._view("input_grad", u.in_shape, n) if "input_grad" in self.arena else None
            else:
                dx = self._view(f"act{act}", u.in_shape, n)
                act = 1 - act
            self._backward_unit(u, dy, dx, n)
            dy = dx
        self._n = 0  # the stores now hold nothing backward may read twice

    def _backward_unit(self, u, dy, dx, n):
        p, g = self.param_views, self.grad_views
        name = f"unit{u.index}"
        col = self.arena["col"]
        x_copy, codes = self._store(u, n) if u.batchnorm else (None, None)
        if u.batchnorm:  # restore a~ (or recompute a exactly) from the store
            a = self._view("a", u.in_shape, n)
            layers.batchnorm_relu_restore(self.arena[f"stats{u.index}"], p[f"{name}.beta"], a, bits=self.bits,
                                          x_copy=x_copy, codes=codes)
        else:
            a = self._view("input", u.in_shape, n)
        conv_in = a
        if u.pool is not None:
            conv_in = self._view("pooled", u.conv_in_shape, n)
            u.pool.forward(a, conv_in)
        needs_dx = u.batchnorm or dx is not None
        if u.pool is not None:
            dconv_in = self._view("dpooled", u.conv_in_shape, n)
        elif u.batchnorm:
            dconv_in = self._view("da", u.in_shape, n)
        else:
            dconv_in = dx
        if u.projection is not None:  # the residual gradient waiting in the buffer came through it
            dres = self._view("residual", u.projection.out_shape, n)
            u.projection.backward(conv_in, p[f"{name}.projection"], dres, dw=g[f"{name}.projection"],
                                  dx=dconv_in if needs_dx else None, col=col)
        u.conv.backward(conv_in, p[f"{name}.w"], dy, dw=g[f"{name}.w"], dbias=g.get(f"{name}.bias"),
                        dx=dconv_in if needs_dx else None, accumulate_dx=u.projection is not None, col=col)
        if not needs_dx:
            return
        if u.pool is not None:
            da = self._view("da", u.in_shape, n) if u.batchnorm else dx
            u.pool.backward(a, dconv_in, da)
        else:
            da = dconv_in
        residual_grad = self._view("residual", u.in_shape, n) if u.saves_input else None
        if u.batchnorm:
            layers.batchnorm_relu_backward(da, self.arena[f"stats{u.index}"], p[f"{name}.beta"], dx, bits=self.bits,
                                           x_copy=x_copy, codes=codes, dgamma=g[f"{name}.gamma"],
                                           dbeta=g[f"{name}.beta"], partial=self.arena["partial"],
                                           sums=self.arena["bn_sums"][: 2 * u.in_shape[2]].reshape(2, u.in_shape[2]),
                                           residual_grad=residual_grad)
        elif residual_grad is not None:
            dx += residual_grad
        if u.shortcut is not None:
            u.shortcut.backward(dx, self._view("residual", u.shortcut.in_shape, n))
        elif u.adds_projection:
            backend.xp.copyto(self._view("residual", u.in_shape, n), dx)

    # ------------------------------------------------------------------ utilities

    def zero_grad(self):
        if self.arena is None:
            raise RuntimeError("compile the net first: net.compile(batch=..., mode=...)")
        self.grads[...] = 0

    def describe(self):
        """One line per unit: index, input shape, BN, pool, conv, residual wiring."""
        lines = []
        for u in self.units:
            parts = [f"unit {u.index:4d}  in {u.in_shape}"]
            if u.shortcut is not None or u.adds_projection:
                parts.append("+residual")
            parts.append("BN-ReLU" if u.batchnorm else "")
            if u.pool is not None:
                parts.append(type(u.pool).__name__)
            c = u.conv
            parts.append(f"{'fc' if u.is_classifier else 'conv'} {c.kh}x{c.kw}/{c.stride} -> {c.out_shape}")
            if u.saves_input or u.projection is not None:
                parts.append("saves residual" + (" (projection)" if u.projection is not None else ""))
            lines.append("  ".join(x for x in parts if x))
        return "\n".join(lines)
