// Batch normalisation + ReLU of one unit, fused with writing (and reading) its activation store: the method,
// one row at a time. How the rows are dealt out to threads, the GPU's lanes and the CPU's wide rows, is
// bn_walk.cuh's; a row function here sees one row (w: LaneRow or WideRow) and the arrays at its element w.e.
// NumPy references: minibp/layers/bn.py (batchnorm_relu_*_ref) and minibp/quant.py.
//
// Activations are (rows, C), channels last. stats is the unit's (4, C) statistics, written by the forward
// pass and read by the backward pass (bn_walk.cuh's StatsRow names its rows):
//     stats[MEAN] = mean_c      stats[SIGMA] = sigma_c = sqrt(var_c + eps)
//     stats[GAMMA] = gamma_c, clamped to >= GAMMA_MIN (1e-8)      stats[B] = b_c = beta_c / gamma_c
// The store is x itself (bits = 0, "exact" mode) or the k-bit codes of v = xhat + b (quant.cuh), coded
// through the unit's windows (blocks, 3, C): channel c's shift_c, below_c, above_c (WindowRow) for each block
// of block_rows rows. The fixed and range windows are one block (block_rows >= rows); the block window's
// blocks are quant.BLOCK_ROWS rows.
#include "bn_walk.cuh"

#ifndef GAMMA_MIN
#error "GAMMA_MIN comes from minibp/constants.py: build through minibp.kernels"
#endif

// xhat as the forward pass computes it from x.
template <class Row>
__device__ __forceinline__ real_t xhat_of(const Row& w, real_t x, int c) {
    return (x - w.stat(MEAN, c)) / w.stat(SIGMA, c);
}

// a = relu(gamma * xhat + beta).
template <class Row>
__device__ __forceinline__ real_t activation(const Row& w, real_t xhat, int c) {
    return relu(w.stat(GAMMA, c) * xhat + w.beta[c]);
}

// xhat~ and the ReLU mask (as 0 or 1) of element c as the backward pass reads them: from x (exact mode) ...
template <class Row>
__device__ __forceinline__ real_t xhat_from_x(const Row& w, real_t x, int c, real_t* on) {
    const real_t xhat = xhat_of(w, x, c);
    *on = w.stat(GAMMA, c) * xhat + w.beta[c] > 0 ? (real_t)1 : (real_t)0;  // a select: g++ does not vectorise bool -> float
    return xhat;
}

// ... and from the code q (k bits) through its row's window.
template <class Row>
__device__ __forceinline__ real_t xhat_from_code(const Row& w, float q, int c, bool stochastic, real_t* on) {
    *on = quant_mask(q, w.window(SHIFT, c)) ? (real_t)1 : (real_t)0;
    return quant_xhat(q, w.window(SHIFT, c), w.window(BELOW, c), w.window(ABOVE, c), stochastic, w.stat(B, c));
}

// a~ = relu(gamma * vhat) from the code q.
template <class Row>
__device__ __forceinline__ real_t restored(const Row& w, float q, int c, bool stochastic) {
    return quant_restore(q, w.window(SHIFT, c), w.window(BELOW, c), w.window(ABOVE, c), stochastic, w.stat(GAMMA, c));
}

// ----------------------------------------------------------------------------- statistics

// partial[0, chunk, c] = sum over the chunk's rows of x - shift, partial[1, chunk, c] of (x - shift)^2,
// and with extremes partial[2, chunk, c], partial[3, chunk, c] the chunk's least and largest x (for the
// range windows): partial is (2 or 4, chunks, C). With the shift near the mean (layers/bn.py: the mean of
// rows spread over the batch) one pass gives the variance without the cancellation of a large mean.
template <bool ONE_THREAD>
__device__ void channel_sums_rows(long long rows, int C, int rows_per_chunk, bool extremes,
                                  const real_t* __restrict__ x, const real_t* __restrict__ shift,
                                  real_t* __restrict__ partial) {
    using L = Lanes<ONE_THREAD>;  // a channel is a group here
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    CHUNK_LOOP(chunk, chunks) {
        real_t* __restrict__ sum = partial + chunk * C;
        real_t* __restrict__ sum_sq = partial + (chunks + chunk) * C;
        real_t* __restrict__ least = partial + (2 * chunks + chunk) * C;
        real_t* __restrict__ most = partial + (3 * chunks + chunk) * C;
        for (int c = L::first_group(); c < C; c += L::group_step()) sum[c] = sum_sq[c] = 0;
        if (extremes)
            for (int c = L::first_group(); c < C; c += L::group_step())
                least[c] = most[c] = x[chunk * rows_per_chunk * C + c];
        CHUNK_ROWS(r, chunk, rows, rows_per_chunk) {
            const real_t* __restrict__ x_row = x + r * C;
            for (int c = L::first_group(); c < C; c += L::group_step()) {
                const real_t d = x_row[c] - shift[c];
                sum[c] += d;
                sum_sq[c] += d * d;
            }
            if (extremes)  // in a loop of its own: with the sums above it would keep g++ from vectorising either
                for (int c = L::first_group(); c < C; c += L::group_step()) {
                    least[c] = x_row[c] < least[c] ? x_row[c] : least[c];
                    most[c] = x_row[c] > most[c] ? x_row[c] : most[c];
                }
        }
    }
}

extern "C" __global__ void channel_sums(long long rows, int C, int rows_per_chunk, int extremes,
                                        const real_t* __restrict__ x, const real_t* __restrict__ shift,
                                        real_t* __restrict__ partial) {
    if (blockDim.x == 1) channel_sums_rows<true>(rows, C, rows_per_chunk, extremes != 0, x, shift, partial);
    else channel_sums_rows<false>(rows, C, rows_per_chunk, extremes != 0, x, shift, partial);
}

// Given the batch mean and variance in stats[MEAN], stats[SIGMA]: sigma, the clamped gamma and b. One thread
// per channel.
extern "C" __global__ void batchnorm_coefficients(int C, real_t eps, const real_t* __restrict__ gamma,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ stats) {
    GRID_STRIDE_LOOP(c, C) {
        stats[SIGMA * C + c] = sqrt(stats[SIGMA * C + c] + eps);
        const real_t g = gamma[c] < (real_t)GAMMA_MIN ? (real_t)GAMMA_MIN : gamma[c];  // (NaN passes through)
        stats[GAMMA * C + c] = g;
        stats[B * C + c] = beta[c] / g;
    }
}

// The code's windows (blocks, 3, C) from stats (batchnorm_coefficients): fixed, or (range) from extremes
// (2, chunks, C), the least and largest x of each chunk of rows, a block being chunks_per_block chunks, its
// [lo, hi] narrowed to b +- clip, its bins split at zero by below_weight. One thread per block and channel.
// [lo, hi] is v of those x computed as the forward pass computes v, so that every v of the block lies
// within it.
extern "C" __global__ void code_windows(int C, int blocks, int chunks, int chunks_per_block, int bits, int range,
                                        float clip, float below_weight, int stochastic, const real_t* __restrict__ stats,
                                        const real_t* __restrict__ extremes, real_t* __restrict__ windows) {
    LaneRow w;  // (the channel's statistics, as a row reads them)
    w.C = C, w.stats = stats;
    GRID_STRIDE_LOOP(i, (long long)blocks * C) {
        const int c = (int)(i % C);
        const long long block = i / C;
        const float b = (float)w.stat(B, c);
        float shift, below, above;
        if (range) {
            const long long first = block * chunks_per_block;
            real_t least = extremes[first * C + c], most = extremes[(chunks + first) * C + c];
            for (long long k = first + 1; k < chunks && k < first + chunks_per_block; ++k) {
                const real_t lo = extremes[k * C + c], hi = extremes[(chunks + k) * C + c];
                least = lo < least ? lo : least;
                most = hi > most ? hi : most;
            }
            quant_window_range((float)(xhat_of(w, least, c) + w.stat(B, c)), (float)(xhat_of(w, most, c) + w.stat(B, c)),
                               b, clip, bits, below_weight, stochastic != 0, &shift, &below, &above);
        } else {
            quant_window_fixed(b, bits, &shift, &below, &above);
        }
        real_t* win = windows + block * 3 * C;
        win[SHIFT * C + c] = shift, win[BELOW * C + c] = below, win[ABOVE * C + c] = above;
    }
}

// ----------------------------------------------------------------------------- forward

// Element c's code as a number and its a, from one xhat: rounded down (quant_code) or, stochastic, at random
// by the element's draw (quant_code_stochastic).
template <int BITS, bool STOCHASTIC, class Row>
__device__ __forceinline__ void code_element(const Row& w, const real_t* __restrict__ x, int c,
                                             real_t* __restrict__ q, real_t* __restrict__ a) {
    const real_t xhat = xhat_of(w, x[c], c);
    const float v = (float)(xhat + w.stat(B, c));
    *q = STOCHASTIC ? quant_code_stochastic(v, w.window(SHIFT, c), w.inv_below(c), w.inv_above(c), BITS, w.draw(c))
                    : quant_code(v, w.window(SHIFT, c), w.inv_below(c), w.inv_above(c), BITS);
    a[c] = activation(w, xhat, c);
}

// At k bits: one row's codes of v = xhat + b, packed a byte per group, and a beside them from one xhat. naive:
// a~, restored from the codes just written, goes forward instead of a (the ablation); a NaN still does, so
// divergence shows.
template <int BITS, class Row>
__device__ __forceinline__ void forward_codes_row(const Row& w, const real_t* __restrict__ x, real_t* __restrict__ a,
                                                  const StoreOut& s, bool naive) {
    constexpr int PER = group_size<BITS>();
    unsigned char* __restrict__ codes = s.codes_at(w.e);
    if constexpr (Row::one_thread) {  // the codes as numbers into a local row, then packed
        real_t q[SCRATCH];
        if (s.stochastic)  // (a loop each: one with a branch inside would not vectorise)
            for (int c = 0; c < w.C; ++c) code_element<BITS, true>(w, x, c, q + c, a);
        else
            for (int c = 0; c < w.C; ++c) code_element<BITS, false>(w, x, c, q + c, a);
        for (int j = 0; j < w.C / PER; ++j) codes[j] = quant_pack_byte<BITS>(q + j * PER);
    } else {  // threads sharing a row: each codes its own groups, in registers
        FOR_GROUPS(j, w, PER) {
            real_t q[PER];
            for (int t = 0; t < PER; ++t)
                if (s.stochastic) code_element<BITS, true>(w, x, j * PER + t, q + t, a);
                else code_element<BITS, false>(w, x, j * PER + t, q + t, a);
            codes[j] = quant_pack_byte<BITS>(q);
        }
    }
    if (naive)
        for_codes<BITS>(w, codes, [&](float q, int c) { a[c] = a[c] == a[c] ? restored(w, q, c, s.stochastic) : a[c]; });
}

// One row's a = relu(gamma_c * (x - mean) / sigma + beta) and its store: x_copy = x (exact mode, when the store
// has one) or the codes (forward_codes_row).
template <int BITS, class Row>
__device__ __forceinline__ void forward_row(const Row& w, const real_t* __restrict__ x, real_t* __restrict__ a,
                                            const StoreOut& s, bool naive) {
    constexpr int PER = group_size<BITS>();
    x += w.e, a += w.e;
    if constexpr (BITS == 0) {
        real_t* __restrict__ x_copy = s.x_at(w.e);
        if (x_copy) FOR_CHANNELS(c, w, PER) x_copy[c] = x[c];
        FOR_CHANNELS(c, w, PER) a[c] = activation(w, xhat_of(w, x[c], c), c);
    } else {
        forward_codes_row<BITS>(w, x, a, s, naive);
    }
}

template <int BITS, bool ONE_THREAD>
__device__ void forward_rows(const Unit& u, int rows_per_chunk, const StoreOut& s, bool naive, long long rounding_key,
                             const real_t* x, real_t* a) {
    const WalkNeeds needs{BITS != 0, nullptr, BITS != 0 && s.stochastic, rounding_key};
    for_rows<ONE_THREAD>(u, rows_per_chunk, needs, [&](const RowOf<ONE_THREAD>& w) { forward_row<BITS>(w, x, a, s, naive); });
}

// a = relu(gamma_c * (x - mean) / sigma + beta), and the store: x_copy = x (exact mode) or the codes of
// v = xhat + b (bits > 0) through windows (above), rounded down (quant_code) or, stochastic, at random
// (quant_code_stochastic, element (r, c)'s draw from rounding_key). naive writes a~ (restored from the
// codes) instead of a: the ablation that feeds approximations forward. x, a, x_copy are (rows, C); codes
// (rows * C * k / 8,).
extern "C" __global__ void batchnorm_relu_forward(long long rows, int C, int rows_per_chunk, int bits, int naive,
                                                  int stochastic, long long rounding_key,
                                                  const real_t* __restrict__ x, const real_t* __restrict__ stats,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ a,
                                                  real_t* __restrict__ x_copy, unsigned char* __restrict__ codes) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreOut s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, forward_rows, u, rows_per_chunk, s, naive != 0, rounding_key, x, a);
}

// ----------------------------------------------------------------------------- backward

// One row's a (exact mode: recomputed from x) or a~ = relu(gamma_c * vhat) (k bits: restored from the codes).
template <int BITS, class Row>
__device__ __forceinline__ void restore_row(const Row& w, const StoreIn& s, real_t* __restrict__ a) {
    a += w.e;
    if constexpr (BITS == 0) {
        const real_t* __restrict__ x = s.x_at(w.e);
        FOR_CHANNELS(c, w, 1) a[c] = activation(w, xhat_of(w, x[c], c), c);
    } else {
        for_codes<BITS>(w, s.codes_at(w.e), [&](float q, int c) { a[c] = restored(w, q, c, s.stochastic); });
    }
}

template <int BITS, bool ONE_THREAD>
__device__ void restore_rows(const Unit& u, int rows_per_chunk, const StoreIn& s, real_t* a) {
    for_rows<ONE_THREAD>(u, rows_per_chunk, WalkNeeds{BITS != 0, nullptr, false, 0},
                         [&](const RowOf<ONE_THREAD>& w) { restore_row<BITS>(w, s, a); });
}

// Recompute a (exact mode) or restore a~ = relu(gamma_c * vhat) (k-bit) from the store. a is (rows, C).
extern "C" __global__ void batchnorm_relu_restore(long long rows, int C, int rows_per_chunk, int bits,
                                                  const real_t* __restrict__ x_copy,
                                                  const unsigned char* __restrict__ codes,
                                                  const real_t* __restrict__ stats,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  int stochastic, const real_t* __restrict__ beta,
                                                  real_t* __restrict__ a) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, restore_rows, u, rows_per_chunk, s, a);
}

// One row's terms of dbeta_c = sum(dy) and dgamma_c = sum(dy * xhat~), dy = da * mask (the mask as a factor, as
// the reference), added into the reduction's sums w.sum0, w.sum1 (laid out as the row).
template <int BITS, class Row>
__device__ __forceinline__ void backward_sums_row(const Row& w, const real_t* __restrict__ da, const StoreIn& s) {
    real_t* __restrict__ dbeta = w.sum0;
    real_t* __restrict__ dgamma = w.sum1;
    da += w.e;
    if constexpr (BITS == 0) {  // (the two loops spelled out: a shared helper taking a lambda stopped g++ vectorising)
        const real_t* __restrict__ x = s.x_at(w.e);
        FOR_CHANNELS(c, w, 1) {
            real_t on;
            const real_t xhat = xhat_from_x(w, x[c], c, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
        }
    } else {
        for_codes<BITS>(w, s.codes_at(w.e), [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(w, q, c, s.stochastic, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
        });
    }
}

template <int BITS, bool ONE_THREAD>
__device__ void backward_sums_rows(const Unit& u, int rows_per_chunk, const StoreIn& s, const real_t* da,
                                   real_t* partial) {
    for_sum_rows<BITS, ONE_THREAD>(u, rows_per_chunk, BITS != 0, partial,
                                   [&](const RowOf<ONE_THREAD>& w) { backward_sums_row<BITS>(w, da, s); });
}

// Partial sums over each chunk of rows of dbeta = sum(dy) and dgamma = sum(dy * xhat~), dy = da * mask:
// partial is (2, chunks, C).
extern "C" __global__ void batchnorm_relu_backward_sums(long long rows, int C, int rows_per_chunk, int bits,
                                                        const real_t* __restrict__ da,
                                                        const real_t* __restrict__ x_copy,
                                                        const unsigned char* __restrict__ codes,
                                                        const real_t* __restrict__ stats,
                                                        const real_t* __restrict__ windows, long long block_rows,
                                                        int stochastic, const real_t* __restrict__ beta,
                                                        real_t* __restrict__ partial) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, backward_sums_rows, u, rows_per_chunk, s, da, partial);
}

// One row's dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad], the batch's
// dbeta and dgamma in w.sums.
template <int BITS, class Row>
__device__ __forceinline__ void backward_dx_row(const Row& w, const real_t* __restrict__ da, const StoreIn& s,
                                                real_t inv_count, const real_t* __restrict__ residual_grad,
                                                real_t* __restrict__ dx) {
    constexpr int PER = group_size<BITS>();
    da += w.e, dx += w.e;
    const real_t* __restrict__ dbeta = w.sums;
    const real_t* __restrict__ dgamma = w.sums + w.C;
    if constexpr (BITS == 0) {
        const real_t* __restrict__ x = s.x_at(w.e);
        FOR_CHANNELS(c, w, PER) {
            real_t on;
            const real_t xhat = xhat_from_x(w, x[c], c, &on), dy = da[c] * on;
            dx[c] = w.dx_scale(c) * (dy - dbeta[c] * inv_count - xhat * dgamma[c] * inv_count);
        }
    } else {
        for_codes<BITS>(w, s.codes_at(w.e), [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(w, q, c, s.stochastic, &on), dy = da[c] * on;
            dx[c] = w.dx_scale(c) * (dy - dbeta[c] * inv_count - xhat * dgamma[c] * inv_count);
        });
    }
    if (residual_grad)  // in a loop of its own, which keeps the one above simple enough for g++ to vectorise
        FOR_CHANNELS(c, w, PER) dx[c] += residual_grad[w.e + c];
}

template <int BITS, bool ONE_THREAD>
__device__ void backward_dx_rows(const Unit& u, int rows_per_chunk, const StoreIn& s, const real_t* da,
                                 const real_t* sums, real_t inv_count, const real_t* residual_grad, real_t* dx) {
    for_rows<ONE_THREAD>(u, rows_per_chunk, WalkNeeds{BITS != 0, sums, false, 0},
                         [&](const RowOf<ONE_THREAD>& w) { backward_dx_row<BITS>(w, da, s, inv_count, residual_grad, dx); });
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad, the residual gradient
// arriving at a block's input], sums = (2, C) = this batch's dbeta and dgamma. (rows, C) arrays; dx is not da.
extern "C" __global__ void batchnorm_relu_backward_dx(long long rows, int C, int rows_per_chunk, int bits,
                                                      const real_t* __restrict__ da, const real_t* __restrict__ x_copy,
                                                      const unsigned char* __restrict__ codes,
                                                      const real_t* __restrict__ stats,
                                                      const real_t* __restrict__ windows, long long block_rows,
                                                      int stochastic, const real_t* __restrict__ beta,
                                                      const real_t* __restrict__ sums, real_t inv_count,
                                                      const real_t* __restrict__ residual_grad,
                                                      real_t* __restrict__ dx) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, backward_dx_rows, u, rows_per_chunk, s, da, sums, inv_count, residual_grad, dx);
}
