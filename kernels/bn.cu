// Batch normalisation + ReLU of one unit, fused with writing (and reading) its activation store.
// NumPy references: minibp/layers.py (batchnorm_relu_*_ref).
//
// Activations are (M, C), channels last. stats is the unit's (4, C) table, written by the forward
// pass and read by the backward pass:
//     stats[0] = mean_c   stats[1] = sigma_c = sqrt(var_c + eps)
//     stats[2] = gamma_c (gamma clamped to >= 1e-8)   stats[3] = b_c = beta_c / gamma_c
// The store is x itself (bits = 0, "exact" mode) or the k-bit codes of v = xhat + b (quant.cuh).
#include "common.cuh"
#include "quant.cuh"

// Thread i of a per-channel reduction sums rows [r0, r1) of column c: i = chunk * C + c.
struct ChunkOfColumn { int c; long long r0, r1; };

__device__ __forceinline__ ChunkOfColumn chunk_of_column(long long i, long long rows, int C, int rows_per_chunk) {
    ChunkOfColumn t;
    t.c = (int)(i % C);
    t.r0 = (i / C) * rows_per_chunk;
    t.r1 = t.r0 + rows_per_chunk < rows ? t.r0 + rows_per_chunk : rows;
    return t;
}

// Per-channel partial sums: partial[chunk, c] = sum over the chunk's rows of x (center null) or of
// (x - center)^2. One thread per (chunk, c); the caller sums the chunks with xp (deterministic).
extern "C" __global__ void channel_sums(long long rows, int C, int rows_per_chunk, const real_t* x,
                                        const real_t* center, real_t* partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    GRID_STRIDE_LOOP(i, chunks * C) {
        const ChunkOfColumn t = chunk_of_column(i, rows, C, rows_per_chunk);
        const int c = t.c;
        const long long r0 = t.r0, r1 = t.r1;
        real_t sum = 0;
        if (center) {
            const real_t m = center[c];
            for (long long r = r0; r < r1; ++r) { const real_t d = x[r * C + c] - m; sum += d * d; }
        } else {
            for (long long r = r0; r < r1; ++r) sum += x[r * C + c];
        }
        partial[i] = sum;
    }
}

// The unit's normalised value, activation and ReLU mask of one element of channel c: exactly as the
// forward pass computes them from x, or as the k-bit store restores them from the element's code.
struct Restored { real_t xhat, a; bool on; };

__device__ __forceinline__ Restored from_x(real_t x, int c, int C, const real_t* stats, const real_t* beta) {
    Restored r;
    r.xhat = (x - stats[c]) / stats[C + c];
    const real_t y = stats[2 * C + c] * r.xhat + beta[c];
    r.on = y > 0;
    r.a = y <= 0 ? (real_t)0 : y;  // relu that lets NaN through, so a diverged net shows in the loss
    return r;
}

__device__ __forceinline__ Restored from_code(int code, int c, int C, int bits, const real_t* stats) {
    const real_t b = stats[3 * C + c];
    const float shift = quant_shift((float)b, bits);
    const real_t vhat = (real_t)quant_vhat(code, shift, bits);
    Restored r;
    r.xhat = vhat - b;
    r.on = code >= shift;
    const real_t y = stats[2 * C + c] * vhat;
    r.a = y > 0 ? y : (real_t)0;
    return r;
}

// Elementwise kernels run one thread per row (pixel) of C contiguous channels: in-order memory, no
// division to find a channel, and the row's codes are whole bytes (C is a multiple of 8/k).
// Element c of a row is restored from the exact store (bits = 0) or from its code.
__device__ __forceinline__ Restored restore_in_row(long long r, int c, int C, int bits, const real_t* x_copy,
                                                   const unsigned char* codes, const real_t* stats,
                                                   const real_t* beta) {
    if (bits == 0) return from_x(x_copy[r * C + c], c, C, stats, beta);
    const int per_byte = 8 / bits;
    const unsigned char byte = codes[(r * C + c) / per_byte];
    const int code = (byte >> (8 - bits * (c % per_byte + 1))) & ((1 << bits) - 1);
    return from_code(code, c, C, bits, stats);
}

// a = relu(gamma_c * (x - mean) / sigma + beta), and the store: x_copy = x (exact mode) or the codes
// of v = xhat + b (codes non-null). naive = 1 writes a~ (restored from the codes) instead of a: the
// ablation that feeds approximations forward. x, a, x_copy are (rows, C); codes (rows * C * bits / 8,).
extern "C" __global__ void batchnorm_relu_forward(long long rows, int C, int bits, int naive, const real_t* x,
                                                  const real_t* stats, const real_t* beta, real_t* a,
                                                  real_t* x_copy, unsigned char* codes) {
    GRID_STRIDE_LOOP(r, rows) {
        const real_t* x_row = x + r * C;
        real_t* a_row = a + r * C;
        if (x_copy)
            for (int c = 0; c < C; ++c) x_copy[r * C + c] = x_row[c];
        if (!codes) {
            for (int c = 0; c < C; ++c) a_row[c] = from_x(x_row[c], c, C, stats, beta).a;
            continue;
        }
        const int per_byte = 8 / bits;
        unsigned char* code_row = codes + r * C / per_byte;
        for (int c0 = 0; c0 < C; c0 += per_byte) {
            int byte = 0;
            for (int c = c0; c < c0 + per_byte; ++c) {
                const Restored exact = from_x(x_row[c], c, C, stats, beta);
                const real_t b = stats[3 * C + c];
                const int code = quant_code((float)(exact.xhat + b), quant_shift((float)b, bits), bits);
                byte = (byte << bits) | code;
                // naive: a~ goes forward (a NaN still does, so divergence shows)
                a_row[c] = naive && exact.a == exact.a ? from_code(code, c, C, bits, stats).a : exact.a;
            }
            code_row[c0 / per_byte] = (unsigned char)byte;
        }
    }
}

// Recompute a (exact mode) or restore a~ (k-bit) from the store, for the weight gradient. a is (rows, C).
extern "C" __global__ void batchnorm_relu_restore(long long rows, int C, int bits, const real_t* x_copy,
                                                  const unsigned char* codes, const real_t* stats,
                                                  const real_t* beta, real_t* a) {
    GRID_STRIDE_LOOP(r, rows) {
        for (int c = 0; c < C; ++c) a[r * C + c] = restore_in_row(r, c, C, bits, x_copy, codes, stats, beta).a;
    }
}

// Partial sums of dbeta = sum(dy) and dgamma = sum(dy * xhat~), dy = da * mask, per (chunk, c):
// partial is (2, chunks, C). One thread per (chunk, channel), as channel_sums.
extern "C" __global__ void batchnorm_relu_backward_sums(long long rows, int C, int rows_per_chunk, int bits,
                                                        const real_t* da, const real_t* x_copy,
                                                        const unsigned char* codes, const real_t* stats,
                                                        const real_t* beta, real_t* partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    GRID_STRIDE_LOOP(i, chunks * C) {
        const ChunkOfColumn t = chunk_of_column(i, rows, C, rows_per_chunk);
        real_t dbeta = 0, dgamma = 0;
        for (long long r = t.r0; r < t.r1; ++r) {
            const Restored s = restore_in_row(r, t.c, C, bits, x_copy, codes, stats, beta);
            const real_t da_e = da[r * C + t.c];  // loaded unconditionally: a select, not a branch
            const real_t dy = s.on ? da_e : (real_t)0;
            dbeta += dy;
            dgamma += dy * s.xhat;
        }
        partial[i] = dbeta;
        partial[chunks * C + i] = dgamma;
    }
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad], where
// sums = (2, C) holds this batch's dbeta and dgamma. dx may be da itself (in place). (rows, C) arrays.
extern "C" __global__ void batchnorm_relu_backward_dx(long long rows, int C, int bits, const real_t* da,
                                                      const real_t* x_copy, const unsigned char* codes,
                                                      const real_t* stats, const real_t* beta,
                                                      const real_t* sums, real_t inv_count,
                                                      const real_t* residual_grad, real_t* dx) {
    GRID_STRIDE_LOOP(r, rows) {
        for (int c = 0; c < C; ++c) {
            const long long e = r * C + c;
            const Restored s = restore_in_row(r, c, C, bits, x_copy, codes, stats, beta);
            const real_t da_e = da[e];  // loaded unconditionally: a select, not a branch
            const real_t dy = s.on ? da_e : (real_t)0;
            real_t g = stats[2 * C + c] / stats[C + c] *
                       (dy - sums[c] * inv_count - s.xhat * sums[C + c] * inv_count);
            if (residual_grad) g += residual_grad[e];
            dx[e] = g;
        }
    }
}
