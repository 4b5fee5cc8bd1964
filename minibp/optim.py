"""SGD with momentum over the net's flat parameter vector: one fused kernel pass (kernels/sgd.cu).

Weight decay applies to conv and FC weights only, which the net lays out first in its parameter
vector (net.num_decayed entries); BN gamma/beta and biases follow, undecayed. Momentum is the
arena's `velocity` buffer, so it is planned, checkpointed and allocated with everything else.

    opt = SGD(net, momentum=0.9, weight_decay=2e-4)
    net.zero_grad(); net.forward(x, y); net.backward(); opt.step(lr=0.1)
"""
import numpy as np

from . import kernels


class SGD:
    def __init__(self, net, *, momentum=0.9, weight_decay=2e-4):
        if net.arena is None:
            raise RuntimeError("compile the net before making its optimizer")
        if not 0 <= momentum < 1 or not 0 <= weight_decay < np.inf:  # (NaN fails both)
            raise ValueError(f"momentum must be in [0, 1) and weight_decay finite and >= 0, got {momentum}, "
                             f"{weight_decay}")
        self.net, self.momentum, self.weight_decay = net, float(momentum), float(weight_decay)

    @property
    def velocity(self):
        """(num_parameters,) the net's momentum buffer, looked up each time: a recompile moves it."""
        return self.net.arena["velocity"]

    def step(self, *, lr):
        """p -= lr * (velocity = momentum * velocity + grad + weight_decay * p [decayed part])."""
        if not np.isfinite(lr) or lr < 0:
            raise ValueError(f"the learning rate must be a finite non-negative number, got {lr}")
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
