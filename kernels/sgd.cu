// SGD with momentum over the flat parameter vector, in one pass. NumPy reference: minibp/optim.py.
//
// Parameters are laid out with every decayed weight (conv and FC weights) first: the first
// n_decay entries get weight decay, the rest (BN gamma/beta, biases) do not.
//     g = grad + weight_decay * p   (i < n_decay)
//     velocity = momentum * velocity + g
//     p -= lr * velocity
#include "common.cuh"

extern "C" __global__ void sgd_momentum(long long n, long long n_decay, real_t lr, real_t momentum,
                                        real_t weight_decay, real_t* params, const real_t* grads,
                                        real_t* velocity) {
    GRID_STRIDE_LOOP(i, n) {
        const real_t g = i < n_decay ? grads[i] + weight_decay * params[i] : grads[i];
        const real_t v = momentum * velocity[i] + g;
        velocity[i] = v;
        params[i] -= lr * v;
    }
}
