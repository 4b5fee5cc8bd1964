"""SGD with momentum and AdamW over the net's flat parameter vector, each step one fused kernel pass
(kernels/sgd.cu), optionally on the gradient clipped by its global L2 norm.

Weight decay applies to conv and FC weights only, which the net lays out first in its parameter
vector (net.num_decayed entries); BN gamma/beta and biases follow, undecayed. The optimizers keep their
state in the arena, so it is planned, checkpointed and allocated with everything else: `velocity` (P,)
is SGD's momentum and AdamW's first moment, `second_moment` (P,) AdamW's second (planned by
compile(optimizer="adamw")); `grad_sums` and `grad_norm` hold the norm (compile(grad_norm=True)).

    net.compile(pass_images=128, bits=4)
    opt = SGD(net, momentum=0.9, weight_decay=2e-4)
    net.zero_grad(); net.forward(x, y); net.backward(); opt.step(lr=0.1)

    net.compile(pass_images=128, bits=4, optimizer="adamw", grad_norm=True)
    opt = AdamW(net, weight_decay=0.05, clip_norm=1.0)
    ...; opt.step(lr=1e-3, iteration=i)      # i: the steps done before this one (bias correction t = i + 1)
    opt.last_grad_norm                       # the norm of the last step's gradient, before clipping

A step is one recorded program (program.py: the norm's two kernels when planned, and the update's), which reads
the values that change from step to step, the learning rate and AdamW's bias corrections, from the arena's
`scalars` on the device: step() writes them, then replays it, and a training step (step.py) replays the same
program inside its own, so one CUDA graph serves a whole run's schedule.

Frozen units (SGD(net, frozen=[0, 1, 2]): a fine-tune's) keep their parameters, momentum and second moment exactly
as they are: the update runs on each stretch of the flat vector that holds no frozen unit's parameters, and the
frozen stretches' gradients are cleared before the norm (when planned), so clipping measures the trained ones
alone. (Their batch-norm running statistics still follow the data, as a frozen layer's do in train mode
elsewhere.)

AdamW's step depends on nothing but its arguments and the arena, so a run resumed at iteration i from a
checkpoint of net.state() continues bit for bit. The norm is a fixed-order reduction (chunks of NORM_CHUNK
entries summed in order in float64, then the chunks in order), so it does not depend on the thread count
or the launch shape; under mpirun every rank steps on the same summed gradient, so on the same norm.
"""
import math
import numbers
import weakref

import numpy as np

from . import backend, checks, kernels, program
from . import params as params_table

OPTIMIZERS = ("sgd", "adamw")  # Net.plan / Net.compile(optimizer=...): the buffers each needs
SCALARS = ("lr", "bias1", "bias2")  # arena["scalars"] (float64): what a step's kernels read that changes each step
NORM_CHUNK = 1024  # gradient entries one partial sum of squares adds in order (grad_sum_squares)


def norm_chunks(num_parameters):
    """The partial sums the gradient norm adds up: the planned "grad_sums" buffer's length."""
    return -(-int(num_parameters) // NORM_CHUNK)


def hyperparameter(value, name, *, below=math.inf, positive=False):
    """value as a float if it is a real number (not a bool, a string or an array) in [0, below) (positive:
    (0, below)), else a TypeError or ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not (0 < value if positive else 0 <= value) or not value < below:  # NaN fails too
        bounds = (f"finite and {'>' if positive else '>='} 0" if below == math.inf
                  else f"in {'(' if positive else '['}0, {below:g})")
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


def _clip_norm(value):
    return None if value is None else hyperparameter(value, "clip_norm", positive=True)


class _FlatOptimizer:
    """What both optimizers share: the net's buffers, the step as a recorded program over them (recorded anew
    after a recompile, which moves them), and the gradient norm."""
    needs = ()                # arena buffers this optimizer needs beyond a training net's, and why
    uses_iteration = False    # whether its step depends on `iteration` (AdamW's bias correction)

    def _init(self, net, clip_norm, frozen):
        self.net = net
        self.clip_norm = _clip_norm(clip_norm)
        self.frozen = frozen_units(frozen, len(net.units))
        self._recorded = None  # (a weak reference to the arena, the step's Program)
        self._check_net()

    def _check_net(self):
        if self.net.arena is None:
            raise RuntimeError("compile the net before making its optimizer")
        if "velocity" not in self.net.arena:
            raise RuntimeError("the net was compiled for evaluation (training=False): it has no gradients to step")
        for buffer, why in self.needs:
            if buffer not in self.net.arena:
                raise RuntimeError(why)
        if self.clip_norm is not None and "grad_norm" not in self.net.arena:
            raise RuntimeError("clip_norm needs the gradient norm's buffers: compile the net with grad_norm=True")

    @property
    def velocity(self):
        """(num_parameters,) the net's momentum (SGD) or first moment (AdamW)."""
        return self.net.arena["velocity"]

    @property
    def last_grad_norm(self):
        """The global L2 norm (a float) of the gradient of this optimizer's last step, before clipping; None
        if the net was not compiled with grad_norm=True or no step has measured it since the last compile.
        A host read: on the GPU it waits for the device (read it when logging, not every step)."""
        arena = self.net.arena
        if self._recorded is None or self._recorded[0]() is not arena or "grad_norm" not in arena:
            return None
        if backend.device == "gpu":  # a graph's step runs on its own stream
            backend.xp.cuda.runtime.deviceSynchronize()
        return float(backend.to_host(arena["grad_norm"])[0])

    def step(self, *, lr, iteration=None):
        """One step: the scalars written (set_scalars), the recorded step replayed."""
        self.set_scalars(lr=lr, iteration=iteration)
        self.program().run()

    def set_scalars(self, *, lr, iteration=None):
        """Check lr and iteration (the steps done before this one: AdamW's bias correction) and write the step's
        scalars (SCALARS) to the device, where its kernels read them."""
        lr = hyperparameter(lr, "lr")
        if iteration is not None or self.uses_iteration:
            iteration = checks.index(iteration, "iteration")
        self._check_net()  # a recompile may have made it an evaluation net
        backend.copy_in(self.net.arena["scalars"], np.array([lr, *self._bias_corrections(iteration)], np.float64))

    def _bias_corrections(self, iteration):
        return (1.0, 1.0)

    def program(self):
        """The step's Program on the net's arena, recorded at its first use after a compile: the gradient norm's
        two kernels (when planned), then the update."""
        arena = self.net.arena
        if self._recorded is None or self._recorded[0]() is not arena:
            self._check_net()
            module = kernels.load("sgd.cu", self.net.dtype)
            trained, frozen = self.stretches()
            with program.record() as recorded:
                if "grad_norm" in arena:
                    for part in frozen:
                        n = part.stop - part.start
                        module.grad_zero(n=n, grads=self.net.grads[part], threads=n)
                grad_norm = self._record_norm()
                for part in trained:
                    self._record_update(module, arena["scalars"], grad_norm, part)
            self._recorded = (weakref.ref(arena), recorded)
        return self._recorded[1]

    def stretches(self):
        """(trained, frozen): the slices of the flat vector whose parameters this optimizer steps, and those of the
        frozen units, each a maximal run of neighbouring parameters (a vector of none frozen: one slice, all)."""
        runs = []  # [frozen, start, stop]
        for _, unit, _, part in params_table.slices(self.net.units):
            is_frozen = unit.index in self.frozen
            if runs and runs[-1][0] == is_frozen and runs[-1][2] == part.start:
                runs[-1][2] = part.stop
            else:
                runs.append([is_frozen, part.start, part.stop])
        return tuple([slice(a, b) for f, a, b in runs if f == want] for want in (False, True))

    def _record_norm(self):
        """The gradient norm's kernels when planned; the device view the update reads it from when clipping."""
        net = self.net
        if "grad_norm" not in net.arena:
            return None
        module, n, sums = kernels.load("sgd.cu", net.dtype), net.params.size, net.arena["grad_sums"]
        module.grad_sum_squares(n=n, chunk=NORM_CHUNK, grads=net.grads, sums=sums, threads=sums.size)
        module.grad_norm_finish(chunks=sums.size, sums=sums, norm=net.arena["grad_norm"], grid=(1,), block=(1,))
        return net.arena["grad_norm"] if self.clip_norm is not None else None


class SGD(_FlatOptimizer):
    """SGD with momentum. clip_norm: scale the gradient by min(1, clip_norm / its global norm) (the net compiled
    with grad_norm=True); None: no clipping. frozen: the indices of units left exactly as they are (the module
    docstring)."""

    def __init__(self, net, *, momentum=0.9, weight_decay=2e-4, clip_norm=None, frozen=()):
        self._init(net, clip_norm, frozen)
        self.momentum = hyperparameter(momentum, "momentum", below=1)
        self.weight_decay = hyperparameter(weight_decay, "weight_decay")

    def step(self, *, lr, iteration=None):
        """p -= lr * (velocity = momentum * velocity + grad + weight_decay * p [decayed part]). iteration (the
        steps done before this one) is taken as AdamW's is, and does not change the step."""
        super().step(lr=lr, iteration=iteration)

    def _record_update(self, module, scalars, grad_norm, part):
        net, n = self.net, part.stop - part.start
        common = dict(n=n, n_decay=_decayed_in(part, net.num_decayed), lr=scalars[0:1], momentum=self.momentum,
                      weight_decay=self.weight_decay, params=net.params[part], grads=net.grads[part],
                      velocity=self.velocity[part], threads=n)
        if grad_norm is None:
            module.sgd_momentum(**common)
        else:
            module.sgd_momentum_clipped(**common, clip_norm=self.clip_norm, grad_norm=grad_norm)


class AdamW(_FlatOptimizer):
    """AdamW (Loshchilov & Hutter, decoupled weight decay) on a net compiled with optimizer="adamw". The defaults
    are the usual Adam betas and eps, and the 0.05 decay of the DeiT and ConvNeXt recipes (decay is lr *
    weight_decay * p a step, so it scales with AdamW's learning rates, about 1e-3). clip_norm and frozen as SGD's."""
    needs = (("second_moment", "AdamW needs the second moment's buffer: compile the net with optimizer='adamw'"),)
    uses_iteration = True

    def __init__(self, net, *, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05, clip_norm=None, frozen=()):
        self._init(net, clip_norm, frozen)
        self.beta1 = hyperparameter(beta1, "beta1", below=1)
        self.beta2 = hyperparameter(beta2, "beta2", below=1)
        self.eps = hyperparameter(eps, "eps", positive=True)  # 0 would divide 0 by 0 where a gradient stays 0
        self.weight_decay = hyperparameter(weight_decay, "weight_decay")

    @property
    def second_moment(self):
        """(num_parameters,) the net's second-moment buffer."""
        return self.net.arena["second_moment"]

    def step(self, *, lr, iteration):
        """One AdamW step; iteration is the number of steps done before this one (0 first), so that the bias
        correction's t = iteration + 1 needs no state of its own."""
        super().step(lr=lr, iteration=iteration)

    def _bias_corrections(self, iteration):
        return bias_corrections(self.beta1, self.beta2, iteration)

    def _record_update(self, module, scalars, grad_norm, part):
        net, n = self.net, part.stop - part.start
        module.adamw(n=n, n_decay=_decayed_in(part, net.num_decayed), lr=scalars[0:1], beta1=self.beta1,
                     beta2=self.beta2, eps=self.eps, weight_decay=self.weight_decay, bias1=scalars[1:2],
                     bias2=scalars[2:3], clip_norm=self.clip_norm or 0.0, grad_norm=grad_norm, params=net.params[part],
                     grads=net.grads[part], first_moment=self.velocity[part], second_moment=self.second_moment[part],
                     threads=n)


def frozen_units(frozen, units):
    """The frozen units' indices as a sorted tuple: distinct unit indices of a net of `units` units."""
    if isinstance(frozen, (str, bytes)) or not hasattr(frozen, "__iter__"):
        raise TypeError(f"frozen must be a list of unit indices, got {frozen!r}")
    indices = tuple(frozen)
    for index in indices:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral) or not 0 <= index < units:
            raise ValueError(f"frozen names units 0 to {units - 1} of this net, got {index!r}")
    return tuple(sorted(set(int(i) for i in indices)))


def _decayed_in(part, n_decay):
    """How many of a stretch's entries are decayed weights (the first n_decay of the whole vector)."""
    return min(max(n_decay - part.start, 0), part.stop - part.start)


def bias_corrections(beta1, beta2, iteration):
    """(1 - beta1^t, 1 - beta2^t) at t = iteration + 1, in float64 (the kernel takes them in real_t)."""
    t = iteration + 1
    return 1.0 - beta1 ** t, 1.0 - beta2 ** t


# ----------------------------------------------------------------------------- NumPy references

def grad_norm_ref(grads):
    """The global L2 norm as grad_sum_squares and grad_norm_finish compute it: squares in float64, each chunk of
    NORM_CHUNK summed in order, the chunks in order (np.cumsum adds in order; np.sum would not), the root."""
    squares = np.asarray(grads, np.float64).ravel() ** 2
    chunks = np.concatenate([squares, np.zeros(-len(squares) % NORM_CHUNK)]).reshape(-1, NORM_CHUNK)
    return math.sqrt(float(np.cumsum(np.cumsum(chunks, axis=1)[:, -1])[-1]))


def clip_scale_ref(norm, clip_norm, dtype):
    """min(1, clip_norm / norm) in the kernels' dtype (clip_norm None: 1)."""
    t = np.dtype(dtype).type
    return t(clip_norm / norm) if clip_norm is not None and norm > clip_norm else t(1)


def sgd_momentum_ref(params, grads, velocity, *, n_decay, lr, momentum, weight_decay, clip_norm=None):
    """(params, velocity) after one step, in NumPy, with the kernel's float arithmetic."""
    t = params.dtype.type
    g = grads.copy() if clip_norm is None else grads * clip_scale_ref(grad_norm_ref(grads), clip_norm, grads.dtype)
    g[:n_decay] += t(weight_decay) * params[:n_decay]
    velocity = t(momentum) * velocity + g
    return params - t(lr) * velocity, velocity


def adamw_ref(params, grads, first_moment, second_moment, *, n_decay, lr, beta1, beta2, eps, weight_decay,
              iteration, clip_norm=None):
    """(params, first_moment, second_moment) after one AdamW step, in NumPy, with the kernel's float arithmetic."""
    t = params.dtype.type
    bias1, bias2 = (t(b) for b in bias_corrections(beta1, beta2, iteration))
    g = grads * clip_scale_ref(grad_norm_ref(grads), clip_norm, grads.dtype) if clip_norm is not None else grads
    b1, b2, one = t(beta1), t(beta2), t(1)
    m = b1 * first_moment + (one - b1) * g
    v = b2 * second_moment + (one - b2) * g * g
    u = m / bias1 / (np.sqrt(v / bias2) + t(eps))
    u[:n_decay] = u[:n_decay] + t(weight_decay) * params[:n_decay]
    return params - t(lr) * u, m, v
