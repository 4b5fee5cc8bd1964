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

// The unit's normalised value and ReLU mask at element e (channel c), exactly as the forward pass
// computed them (bits = 0) or as the k-bit store restores them.
struct Restored { real_t xhat, a; bool on; };

__device__ __forceinline__ Restored restore(long long e, int c, int C, int bits, const real_t* x,
                                            const unsigned char* codes, const real_t* stats, const real_t* beta) {
    const real_t gamma_c = stats[2 * C + c];
    Restored r;
    if (bits == 0) {
        r.xhat = (x[e] - stats[c]) / stats[C + c];
        const real_t y = gamma_c * r.xhat + beta[c];
        r.on = y > 0;
        r.a = y <= 0 ? (real_t)0 : y;  // relu that lets NaN through, so a diverged net shows in the loss
    } else {
        const real_t b = stats[3 * C + c];
        const float shift = quant_shift((float)b, bits);
        const int code = quant_unpack(codes, e, bits);
        const real_t vhat = (real_t)quant_vhat(code, shift, bits);
        r.xhat = vhat - b;
        r.on = code >= shift;
        const real_t y = gamma_c * vhat;
        r.a = y > 0 ? y : (real_t)0;
    }
    return r;
}

// a = relu(gamma_c * (x - mean) / sigma + beta), and the store: x_copy = x (exact mode) or the codes
// of v = xhat + b (codes non-null). naive = 1 writes a~ (restored from the codes) instead of a: the
// ablation that feeds approximations forward. One thread per byte of codes (per element when exact).
extern "C" __global__ void batchnorm_relu_forward(long long groups, int C, int bits, int naive, const real_t* x,
                                                  const real_t* stats, const real_t* beta, real_t* a,
                                                  real_t* x_copy, unsigned char* codes) {
    const int per_group = bits ? 8 / bits : 1;
    GRID_STRIDE_LOOP(j, groups) {
        const long long e0 = j * per_group;
        const int c0 = (int)(e0 % C);
        int byte = 0;
        for (int t = 0; t < per_group; ++t) {
            const long long e = e0 + t;
            const int c = c0 + t;
            const Restored exact = restore(e, c, C, 0, x, codes, stats, beta);
            if (codes) {
                const float shift = quant_shift((float)stats[3 * C + c], bits);
                const int code = quant_code((float)(exact.xhat + stats[3 * C + c]), shift, bits);
                byte = (byte << bits) | code;
                if (naive && exact.a == exact.a) {  // (a NaN still goes forward)
                    const real_t y = stats[2 * C + c] * (real_t)quant_vhat(code, shift, bits);
                    a[e] = y > 0 ? y : (real_t)0;
                } else {
                    a[e] = exact.a;
                }
            } else {
                a[e] = exact.a;
            }
            if (x_copy) x_copy[e] = x[e];
        }
        if (codes) codes[j] = (unsigned char)byte;
    }
}

// Recompute a (exact mode) or restore a~ (k-bit) from the store, for the weight gradient.
extern "C" __global__ void batchnorm_relu_restore(long long n, int C, int bits, const real_t* x_copy,
                                                  const unsigned char* codes, const real_t* stats,
                                                  const real_t* beta, real_t* a) {
    GRID_STRIDE_LOOP(e, n) {
        a[e] = restore(e, (int)(e % C), C, bits, x_copy, codes, stats, beta).a;
    }
}

// Partial sums of dbeta = sum(dy) and dgamma = sum(dy * xhat~), dy = da * mask, per (chunk, c):
// partial is (2, chunks, C).
extern "C" __global__ void batchnorm_relu_backward_sums(long long rows, int C, int rows_per_chunk, int bits,
                                                        const real_t* da, const real_t* x_copy,
                                                        const unsigned char* codes, const real_t* stats,
                                                        const real_t* beta, real_t* partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    GRID_STRIDE_LOOP(i, chunks * C) {
        const ChunkOfColumn t = chunk_of_column(i, rows, C, rows_per_chunk);
        const int c = t.c;
        const long long r0 = t.r0, r1 = t.r1;
        real_t dbeta = 0, dgamma = 0;
        for (long long r = r0; r < r1; ++r) {
            const long long e = r * C + c;
            const Restored s = restore(e, c, C, bits, x_copy, codes, stats, beta);
            const real_t dy = s.on ? da[e] : (real_t)0;
            dbeta += dy;
            dgamma += dy * s.xhat;
        }
        partial[i] = dbeta;
        partial[chunks * C + i] = dgamma;
    }
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad], where
// sums = (2, C) holds this batch's dbeta and dgamma. dx may be da itself (in place).
extern "C" __global__ void batchnorm_relu_backward_dx(long long n, int C, int bits, const real_t* da,
                                                      const real_t* x_copy, const unsigned char* codes,
                                                      const real_t* stats, const real_t* beta,
                                                      const real_t* sums, real_t inv_count,
                                                      const real_t* residual_grad, real_t* dx) {
    GRID_STRIDE_LOOP(e, n) {
        const int c = (int)(e % C);
        const Restored s = restore(e, c, C, bits, x_copy, codes, stats, beta);
        const real_t dy = s.on ? da[e] : (real_t)0;
        real_t g = stats[2 * C + c] / stats[C + c] * (dy - sums[c] * inv_count - s.xhat * sums[C + c] * inv_count);
        if (residual_grad) g += residual_grad[e];
        dx[e] = g;
    }
}
