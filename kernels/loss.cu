// The loss: softmax cross-entropy of logits (N, K) against labels (N,), mean over the batch, and its gradient.
// NumPy references: minibp/layers/loss.py. A row is a thread's: N threads, each over its K logits in order.
//
// Two options of a training loss, both off by default (and then the arithmetic is the plain loss's, bit for bit):
// label smoothing e aims at the target (1 - e) onehot(y) + e / K, so row i's loss is
//     log s_i - (1 - e) (l_iy - m_i) - e / K sum_k (l_ik - m_i)
// and class weights w (K,) scale row i's loss and gradient by w[y_i], the mean still over the N rows (so a
// step's sub-batches and ranks add up to one batch's loss, as without weights).
#include "common.cuh"

// m_i = max_k l_ik and s_i = sum_k exp(l_ik - m_i), in order; NaN logits give NaN.
__device__ __forceinline__ void softmax_terms(const real_t* __restrict__ row, int K, real_t* m, real_t* s) {
    real_t most = row[0];
    for (int k = 1; k < K; ++k) most = row[k] > most || row[k] != row[k] ? row[k] : most;
    real_t sum = 0;
    for (int k = 0; k < K; ++k) sum += exp(row[k] - most);
    *m = most, *s = sum;
}

// Row i's loss, smoothed by e (0: none) and weighted by weights[y] (null: none).
__device__ __forceinline__ real_t row_loss(const real_t* __restrict__ row, int K, long long y, real_t m, real_t s,
                                           real_t smoothing, const real_t* __restrict__ weights) {
    real_t loss = log(s) - (row[y] - m);
    if (smoothing != 0) {
        real_t spread = 0;
        for (int k = 0; k < K; ++k) spread += row[k] - m;
        loss = log(s) - (1 - smoothing) * (row[y] - m) - smoothing / K * spread;
    }
    return weights ? weights[y] * loss : loss;
}

// rows (N, 2): row i's loss (row_loss), and 1 where its first largest logit (the first NaN, if any: NumPy's
// argmax) is its label's, else 0.
extern "C" __global__ void softmax_xent_rows(int N, int K, real_t smoothing, const real_t* __restrict__ weights,
                                             const real_t* __restrict__ logits, const long long* __restrict__ labels,
                                             real_t* __restrict__ rows) {
    GRID_STRIDE_LOOP(i, N) {
        const real_t* __restrict__ row = logits + i * K;
        real_t m, s;
        softmax_terms(row, K, &m, &s);
        int best = 0;
        for (int k = 1; k < K && row[best] == row[best]; ++k)
            if (row[k] > row[best] || row[k] != row[k]) best = k;
        rows[2 * i] = row_loss(row, K, labels[i], m, s, smoothing, weights);
        rows[2 * i + 1] = best == labels[i] ? (real_t)1 : (real_t)0;
    }
}

// loss (2, 2), float64: loss[0] = the means over the N rows of rows (N, 2) (the loss, the accuracy), added in order;
// loss[1] = (+= with accumulate) loss[0], the sums over a step's sub-batches. One thread (one block of one).
extern "C" __global__ void softmax_xent_mean(int N, int accumulate, const real_t* __restrict__ rows,
                                             double* __restrict__ loss) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        double sum = 0, correct = 0;
        for (int i = 0; i < N; ++i) sum += (double)rows[2 * i], correct += (double)rows[2 * i + 1];
        loss[0] = sum / N, loss[1] = correct / N;
        loss[2] = (accumulate ? loss[2] : 0.0) + loss[0];
        loss[3] = (accumulate ? loss[3] : 0.0) + loss[1];
    }
}

// dlogits (N, K) = scale w[y_i] (softmax(l_i) - target_i), target_i = (1 - e) onehot(y_i) + e / K, scale =
// loss_scale / N: the gradient of the mean loss.
extern "C" __global__ void softmax_xent_backward(int N, int K, real_t scale, real_t smoothing,
                                                 const real_t* __restrict__ weights, const real_t* __restrict__ logits,
                                                 const long long* __restrict__ labels, real_t* __restrict__ dlogits) {
    GRID_STRIDE_LOOP(i, N) {
        const real_t* __restrict__ row = logits + i * K;
        real_t* __restrict__ d = dlogits + i * K;
        const long long y = labels[i];
        real_t m, s;
        softmax_terms(row, K, &m, &s);
        for (int k = 0; k < K; ++k) d[k] = exp(row[k] - m) / s;
        if (smoothing != 0) {
            for (int k = 0; k < K; ++k) d[k] -= smoothing / K;
            d[y] -= 1 - smoothing;
        } else {
            d[y] -= 1;
        }
        const real_t row_scale = weights ? scale * weights[y] : scale;
        for (int k = 0; k < K; ++k) d[k] *= row_scale;
    }
}
