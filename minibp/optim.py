"""SGD with momentum over the net's flat parameter vector: one fused kernel pass (kernels/sgd.cu).

Weight decay applies to conv and FC weights only, which the net lays out first in its parameter
vector (net.num_decayed entries); BN gamma/beta and biases follow, undecayed. Momentum is the
arena's `velocity` buffer, so it is planned, checkpointed and allocated with everything else.

    opt = SGD(net, momentum=0.9, weight_decay=2e-4)
    net.zero_grad(); net.forward(x, y); net.backward(); opt.step(lr=0.1)
"""
import math
import numbers

import numpy as np

from . import kernels


def hyperparameter(value, name, *, below=math.inf):
    """value as a float if it is a real number (not a bool, a string or an array) in [0, below), else a
    TypeError or ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
    if not 0 <= value < below:  # NaN fails too
        bounds = "finite and >= 0" if below == math.inf else f"in [0, {below:g})"
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return float(value)


class SGD:
    def __init__(self, net, *, momentum=0.9, weight_decay=2e-4):
        self.net = net
        self._check_net()
        self.momentum = hyperparameter(momentum, "momentum", below=1)
        self.weight_decay = hyperparameter(weight_decay, "weight_decay")

    def _check_net(self):
        if self.net.arena is None:
            raise RuntimeError("compile the net before making its optimizer")
        if "velocity" not in self.net.arena:
            raise RuntimeError("the net was compiled for evaluation (training=False): it has no gradients to step")

    @property
    def velocity(self):
        """(num_parameters,) the net's momentum buffer, looked up each time: a recompile moves it."""
        return self.net.arena["velocity"]

    def step(self, *, lr):
        """p -= lr * (velocity = momentum * velocity + grad + weight_decay * p [decayed part])."""
        lr = hyperparameter(lr, "lr")
        self._check_net()  # a recompile may have made it an evaluation net
        net = self.net
        n = net.params.size
        kernels.load("sgd.cu", net.dtype).sgd_momentum(n=n, n_decay=net.num_decayed, lr=lr, momentum=self.momentum,
                                                       weight_decay=self.weight_decay, params=net.params,
                                                       grads=net.grads, velocity=self.velocity, threads=n)


def sgd_momentum_ref(params, grads, velocity, *, n_decay, lr, momentum, weight_decay):
    """(params, velocity) after one step, in NumPy, with the kernel's float arithmetic."""
    t = params.dtype.type
    g = grads.copy()
    g[:n_decay] += t(weight_decay) * params[:n_decay]
    velocity = t(momentum) * velocity + g
    return params - t(lr) * velocity, velocity
