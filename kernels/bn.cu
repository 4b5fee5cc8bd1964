// Batch normalisation + ReLU of one unit, fused with writing (and reading) its activation store.
// NumPy references: minibp/layers.py (batchnorm_relu_*_ref) and minibp/quant.py.
//
// Activations are (rows, C), channels last. stats is the unit's (5, C) table, written by the
// forward pass and read by the backward pass:
//     stats[0] = mean_c      stats[1] = sigma_c = sqrt(var_c + eps)
//     stats[2] = gamma_c, gamma clamped to >= 1e-8      stats[3] = b_c = beta_c / gamma_c
//     stats[4] = shift_c of the k-bit code of channel c
// The store is x itself (bits = 0, "exact" mode) or the k-bit codes of v = xhat + b (quant.cuh).
//
// Every kernel walks whole rows (pixels), whose C channels are contiguous: the inner loops read
// memory in order, find a channel without division, vectorise on the CPU, and a row's codes are
// whole bytes (C is a multiple of 8/k). Elementwise kernels take one row a thread; reductions one
// chunk of rows a thread, summing into that chunk's row of partial sums, which xp then adds up.
// The code width is a template parameter inside, so each loop is straight-line code.
#include "common.cuh"
#include "quant.cuh"

#define MEAN(c) stats[(c)]
#define SIGMA(c) stats[C + (c)]
#define GAMMA(c) stats[2 * C + (c)]
#define B(c) stats[3 * C + (c)]
#define SHIFT(c) stats[4 * C + (c)]

// xhat (and the ReLU mask) of one element as the forward pass computed it from x ...
__device__ __forceinline__ real_t xhat_from_x(real_t x, int c, int C, const real_t* stats, const real_t* beta,
                                              bool* on) {
    const real_t xhat = (x - MEAN(c)) / SIGMA(c);
    *on = GAMMA(c) * xhat + beta[c] > 0;
    return xhat;
}

// ... and as the k-bit store restores it from the code q.
template <int BITS>
__device__ __forceinline__ real_t xhat_from_code(float q, int c, int C, const real_t* stats, bool* on) {
    *on = quant_mask(q, (float)SHIFT(c));
    return quant_xhat(q, (float)SHIFT(c), B(c), BITS);
}

// The rows [r0, r1) of chunk `chunk`.
__device__ __forceinline__ void chunk_rows(long long chunk, long long rows, int rows_per_chunk, long long* r0,
                                           long long* r1) {
    *r0 = chunk * rows_per_chunk;
    *r1 = *r0 + rows_per_chunk < rows ? *r0 + rows_per_chunk : rows;
}

// partial[chunk, c] = sum over the chunk's rows of x (center null) or of (x - center)^2.
extern "C" __global__ void channel_sums(long long rows, int C, int rows_per_chunk, const real_t* __restrict__ x,
                                        const real_t* __restrict__ center, real_t* __restrict__ partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    GRID_STRIDE_LOOP(chunk, chunks) {
        long long r0, r1;
        chunk_rows(chunk, rows, rows_per_chunk, &r0, &r1);
        real_t* sum = partial + chunk * C;
        for (int c = 0; c < C; ++c) sum[c] = 0;
        for (long long r = r0; r < r1; ++r) {
            const real_t* x_row = x + r * C;
            if (center) {
                for (int c = 0; c < C; ++c) { const real_t d = x_row[c] - center[c]; sum[c] += d * d; }
            } else {
                for (int c = 0; c < C; ++c) sum[c] += x_row[c];
            }
        }
    }
}

// Given the batch mean and variance in stats[0], stats[1]: sigma, the clamped gamma, b and the
// code's shift. One thread per channel.
extern "C" __global__ void batchnorm_coefficients(int C, int bits, real_t eps, const real_t* __restrict__ gamma,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ stats) {
    GRID_STRIDE_LOOP(c, C) {
        SIGMA(c) = sqrt(SIGMA(c) + eps);
        const real_t g = gamma[c] < (real_t)1e-8 ? (real_t)1e-8 : gamma[c];  // (NaN passes through)
        GAMMA(c) = g;
        B(c) = beta[c] / g;
        SHIFT(c) = bits ? (real_t)quant_shift((float)B(c), bits) : (real_t)0;
    }
}

// ----------------------------------------------------------------------------- forward

// The row's codes: as numbers into a_row (scratch here: the caller writes a afterwards), then packed.
template <int BITS>
__device__ void encode_row(const real_t* x_row, real_t* a_row, unsigned char* row_codes, int C,
                           const real_t* stats) {
    for (int c = 0; c < C; ++c)
        a_row[c] = quant_code((float)((x_row[c] - MEAN(c)) / SIGMA(c) + B(c)), (float)SHIFT(c), BITS);
    quant_pack_row<BITS>(a_row, row_codes, C);
}

// a~ of a row of codes (the naive mode's forward, and the restore).
template <int BITS>
__device__ void restore_row(const unsigned char* row_codes, real_t* a_row, int C, const real_t* stats) {
    quant_unpack_row<BITS>(row_codes, a_row, C);
    for (int c = 0; c < C; ++c) a_row[c] = quant_restore((float)a_row[c], (float)SHIFT(c), GAMMA(c), BITS);
}

// a = relu(gamma_c * (x - mean) / sigma + beta), and the store: x_copy = x (exact mode) or the codes
// of v = xhat + b (codes non-null). naive = 1 writes a~ (restored from the codes) instead of a: the
// ablation that feeds approximations forward. x, a, x_copy are (rows, C); codes (rows * C * k / 8,).
extern "C" __global__ void batchnorm_relu_forward(long long rows, int C, int bits, int naive,
                                                  const real_t* __restrict__ x, const real_t* __restrict__ stats,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ a,
                                                  real_t* __restrict__ x_copy, unsigned char* __restrict__ codes) {
    GRID_STRIDE_LOOP(r, rows) {
        const real_t* x_row = x + r * C;
        real_t* a_row = a + r * C;
        if (x_copy)
            for (int c = 0; c < C; ++c) x_copy[r * C + c] = x_row[c];
        unsigned char* row_codes = codes ? codes + r * C * bits / 8 : nullptr;
        if (bits == 2 && codes) encode_row<2>(x_row, a_row, row_codes, C, stats);
        if (bits == 4 && codes) encode_row<4>(x_row, a_row, row_codes, C, stats);
        if (bits == 8 && codes) encode_row<8>(x_row, a_row, row_codes, C, stats);
        for (int c = 0; c < C; ++c) a_row[c] = relu(GAMMA(c) * ((x_row[c] - MEAN(c)) / SIGMA(c)) + beta[c]);
        if (!naive || !codes) continue;
        // naive: a~ goes forward instead of a (a NaN still does, so divergence shows)
        bool finite_row = true;
        for (int c = 0; c < C; ++c) finite_row = finite_row && a_row[c] == a_row[c];
        if (!finite_row) continue;
        if (bits == 2) restore_row<2>(row_codes, a_row, C, stats);
        if (bits == 4) restore_row<4>(row_codes, a_row, C, stats);
        if (bits == 8) restore_row<8>(row_codes, a_row, C, stats);
    }
}

// ----------------------------------------------------------------------------- backward

// Recompute a (exact mode) or restore a~ = relu(gamma_c * vhat) (k-bit) from the store. a is (rows, C).
extern "C" __global__ void batchnorm_relu_restore(long long rows, int C, int bits, const real_t* __restrict__ x_copy,
                                                  const unsigned char* __restrict__ codes,
                                                  const real_t* __restrict__ stats, const real_t* __restrict__ beta,
                                                  real_t* __restrict__ a) {
    GRID_STRIDE_LOOP(r, rows) {
        real_t* a_row = a + r * C;
        if (bits == 0) {
            const real_t* x_row = x_copy + r * C;
            for (int c = 0; c < C; ++c) a_row[c] = relu(GAMMA(c) * ((x_row[c] - MEAN(c)) / SIGMA(c)) + beta[c]);
        }
        const unsigned char* row_codes = codes + r * C * bits / 8;
        if (bits == 2) restore_row<2>(row_codes, a_row, C, stats);
        if (bits == 4) restore_row<4>(row_codes, a_row, C, stats);
        if (bits == 8) restore_row<8>(row_codes, a_row, C, stats);
    }
}

// dbeta_c += dy, dgamma_c += dy * xhat~ over one row, dy = da * mask.
template <int BITS>
__device__ void sums_row(const real_t* da_row, const unsigned char* row_codes, real_t* dbeta, real_t* dgamma, int C,
                         const real_t* stats) {
    for (int c = 0; c < C; ++c) {
        bool on;
        const real_t xhat = xhat_from_code<BITS>(quant_code_at<BITS>(row_codes, c), c, C, stats, &on);
        const real_t dy = da_row[c] * (real_t)on;
        dbeta[c] += dy;
        dgamma[c] += dy * xhat;
    }
}

// Partial sums over each chunk of rows of dbeta = sum(dy) and dgamma = sum(dy * xhat~), dy = da * mask:
// partial is (2, chunks, C).
extern "C" __global__ void batchnorm_relu_backward_sums(long long rows, int C, int rows_per_chunk, int bits,
                                                        const real_t* __restrict__ da,
                                                        const real_t* __restrict__ x_copy,
                                                        const unsigned char* __restrict__ codes,
                                                        const real_t* __restrict__ stats,
                                                        const real_t* __restrict__ beta,
                                                        real_t* __restrict__ partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    GRID_STRIDE_LOOP(chunk, chunks) {
        long long r0, r1;
        chunk_rows(chunk, rows, rows_per_chunk, &r0, &r1);
        real_t* dbeta = partial + chunk * C;
        real_t* dgamma = partial + (chunks + chunk) * C;
        for (int c = 0; c < C; ++c) dbeta[c] = dgamma[c] = 0;
        for (long long r = r0; r < r1; ++r) {
            const real_t* da_row = da + r * C;
            if (bits == 0) {
                const real_t* x_row = x_copy + r * C;
                for (int c = 0; c < C; ++c) {
                    bool on;
                    const real_t xhat = xhat_from_x(x_row[c], c, C, stats, beta, &on);
                    const real_t dy = da_row[c] * (real_t)on;
                    dbeta[c] += dy;
                    dgamma[c] += dy * xhat;
                }
            }
            const unsigned char* row_codes = codes + r * C * bits / 8;
            if (bits == 2) sums_row<2>(da_row, row_codes, dbeta, dgamma, C, stats);
            if (bits == 4) sums_row<4>(da_row, row_codes, dbeta, dgamma, C, stats);
            if (bits == 8) sums_row<8>(da_row, row_codes, dbeta, dgamma, C, stats);
        }
    }
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M), sums = (2, C) = this batch's
// dbeta and dgamma.
__device__ __forceinline__ real_t bn_dx(real_t da, bool on, real_t xhat, int c, int C, const real_t* stats,
                                        const real_t* sums, real_t inv_count) {
    const real_t dy = da * (real_t)on;  // the mask as a factor: no branch to mispredict
    return GAMMA(c) / SIGMA(c) * (dy - sums[c] * inv_count - xhat * sums[C + c] * inv_count);
}

template <int BITS>
__device__ void dx_row(const real_t* da_row, const unsigned char* row_codes, real_t* dx_row, int C,
                       const real_t* stats, const real_t* sums, real_t inv_count) {
    quant_unpack_row<BITS>(row_codes, dx_row, C);  // dx_row holds the codes until each is replaced by its dx
    for (int c = 0; c < C; ++c) {
        bool on;
        const real_t xhat = xhat_from_code<BITS>((float)dx_row[c], c, C, stats, &on);
        dx_row[c] = bn_dx(da_row[c], on, xhat, c, C, stats, sums, inv_count);
    }
}

// dx of the unit's BN + ReLU [+ residual_grad, the residual gradient arriving at a block's input].
// (rows, C) arrays; dx is not da.
extern "C" __global__ void batchnorm_relu_backward_dx(long long rows, int C, int bits, const real_t* __restrict__ da,
                                                      const real_t* __restrict__ x_copy,
                                                      const unsigned char* __restrict__ codes,
                                                      const real_t* __restrict__ stats,
                                                      const real_t* __restrict__ beta,
                                                      const real_t* __restrict__ sums, real_t inv_count,
                                                      const real_t* __restrict__ residual_grad,
                                                      real_t* __restrict__ dx) {
    GRID_STRIDE_LOOP(r, rows) {
        const real_t* da_row = da + r * C;
        real_t* dx_row_out = dx + r * C;
        if (bits == 0) {
            const real_t* x_row = x_copy + r * C;
            for (int c = 0; c < C; ++c) {
                bool on;
                const real_t xhat = xhat_from_x(x_row[c], c, C, stats, beta, &on);
                dx_row_out[c] = bn_dx(da_row[c], on, xhat, c, C, stats, sums, inv_count);
            }
        }
        const unsigned char* row_codes = codes + r * C * bits / 8;
        if (bits == 2) dx_row<2>(da_row, row_codes, dx_row_out, C, stats, sums, inv_count);
        if (bits == 4) dx_row<4>(da_row, row_codes, dx_row_out, C, stats, sums, inv_count);
        if (bits == 8) dx_row<8>(da_row, row_codes, dx_row_out, C, stats, sums, inv_count);
        if (residual_grad)
            for (int c = 0; c < C; ++c) dx_row_out[c] += residual_grad[r * C + c];
    }
}
