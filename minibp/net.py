"""The net: a chain of units (units.py), the buffers they share, and the schedule through them.

    net = Net(input_shape=(32, 32, 3))
    net.conv(16, kernel=3)                       # unit 0, on the data: no BN
    with net.residual():                         # the next unit's input is saved ...
        net.conv(16, kernel=1)
        net.conv(64, kernel=3)
    net.classifier(10)                           # ... and added to this unit's input
    print(net.plan(pass_images=128, bits=4).summary())
    net.compile(pass_images=128, bits=4)         # one allocation: passes of up to 128 images
    loss, accuracy = net.forward(images, labels) # exact forward; each unit writes its k-bit store
    net.backward()                               # reads only the stores; grads += dL/dparams
    logits = net.predict(images)                 # running statistics, no labels

Each pass (a training forward, an evaluation forward, the loss, the backward) is recorded once as a program of
bound device calls, when the net compiles (and at the first use of another pass size), and replayed
(program.py): the API below runs those programs, and a training step (step.py) replays them in turn, on the GPU
as one CUDA graph.

Forward writes each unit's exact output into act0 and act1 in turn while the unit writes its store;
backward walks the units in reverse, each restoring its activation from its store, the gradients
flowing through the same buffers. One residual is outstanding at a time, in `residual`. `bits` names
the store: "exact" (ordinary backprop), 8, 4, 2 (k-bit codes), or "naive" (4 bits fed forward: the
ablation whose errors compound). docs/method.md derives all of it ("The schedule through shared buffers").
"""

import warnings

import numpy as np

from . import backend, checks, program
from . import params as table
from .arena import Arena, Plan
from .chain import Chain
from .checks import positive_int
from .optim import OPTIMIZERS, SCALARS, norm_chunks
from .params import key
from .layers.bn import rounding_keys, update_running
from .layers.conv import ConvPath
from .layers.loss import softmax_cross_entropy, softmax_cross_entropy_backward
from .quant import DEFAULT_ROUNDING, DEFAULT_WINDOW, Store, per_unit
from .units import Pass


class _NotGiven:
    """The default of plan()'s and compile()'s pass_images and batch (its old name): told from a None given, which
    is refused as a count."""

    def __repr__(self):
        return "<not given>"


NOT_GIVEN = _NotGiven()


# The net's own buffers, beside the units' (each unit's store, windows and statistics, layers/bn.py):
#   input (N, H, W, C), labels (N,), logits / dlogits (N, classes)       a pass's images and the loss
#   act0, act1 (max unit output or input)                                 unit outputs, then gradients, in turn
#   residual (max saved input or projection output)                      the outstanding residual (and its grad)
#   params, grads, velocity (P,)                                         decayed weights first (optim.py)
#   second_moment (P,)                                                   AdamW's (velocity is its first moment)
#   grad_sums (ceil(P / NORM_CHUNK),) and grad_norm (1,), float64        the gradient norm's partial sums of squares
#                                                                        and the norm, which clips and is logged
#   running, running_before (2, S)      BN running mean/variance of every unit's channels, and their values
#                                       before this step: a step whose loss is not finite puts them back
#   loss (2, 2), float64                 [this forward's loss, accuracy], [their sums over a step's sub-batches]
#   loss_rows (N, 2)                     each image's loss and whether it was right (layers/loss.py)
#   class_weights (classes,)             a training loss's weight of each class (compile(class_weights=...))
#   scalars (3,), float64                the optimizer's values that change a step: lr, AdamW's two bias corrections
#                                        (optim.py), written before each step so one recorded step serves a run
#   draw (1,), rounding_keys (units,)    stochastic rounding, int64: the forward pass's draw, which counts itself
#                                        on, and each unit's key in the pass (kernels/bn.cu rounding_keys)
# and the buffers the units share, each sized to the largest request (units.py's shared_sizes):
SHARED = {"a": "shared activations/gradients", "da": "shared activations/gradients",    # BN-ReLU output, grad
          "pooled": "shared activations/gradients", "dpooled": "shared activations/gradients",  # pooled a, grad
          "col": "workspace", "partial": "workspace", "bn_sums": "workspace"}  # conv; BN partial and whole sums


class Net(Chain):
    """A chain of units (build it with conv/residual/classifier or add: chain.py); plan, compile, train."""

    def __init__(self, input_shape, *, dtype=np.float32, eps=1e-5, bn_momentum=0.9):
        self.input_shape, self.dtype = checks.net_input(input_shape, dtype)
        self.eps, self.bn_momentum = eps, bn_momentum
        super().__init__(self.input_shape)
        self.arena, self.training, self.conv_path = None, None, None  # set by compile
        self.stores = ()                # (quant.Store,) one a unit, set by compile ...
        self.unit_stores = ()           # ... those of the units that keep a store
        self.stochastic = self.naive = False  # a store rounds at random; one is fed forward (read each forward)
        self.label_smoothing = 0.0      # the training loss's options, set by compile (layers/loss.py)
        self.pass_images = None         # the most images of one pass, set by compile
        self._n = 0                     # the images of the last training forward, which backward reads
        self.deferred_running = None    # (2, S) while defer_running() defers the running statistics' updates
        self._programs = {}             # the recorded passes (program()), dropped by a compile

    # ------------------------------------------------------------------ the table and the plan

    # ------------------------------------------------------------------ the net as data

    def structure(self):
        """The net as plain data (JSON), or None for a net with a unit that chain.py's recipe cannot hold: its input
        shape, dtype, eps, batch-norm momentum and recipe (chain.py). A checkpoint keeps it, so that a trained run
        loads through from_structure() without importing, or running, any code of its own."""
        if self.recipe is None:
            return None
        return dict(input_shape=list(self.input_shape), dtype=np.dtype(self.dtype).name, eps=float(self.eps),
                    bn_momentum=float(self.bn_momentum), recipe=self.recipe)

    @classmethod
    def from_structure(cls, structure, *, input_shape=None, classes=None):
        """The uncompiled net a structure() describes; input_shape and classes: other data's, a fine-tune's (the same
        calls on another shape, another classifier). A ValueError naming what is not a net's structure."""
        if not isinstance(structure, dict) or set(structure) != {"input_shape", "dtype", "eps", "bn_momentum",
                                                                 "recipe"}:
            raise ValueError("it is not a net's structure (input_shape, dtype, eps, bn_momentum, recipe)")
        shape, dtype = structure["input_shape"], structure["dtype"]
        if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape) \
                or dtype not in ("float32", "float64") or not all(
                    isinstance(structure[k], float) and 0 <= structure[k] < 1 for k in ("eps", "bn_momentum")):
            raise ValueError(f"its input_shape {shape!r}, dtype {dtype!r}, eps or bn_momentum is not a net's")
        recipe = structure["recipe"]
        if classes is not None and isinstance(recipe, list) and recipe and isinstance(recipe[-1], dict) \
                and set(recipe[-1]) == {"classifier"}:
            recipe = recipe[:-1] + [{"classifier": int(classes)}]
        net = cls(tuple(shape) if input_shape is None else tuple(input_shape), dtype=np.dtype(dtype),
                  eps=structure["eps"], bn_momentum=structure["bn_momentum"])
        net.replay(recipe)
        if net.classes is None:
            raise ValueError("its recipe ends in no classifier")
        return net

    def parameter_table(self):
        """[(name, unit, Param)] in the flat vector's order (params.py)."""
        return table.parameter_table(self.units)

    num_parameters = property(lambda self: sum(int(np.prod(p.shape)) for _, _, p in self.parameter_table()))
    num_decayed = property(lambda self: sum(int(np.prod(p.shape)) for _, _, p in self.parameter_table() if p.decayed))

    def _stores(self, store, **words):
        """One quant.Store a unit (quant.per_unit) from plan()'s or compile()'s store or its words."""
        return per_unit(_store(store, **words), len(self.units))

    @property
    def store(self):
        """The one quant.Store every unit keeps; None for a mix (a memory budget's: `stores` has them)."""
        kept = set(self.unit_stores) or set(self.stores[:1])
        return kept.pop() if len(kept) == 1 else None


    def plan(self, *, pass_images=NOT_GIVEN, bits="4", window=DEFAULT_WINDOW, store=None, training=True,
             input_grad=False, conv_path=None, optimizer="sgd", grad_norm=False, class_weights=False, batch=NOT_GIVEN):
        """The table of every buffer passes of up to pass_images images need at this store (store: a quant.Store for
        every unit, a list of one a unit (a mix: quant.per_unit), or the one Store(bits, window) names); allocates
        nothing. training=False: an evaluation's (no stores, gradients or momentum). conv_path: a built ConvPath adds
        the buffers its convs need (cuDNN's). optimizer: "sgd" (momentum) or "adamw" (its second moment too);
        grad_norm=True: the buffers of the global gradient norm (optim.py: clipping, last_grad_norm);
        class_weights=True: the loss's weight of each class. They matter only to a training plan. batch=:
        pass_images's old name, for a release (a DeprecationWarning)."""
        stores = self._stores(store, bits=bits, window=window)
        N = self._check_request(pass_images=_pass_images(pass_images, batch, "plan"), stores=stores,
                                optimizer=optimizer, grad_norm=grad_norm)
        dtype, units = self.dtype, self.units
        plan = Plan()
        plan.add("input", (N,) + self.input_shape, dtype, "input batch")
        plan.add("labels", (N,), np.int64, "input batch")
        acts = [N * int(np.prod(u.out_shape)) for u in units[:-1]]
        acts += [N * int(np.prod(u.in_shape)) for u in units[1:]] if training else []
        for name in ("act0", "act1"):
            plan.add(name, (max(acts + [1]),), dtype, "shared activations/gradients")
        residuals = [N * int(np.prod(u.in_shape)) for u in units if u.saves_input or u.adds_projection]
        if residuals:
            plan.add("residual", (max(residuals),), dtype, "residual (and its gradient)")
        sizes = [u.shared_sizes(N, training=training) for u in units]
        for name, category in SHARED.items():
            if any(name in s for s in sizes):
                plan.add(name, (max([s.get(name, 0) for s in sizes] + [1]),), dtype, category)
        plan.add("logits", (N, self.classes), dtype, "workspace")
        plan.add("loss", (2, 2), np.float64, "workspace")
        plan.add("loss_rows", (N, 2), dtype, "workspace")
        if training:
            plan.add("dlogits", (N, self.classes), dtype, "workspace")
            plan.add("scalars", (len(SCALARS),), np.float64, "workspace")
            plan.add("draw", (1,), np.int64, "workspace")  # (planned whatever the rounding: it costs no memory)
            plan.add("rounding_keys", (len(units),), np.int64, "workspace")
            if class_weights:
                plan.add("class_weights", (self.classes,), dtype, "workspace")
        for u, store in zip(units, stores):  # each unit's store, windows and statistics, sized by its own store
            for own in u.own_buffers(N, store=store, keep=training or store.naive):
                plan.add(key(u.index, own.role), own.shape, own.dtype or dtype, own.category)
        S = sum(u.bn_channels for u in units)
        plan.add("running", (2, S), dtype, "batch-norm statistics")
        P = self.num_parameters
        plan.add("params", (P,), dtype, "parameters")
        if training:
            plan.add("running_before", (2, S), dtype, "batch-norm statistics")
            plan.add("grads", (P,), dtype, "gradients")
            plan.add("velocity", (P,), dtype, "momentum")
            if optimizer == "adamw":
                plan.add("second_moment", (P,), dtype, "second moment")
            if grad_norm:
                plan.add("grad_sums", (norm_chunks(P),), np.float64, "workspace")
                plan.add("grad_norm", (1,), np.float64, "workspace")
        if input_grad:
            plan.add("input_grad", (N,) + self.input_shape, dtype, "input gradient")
        if conv_path is not None:
            conv_path.plan_buffers(plan, dtype=dtype)
        return plan

    def _check_request(self, *, pass_images, stores, optimizer, grad_norm):
        """pass_images (a positive int) once a plan of it could be made; a one-line error naming the fault."""
        if self.classes is None:
            raise ValueError("the net has no classifier yet: call net.classifier(classes)")
        _check_optimizer(optimizer, grad_norm)
        N = positive_int(pass_images, "pass_images")
        checks.check_channels(self.units, [s.k for s in stores])
        return N

    # ------------------------------------------------------------------ allocation and state

    def compile(self, *, pass_images=NOT_GIVEN, bits="4", window=DEFAULT_WINDOW, rounding=DEFAULT_ROUNDING, clip=None,
                store=None, seed=0, training=True, input_grad=False, conv="auto", optimizer="sgd", grad_norm=False,
                label_smoothing=0.0, class_weights=None, check_plan=None, batch=NOT_GIVEN):
        """Allocate the arena for passes of up to pass_images images (forward or backward; a training step of
        sub-batches runs several: step.py) at this store. The store (quant.Store) is given whole, as a
        list of one a unit (a mix of bits, as a memory budget solves it: quant.per_unit), or by its words: `bits`
        ("exact", 8, 4, 2 or "naive"), `window`, the k-bit codes' window ("range", "block" or "fixed"; the naive
        ablation's is fixed), `rounding`, how a value becomes a code
        ("nearest" or "stochastic"; stochastic draws from seed and forward()'s draw), and `clip`, the range or
        block window's in standard deviations (None: quant.Store's default for the window and bits). The first compile
        initialises the parameters (initialize(seed=...)); a later one keeps the trained state. conv, the path
        each conv computes through (ConvPath): "auto" (the direct kernels on the CPU in float32, else
        im2col + GEMM), "gemm", "direct" (CPU, float32) or "cudnn" (GPU: NVIDIA's cuDNN frontend for every
        conv but the classifier). optimizer ("sgd" or "adamw") and grad_norm plan the optimizer's buffers (plan()):
        optim.AdamW needs optimizer="adamw", clipping grad_norm=True. label_smoothing (in [0, 1)) and class_weights
        ((classes,) non-negative numbers, or None) make the training loss's target and weights (layers/loss.py).
        check_plan: called with the plan before anything is allocated, to refuse it by raising
        (run/sizing.compile_within_memory: does it fit?). batch=: pass_images's old name, for a release (a
        DeprecationWarning); net.pass_images is the number compiled for."""
        stores = self._stores(store, bits=bits, window=window, rounding=rounding, clip=clip)
        n = self._check_request(pass_images=_pass_images(pass_images, batch, "compile"), stores=stores,
                                optimizer=optimizer, grad_norm=grad_norm)
        weights = self._check_loss(label_smoothing, class_weights, training=training)
        conv_path = ConvPath(conv, self.units, pass_images=n, dtype=self.dtype)
        plan = self.plan(pass_images=n, store=list(stores), training=training, input_grad=input_grad,
                         optimizer=optimizer, grad_norm=grad_norm, class_weights=weights is not None,
                         conv_path=conv_path)  # the one plan of this compile
        if check_plan is not None:
            check_plan(plan)
        kept = self.state() if self.arena is not None else None
        self.stores, self.seed = stores, seed
        self.unit_stores = tuple(s for u, s in zip(self.units, stores) if u.bn_channels)  # (decided once: forward
        self.stochastic = any(s.stochastic for s in self.unit_stores)                     # reads them each step)
        self.naive = any(s.naive for s in self.unit_stores)
        self.pass_images, self.training, self.conv_path = n, training, conv_path
        self.label_smoothing = float(label_smoothing)
        self.arena, self._programs = None, {}  # the old arena goes before the new one comes, with the passes on it
        self.arena = Arena(plan)
        if weights is not None:
            backend.copy_in(self.arena["class_weights"], weights)
        for name in ("loss", "draw"):  # (the draw counts the training forwards from 0)
            if name in self.arena:
                self.arena[name][...] = 0
        self.conv_path.attach(self.arena)
        self.param_views, self.grad_views = table.bind(self.units, self.arena)
        if kept is None:
            self.initialize(seed=seed)
        else:  # the net's own state, as it is (a diverged one says so at its next forward)
            table.set_state(self.units, self.arena, kept, require_finite=False)
        self._n = 0
        # every call checked and bound now, as a one-sub-batch TrainStep and forward() will replay them
        for kind in ("forward", "loss", "backward") if training else ("evaluate",):
            self.program(kind, n, accumulate=False)
        return self

    @property
    def batch(self):
        """pass_images's old name, for a release: read-only, a DeprecationWarning (a batch is now the images a step,
        an evaluation or a prediction takes from the data; a pass's are pass_images)."""
        warnings.warn("Net.batch is now Net.pass_images; batch goes in a later release", DeprecationWarning,
                      stacklevel=2)
        return self.pass_images

    def _check_loss(self, label_smoothing, class_weights, *, training):
        """compile()'s class weights as an array of the net's dtype (None where not given), once both loss options
        are checked: a training loss's, in range, one weight a class."""
        if label_smoothing != 0 or class_weights is not None:
            if not training:
                raise ValueError("label_smoothing and class_weights shape a training loss: an evaluation net "
                                 "(training=False) takes neither")
        if isinstance(label_smoothing, (bool, np.bool_)) or not isinstance(label_smoothing, (int, float, np.floating)) \
                or not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
        if class_weights is None:
            return None
        weights = np.asarray(class_weights)
        if weights.shape != (self.classes,) or weights.dtype.kind not in "iuf" or not np.isfinite(weights).all() \
                or (weights < 0).any() or not weights.any():
            raise ValueError(f"class_weights must be {self.classes} finite non-negative numbers, not all 0 (one a "
                             f"class), got {weights.dtype} {weights.shape}")
        return weights.astype(self.dtype)

    def initialize(self, *, seed=0):
        """Fresh parameters, running statistics (0, 1), zero gradients, momentum and second moment (params.py)."""
        self._check_compiled()
        table.initialize(self.units, self.arena, seed=seed, dtype=self.dtype)

    def state(self, *, copy=True):
        """The trained state as named host arrays (params.py): what a checkpoint keeps. copy=False: on the CPU
        read-only views of the arena, valid until the next step (a checkpoint's write: no second copy)."""
        self._check_compiled()
        return table.get_state(self.units, self.arena, copy=copy)

    def load_state(self, state):
        """Set parameters, running statistics and (optional) momentum and second moment from named arrays; a state
        that does not fit, or holds values that are not finite, is refused whole (ValueError)."""
        self._check_compiled()
        table.set_state(self.units, self.arena, state)

    # ------------------------------------------------------------------ forward

    def _check_images(self, images):
        self._check_compiled()
        checks.check_images(images, self.input_shape, self.dtype)

    def forward(self, images, labels, *, train=True, sync=True, draw=None):
        """(loss, accuracy) as floats of one pass's images (N <= pass_images). train: batch statistics, running
        ones updated, stores written for backward(); else the running statistics. A loss that is not finite
        leaves the running statistics as they were and raises FloatingPointError. sync=False: (loss,
        accuracy) stay on the device, unchecked: views of arena["loss"][0], which the next forward overwrites.
        draw (stochastic rounding): which random draw the stores take, with the compile's seed
        (quant.rounding_key); by default the training forward passes since compile are counted 0, 1, 2, ...
        (step.py numbers them by iteration and sub-batch, so that a resumed run draws as an uninterrupted one)."""
        if labels is None:
            raise ValueError("forward() needs labels (N,) to compute the loss; net.predict(images) needs none")
        self._check_images(images)
        if train and not self.training:
            raise RuntimeError("this net was compiled for evaluation (training=False): it cannot train")
        checks.check_labels(labels, images.shape[0], self.classes)
        n = self.load_batch(images, labels)
        if train and self.stochastic and draw is not None:
            backend.copy_in(self.arena["draw"], np.array([checks.index(draw, "draw")], np.int64))
        self.program("forward" if train else "evaluate", n).run()
        self.program("loss", n, accumulate=False).run()
        self._n = n if train else 0
        loss = self.arena["loss"][0]  # (loss, accuracy) of this pass
        if not sync:
            return loss[0], loss[1]
        loss, accuracy = (float(v) for v in backend.to_host(loss))  # the one host round-trip of an eager step
        if not np.isfinite(loss):
            if train:  # this pass's statistics must not reach later evaluations
                backend.xp.copyto(self.arena["running"], self.arena["running_before"])
            self._n = 0
            raise FloatingPointError(f"the loss is {loss}")
        return loss, accuracy

    def predict(self, images):
        """Logits (N, classes) on the host of any number of images, with the running statistics."""
        self._check_images(images)
        out = np.empty((images.shape[0], self.classes), self.dtype)
        for start in range(0, images.shape[0], self.pass_images):
            n = self.load_batch(images[start:start + self.pass_images])
            self.program("evaluate", n).run()
            out[start:start + n] = backend.to_host(self.arena["logits"][:n])
        return out

    def load_batch(self, images, labels=None):
        """Copy a pass's n <= pass_images images (and labels) into the input buffers the passes read; returns n."""
        n = images.shape[0]
        if not 1 <= n <= self.pass_images:
            raise ValueError(f"a pass of {n} images does not fit the {self.pass_images} the net was compiled for")
        backend.copy_in(self.arena["input"][:n], images)
        if labels is not None:
            backend.copy_in(self.arena["labels"][:n], labels.astype(np.int64, copy=False))
        return n

    # ------------------------------------------------------------------ the passes, recorded once

    PASSES = ("forward", "evaluate", "loss", "backward")

    def program(self, kind, n, *, loss_scale=1.0, accumulate=True):
        """The Program (program.py) of one pass over the first n images of the input buffers: "forward" (a training
        forward: the statistics, the running ones, the stores), "evaluate" (the running statistics), "loss" (the
        loss of the logits into arena["loss"], its sums over a step's sub-batches added to with accumulate) or
        "backward" (the loss's gradient, scaled by loss_scale, and every unit's, reading the stores; the gradients
        added to, or with accumulate=False set). Recorded at its first use, every call's arguments checked then
        (a compile records its passes of pass_images), and replayed after; a compile, or defer_running, records anew."""
        if kind not in self.PASSES:
            raise ValueError(f"a pass is one of {', '.join(self.PASSES)}, got {kind!r}")
        self._check_compiled()
        key = (kind, n, (loss_scale, accumulate) if kind == "backward" else accumulate if kind == "loss" else None,
               id(self.deferred_running))
        recorded = self._programs.get(key)
        if recorded is None:
            self.conv_path.check_pass(n)
            with program.record() as recorded:
                {"forward": lambda: self._forward(n, train=True), "evaluate": lambda: self._forward(n, train=False),
                 "loss": lambda: self._loss(n, accumulate),
                 "backward": lambda: self._backward(n, loss_scale, accumulate)}[kind]()
            self._programs[key] = recorded
        return recorded

    def record_anew(self):
        """Drop the recorded passes: the next use of each records it again (a benchmark that wraps a layer's function
        for a while: bench/stores.py)."""
        self._programs = {}

    def _forward(self, n, *, train):
        """The forward schedule: every unit from the input to the logits (and, under stochastic rounding, the units'
        keys of this pass first)."""
        pass_ = Pass(self, n, train=train)
        if pass_.keys is not None:
            rounding_keys(pass_.keys, self.arena["draw"], seed=self.seed)
        x, act = pass_.shared("input", self.input_shape), 0
        for u in self.units:
            if u.is_classifier:
                out = self.arena["logits"][:n].reshape((n,) + u.out_shape)
            else:
                out, act = pass_.shared(("act0", "act1")[act], u.out_shape), 1 - act
            residual = saved = None  # the block's schedule around the unit, which the unit takes in where it can
            if u.shortcut is not None and not u.shortcut.is_identity:
                u.shortcut.add(pass_.shared("residual", u.shortcut.in_shape), x)
            elif u.shortcut is not None or u.adds_projection:
                residual = pass_.shared("residual", u.in_shape)
            if u.saves_input:
                saved = pass_.shared("residual", u.in_shape)
            u.forward(x, out, pass_, residual=residual, saved=saved)
            x = out

    def _loss(self, n, accumulate):
        softmax_cross_entropy(self.arena["logits"][:n], self.arena["labels"][:n],
                                     rows=self.arena["loss_rows"][:n], loss=self.arena["loss"], accumulate=accumulate,
                                     **self._loss_options())

    def _loss_options(self):
        """The training loss's smoothing and class weights (their arena buffer, or None), as layers/loss.py takes
        them."""
        weights = self.arena["class_weights"] if "class_weights" in self.arena else None
        return dict(smoothing=self.label_smoothing, weights=weights)

    def _backward(self, n, loss_scale, accumulate):
        """The backward schedule: the loss's gradient, then every unit in reverse, reading only its store."""
        pass_ = Pass(self, n, train=True, accumulate=accumulate)
        logits, dlogits = self.arena["logits"][:n], self.arena["dlogits"][:n]
        softmax_cross_entropy_backward(logits, self.arena["labels"][:n], dlogits, scale=loss_scale,
                                              **self._loss_options())
        dy, act = dlogits.reshape((n,) + self.units[-1].out_shape), 0
        for u in reversed(self.units):
            if u.index == 0:
                dx = pass_.shared("input_grad", u.in_shape) if "input_grad" in self.arena else None
            else:
                dx, act = pass_.shared(("act0", "act1")[act], u.in_shape), 1 - act
            keeps = (u.shortcut is not None and u.shortcut.is_identity) or u.adds_projection  # dresidual = dx
            residual = pass_.shared("residual", u.in_shape) if u.saves_input or keeps else None
            u.backward(dy, dx, pass_, residual_grad=residual if u.saves_input else None,
                       shortcut_grad=residual if keeps and dx is not None else None)
            if u.shortcut is not None and not u.shortcut.is_identity:
                u.shortcut.backward(dx, pass_.shared("residual", u.shortcut.in_shape))
            dy = dx

    # ------------------------------------------------------------------ backward

    def backward(self, *, loss_scale=1.0, accumulate=True):
        """grads += loss_scale * dL/dparams after forward(train=True), reading only the units' stores (and
        dL/dimages into arena["input_grad"] when compiled with input_grad=True). accumulate=False: grads = it, so
        that a step's first backward needs no zero_grad before it."""
        self._check_compiled()
        if not self._n:
            raise RuntimeError("backward() needs a training forward() first")
        if not isinstance(accumulate, (bool, np.bool_)):
            raise TypeError(f"accumulate must be True or False, got {accumulate!r}")
        self.program("backward", self._n, loss_scale=float(loss_scale), accumulate=bool(accumulate)).run()
        self._n = 0  # the stores now hold nothing backward may read twice

    # ------------------------------------------------------------------ running statistics

    def defer_running(self, increments):
        """increments (2, S) of the net's dtype, or None. While set, a training forward writes each BN unit's
        running-statistics increment, (1 - bn_momentum) * (batch mean, unbiased variance), into its channels of
        increments and leaves `running` as it is; add_running applies it later. Ranks training together (step.py,
        dist.py) gather every rank's increments and apply them in rank order, as one process applies its
        sub-batches'."""
        self._check_compiled()
        if increments is not None and (increments.shape != self.arena["running"].shape
                                       or increments.dtype != self.dtype):
            raise ValueError(f"increments must be {self.arena['running'].shape} {np.dtype(self.dtype)}, got "
                             f"{increments.shape} {increments.dtype}")
        self.deferred_running = increments

    def add_running(self, increments):
        """running = bn_momentum * running + increments (2, S): a deferred update (defer_running), by the
        rule of the update it defers (update_running)."""
        running = self.arena["running"]
        update_running(running, increments.astype(running.dtype, copy=False), momentum=self.bn_momentum)

    def zero_grad(self):
        self._check_compiled()
        self.arena["grads"][...] = 0

    params = property(lambda self: self.arena["params"])   # (P,) flat, in parameter_table() order
    grads = property(lambda self: self.arena["grads"])     # (P,)

    def _check_compiled(self):
        if self.arena is None:
            raise RuntimeError("compile the net first: net.compile(pass_images=..., bits=...)")


def _check_optimizer(optimizer, grad_norm):
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(map(repr, OPTIMIZERS))}, got {optimizer!r}")
    if not isinstance(grad_norm, (bool, np.bool_)):
        raise TypeError(f"grad_norm must be True or False, got {grad_norm!r}")


def _pass_images(pass_images, batch, call):
    """plan()'s or compile()'s pass_images, or batch, its old name, for a release (as fit()'s split is sub_batches):
    with a DeprecationWarning naming the new one; both at once, a TypeError."""
    if batch is NOT_GIVEN:
        if pass_images is NOT_GIVEN:
            raise TypeError(f"Net.{call}() missing required keyword-only argument: 'pass_images'")
        return pass_images
    if pass_images is not NOT_GIVEN:
        raise TypeError(f"Net.{call}()'s batch is pass_images' old name: give pass_images alone")
    warnings.warn(f"Net.{call}()'s batch is now pass_images (the images of one pass; a batch is a step's); batch "
                  "goes in a later release", DeprecationWarning, stacklevel=3)
    return batch


def _store(store, **words):
    """The store plan() and compile() were given: `store` itself (a quant.Store, or one a unit), or the quant.Store
    its words make."""
    return Store(**words) if store is None else store
