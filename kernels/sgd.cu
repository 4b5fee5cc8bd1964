// The optimizers over the flat parameter vector, each step one fused pass, and the global gradient norm
// that clips them. NumPy references: minibp/optim.py.
//
// Parameters are laid out with every decayed weight (conv and FC weights) first: the first
// n_decay entries get weight decay, the rest (BN gamma/beta, biases) do not.
//
// SGD with momentum (sgd_momentum; sgd_momentum_clipped with g = grad * clip scale):
//     g = grad + weight_decay * p   (i < n_decay)
//     velocity = momentum * velocity + g
//     p -= lr * velocity
// AdamW (Loshchilov & Hutter), t = the steps done before this one + 1, bias1/bias2 = 1 - beta1^t, 1 - beta2^t:
//     g = grad * clip scale
//     m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
//     p -= lr * (m / bias1 / (sqrt(v / bias2) + eps) + weight_decay * p [i < n_decay])
// lr and AdamW's bias1, bias2 are read from the device (the arena's scalars, float64, taken in real_t): one
// recorded step serves every step of a schedule (minibp/optim.py).
// Clipping: grad_sum_squares sums the squares of each chunk of `chunk` entries in order, in double, and
// grad_norm_finish adds the chunks in order and takes the root, so the norm depends on neither the launch
// shape nor the thread count; the update kernels read it from the device (no host round-trip, and a
// CUDA graph can hold it) and scale the gradient by min(1, clip_norm / norm).
// Frozen units (a fine-tune's): the update kernels run on each stretch of the vector that is not frozen, and
// grad_zero clears the frozen stretches' gradients before the norm, so they neither move nor count.
#include "common.cuh"

// sums[c] = the sum, in order, of grads[i]^2 over chunk c = [c * chunk, (c + 1) * chunk) of the n entries.
extern "C" __global__ void grad_sum_squares(long long n, long long chunk, const real_t* grads, double* sums) {
    GRID_STRIDE_LOOP(c, (n + chunk - 1) / chunk) {
        const long long end = min_ll(n, (c + 1) * chunk);
        double s = 0;
        for (long long i = c * chunk; i < end; ++i) s += (double)grads[i] * (double)grads[i];
        sums[c] = s;
    }
}

// norm[0] = sqrt(sums[0] + sums[1] + ...), added in order by one thread (launch it as one block of one).
extern "C" __global__ void grad_norm_finish(long long chunks, const double* sums, double* norm) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        double s = 0;
        for (long long c = 0; c < chunks; ++c) s += sums[c];
        norm[0] = sqrt(s);
    }
}

// grads[i] = 0 for the n entries: a frozen unit's gradient, which the norm that clips the others leaves out.
extern "C" __global__ void grad_zero(long long n, real_t* grads) {
    GRID_STRIDE_LOOP(i, n) grads[i] = 0;
}

// min(1, clip_norm / norm) in real_t; 1 when there is no norm (a null grad_norm: no clipping).
__device__ __forceinline__ real_t clip_scale(const double* grad_norm, double clip_norm) {
    if (!grad_norm) return (real_t)1;
    const double norm = grad_norm[0];
    return norm > clip_norm ? (real_t)(clip_norm / norm) : (real_t)1;
}

__device__ __forceinline__ void sgd_update(long long i, long long n_decay, real_t lr, real_t momentum,
                                           real_t weight_decay, real_t grad, real_t* params, real_t* velocity) {
    const real_t g = i < n_decay ? grad + weight_decay * params[i] : grad;
    const real_t v = momentum * velocity[i] + g;
    velocity[i] = v;
    params[i] -= lr * v;
}

extern "C" __global__ void sgd_momentum(long long n, long long n_decay, const double* lr, real_t momentum,
                                        real_t weight_decay, real_t* params, const real_t* grads,
                                        real_t* velocity) {
    const real_t rate = (real_t)lr[0];
    GRID_STRIDE_LOOP(i, n) { sgd_update(i, n_decay, rate, momentum, weight_decay, grads[i], params, velocity); }
}

// sgd_momentum on the gradient clipped by the norm grad_norm[0] (grad_norm_finish).
extern "C" __global__ void sgd_momentum_clipped(long long n, long long n_decay, const double* lr, real_t momentum,
                                                real_t weight_decay, double clip_norm, const double* grad_norm,
                                                real_t* params, const real_t* grads, real_t* velocity) {
    const real_t scale = clip_scale(grad_norm, clip_norm), rate = (real_t)lr[0];
    GRID_STRIDE_LOOP(i, n) {
        sgd_update(i, n_decay, rate, momentum, weight_decay, grads[i] * scale, params, velocity);
    }
}

// grad_norm null: no clipping (clip_norm is then not read).
extern "C" __global__ void adamw(long long n, long long n_decay, const double* lr, real_t beta1, real_t beta2,
                                 real_t eps, real_t weight_decay, const double* bias1, const double* bias2,
                                 double clip_norm, const double* grad_norm, real_t* params, const real_t* grads,
                                 real_t* first_moment, real_t* second_moment) {
    const real_t scale = clip_scale(grad_norm, clip_norm), rate = (real_t)lr[0];
    const real_t bias1_t = (real_t)bias1[0], bias2_t = (real_t)bias2[0];
    const real_t one = 1;
    GRID_STRIDE_LOOP(i, n) {
        const real_t g = grads[i] * scale;
        const real_t m = beta1 * first_moment[i] + (one - beta1) * g;
        const real_t v = beta2 * second_moment[i] + (one - beta2) * g * g;
        first_moment[i] = m;
        second_moment[i] = v;
        real_t u = m / bias1_t / (sqrt(v / bias2_t) + eps);
        if (i < n_decay) u = u + weight_decay * params[i];
        params[i] -= rate * u;
    }
}
