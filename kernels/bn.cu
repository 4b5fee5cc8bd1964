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

// The statistics' partial sums, per chunk of rows (batchnorm_statistics), are the rows of partial (VALUES, chunks, C):
enum PartialRow { SUM = 0, SUM_SQ = 1, CHUNK_SHIFT = 2, LEAST = 3, MOST = 4 };

// partial[SUM, chunk, c] = the sum over the chunk's rows of d = x - shift, partial[SUM_SQ, chunk, c] of d^2, with
// shift = partial[CHUNK_SHIFT, chunk, c], the chunk's first x: near its rows' mean (a chunk is neighbouring
// pixels), so one pass keeps the variance's digits whatever the mean; and (range and block windows)
// partial[LEAST], partial[MOST] the chunk's least and largest x. A block's own rows alone, so x may be written as
// it is read: with residual (a block's shortcut, (rows, C)), x = x + residual first, in place; with saved,
// saved = x (the input of a residual block, kept). A thread takes its channels a piece at a time: SCRATCH consecutive channels (the CPU's one thread:
// its loops over a piece vectorise), or one channel (a GPU thread's).
template <bool ONE_THREAD>
__device__ void statistics_rows(long long rows, int C, int rows_per_chunk, bool extremes, real_t* __restrict__ x,
                                const real_t* residual, real_t* saved, real_t* __restrict__ partial) {
    using L = Lanes<ONE_THREAD>;  // a channel is a group here
    constexpr int PIECE = ONE_THREAD ? SCRATCH : 1;
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    for (int c0 = L::first_group(); c0 < C; c0 += ONE_THREAD ? PIECE : L::group_step()) {
        const int P = min_int(PIECE, C - c0);
        CHUNK_LOOP(chunk, chunks) {
            real_t* __restrict__ row_of[5];
            for (int i = 0; i < 5; ++i) row_of[i] = partial + (i * chunks + chunk) * C + c0;
            real_t* __restrict__ sum = row_of[SUM];
            real_t* __restrict__ sum_sq = row_of[SUM_SQ];
            real_t* __restrict__ shift = row_of[CHUNK_SHIFT];
            real_t* __restrict__ least = row_of[LEAST];
            real_t* __restrict__ most = row_of[MOST];
            CHUNK_ROWS(r, chunk, rows, rows_per_chunk) {
                real_t* x_row = x + r * C + c0;
                if (residual)
                    for (int c = 0; c < P; ++c) x_row[c] += residual[r * C + c0 + c];
                if (saved)
                    for (int c = 0; c < P; ++c) saved[r * C + c0 + c] = x_row[c];
                if (r == chunk * rows_per_chunk) {  // the chunk's first row: its shift
                    for (int c = 0; c < P; ++c) shift[c] = x_row[c], sum[c] = sum_sq[c] = 0;
                    if (extremes)
                        for (int c = 0; c < P; ++c) least[c] = most[c] = x_row[c];
                }
                for (int c = 0; c < P; ++c) {
                    const real_t d = x_row[c] - shift[c];
                    sum[c] += d;
                    sum_sq[c] += d * d;
                }
                if (extremes)  // in a loop of its own: with the sums above it would keep g++ from vectorising either
                    for (int c = 0; c < P; ++c) {
                        least[c] = x_row[c] < least[c] ? x_row[c] : least[c];
                        most[c] = x_row[c] > most[c] ? x_row[c] : most[c];
                    }
            }
        }
    }
}

// The first pass of a training forward over x (rows, C): its statistics' partial sums (statistics_rows), partial
// (3, chunks, C), or (5, chunks, C) with the extremes; the block's residual added to x first, and x saved, when
// given (layers/bn.py: the net's schedule through its residual buffer).
extern "C" __global__ void batchnorm_statistics(long long rows, int C, int rows_per_chunk, int extremes,
                                                real_t* __restrict__ x, const real_t* residual, real_t* saved,
                                                real_t* __restrict__ partial) {
    if (blockDim.x == 1) statistics_rows<true>(rows, C, rows_per_chunk, extremes != 0, x, residual, saved, partial);
    else statistics_rows<false>(rows, C, rows_per_chunk, extremes != 0, x, residual, saved, partial);
}

// Channel c's window (shift, below, above) into win (3, C): fixed, or (range) the range window of the least and
// largest x of chunks [first, end) of extremes (2, chunks, C), narrowed to b +- clip, its bins split at zero by
// below_weight. [lo, hi] is v of those x computed as the forward pass computes v, so that every v of those rows
// lies within it. w reads the channel's statistics.
__device__ __forceinline__ void channel_window(const LaneRow& w, int c, bool range, const real_t* __restrict__ extremes,
                                               long long chunks, long long first, long long end, int bits, float clip,
                                               float below_weight, bool stochastic, real_t* __restrict__ win) {
    const float b = (float)w.stat(B, c);
    float shift, below, above;
    if (range) {
        real_t least = extremes[first * w.C + c], most = extremes[(chunks + first) * w.C + c];
        for (long long k = first + 1; k < end; ++k) {
            const real_t lo = extremes[k * w.C + c], hi = extremes[(chunks + k) * w.C + c];
            least = lo < least ? lo : least;
            most = hi > most ? hi : most;
        }
        quant_window_range((float)(xhat_of(w, least, c) + w.stat(B, c)), (float)(xhat_of(w, most, c) + w.stat(B, c)),
                           b, clip, bits, below_weight, stochastic, &shift, &below, &above);
    } else {
        quant_window_fixed(b, bits, &shift, &below, &above);
    }
    win[SHIFT * w.C + c] = shift, win[BELOW * w.C + c] = below, win[ABOVE * w.C + c] = above;
}

// The windows batchnorm_finish takes itself: none (exact; or the block window's, many blocks, which code_windows
// takes after it, a thread a block and channel), the fixed or range window (one block), or the block window's
// when its blocks are few (a loop of them a channel: layers/bn.py's FINISH_BLOCKS), saving that launch.
enum FinishWindow { NO_WINDOW = 0, FIXED_WINDOW = 1, RANGE_WINDOW = 2, BLOCK_WINDOWS = 3 };

// The second pass, one thread a channel. Training (chunks > 0): the batch's mean and (biased) variance from
// batchnorm_statistics's partial sums (chunks of rows_per_chunk rows), combined in order in double; the running
// statistics' increments (mean_weight * mean, variance_weight * var: the unbiased variance's share, layers/bn.py)
// written to increments when given (Net.defer_running), else applied, running = momentum * running + increment,
// after their values are kept in running_before. Evaluation (chunks = 0): the running statistics. Then sigma =
// sqrt(var + eps), the clamped gamma and b = beta / gamma in stats, and at k bits the windows that window names
// (FinishWindow; blocks of chunks_per_block chunks). running, running_before and increments are (2, S), this
// unit's channels from offset (running may be null in training: the batch's statistics alone); partial (5 or 3,
// chunks, C); windows (blocks, 3, C).
extern "C" __global__ void batchnorm_finish(long long rows, int C, long long chunks, int rows_per_chunk, real_t eps,
                                            real_t momentum, real_t mean_weight, real_t variance_weight, int S,
                                            int offset, int bits, int window, int chunks_per_block, float clip,
                                            float below_weight, int stochastic,
                                            const real_t* __restrict__ gamma, const real_t* __restrict__ beta,
                                            const real_t* __restrict__ partial, real_t* __restrict__ running,
                                            real_t* __restrict__ running_before, real_t* __restrict__ increments,
                                            real_t* __restrict__ stats, real_t* __restrict__ windows) {
    LaneRow w;  // (the channel's statistics, as a row reads them)
    w.C = C, w.stats = stats;
    GRID_STRIDE_LOOP(c, C) {
        real_t mean, var;
        real_t* __restrict__ run = running ? running + offset + c : nullptr;  // run[0]: mean; run[S]: variance
        if (chunks > 0) {
            // The chunks combined in order, in double: the mean, then the sum of squares about it, chunk k's
            // S2 + 2 (s_k - mean) S1 + n_k (s_k - mean)^2 with S1, S2 its sums about its shift s_k.
            double total = 0;
            for (long long k = 0; k < chunks; ++k) {
                const long long n = min_ll(rows - k * rows_per_chunk, rows_per_chunk);
                total += (double)partial[(SUM * chunks + k) * C + c] +
                         (double)n * partial[(CHUNK_SHIFT * chunks + k) * C + c];
            }
            const double m = total / (double)rows;
            double squares = 0;
            for (long long k = 0; k < chunks; ++k) {
                const long long n = min_ll(rows - k * rows_per_chunk, rows_per_chunk);
                const double off = (double)partial[(CHUNK_SHIFT * chunks + k) * C + c] - m;
                squares += (double)partial[(SUM_SQ * chunks + k) * C + c] +
                           2 * off * partial[(SUM * chunks + k) * C + c] + (double)n * off * off;
            }
            mean = (real_t)m;
            var = (real_t)(squares > 0 ? squares / (double)rows : squares == squares ? 0.0 : squares);  // (NaN stays)
            const real_t increment[2] = {mean_weight * mean, variance_weight * var};
            for (int i = 0; i < 2; ++i) {
                if (increments) {
                    increments[i * S + offset + c] = increment[i];
                } else if (running) {
                    if (running_before) running_before[i * S + offset + c] = run[i * S];
                    run[i * S] = run[i * S] * momentum + increment[i];
                }
            }
        } else {
            mean = run[0], var = run[S];
        }
        stats[MEAN * C + c] = mean;
        stats[SIGMA * C + c] = sqrt(var + eps);
        const real_t g = gamma[c] < (real_t)GAMMA_MIN ? (real_t)GAMMA_MIN : gamma[c];  // (NaN passes through)
        stats[GAMMA * C + c] = g;
        stats[B * C + c] = beta[c] / g;
        if (!bits || window == NO_WINDOW) continue;
        const real_t* __restrict__ extremes = partial + LEAST * chunks * C;
        if (window != BLOCK_WINDOWS)
            channel_window(w, c, window == RANGE_WINDOW, extremes, chunks, 0, chunks, bits, clip, below_weight,
                           stochastic != 0, windows);
        else
            for (long long first = 0, block = 0; first < chunks; first += chunks_per_block, ++block)
                channel_window(w, c, true, extremes, chunks, first, min_ll(first + chunks_per_block, chunks), bits,
                               clip, below_weight, stochastic != 0, windows + block * 3 * C);
    }
}

// The block window's windows (blocks, 3, C) from stats (batchnorm_finish) and extremes (2, chunks, C), the least
// and largest x of each chunk of rows, a block being chunks_per_block chunks (channel_window). One thread per
// block and channel.
extern "C" __global__ void code_windows(int C, int blocks, long long chunks, int chunks_per_block, int bits, float clip,
                                        float below_weight, int stochastic, const real_t* __restrict__ stats,
                                        const real_t* __restrict__ extremes, real_t* __restrict__ windows) {
    LaneRow w;
    w.C = C, w.stats = stats;
    GRID_STRIDE_LOOP(i, (long long)blocks * C) {
        const long long block = i / C, first = block * chunks_per_block;
        channel_window(w, (int)(i % C), true, extremes, chunks, first, min_ll(first + chunks_per_block, chunks), bits,
                       clip, below_weight, stochastic != 0, windows + block * 3 * C);
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
extern "C" __global__ void batchnorm_relu_forward(long long rows, int C, int rows_per_chunk, int bits, int stochastic,
                                                  real_t* __restrict__ x_copy, unsigned char* __restrict__ codes,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  const real_t* __restrict__ stats, const real_t* __restrict__ beta,
                                                  int naive, const long long* __restrict__ rounding_key,
                                                  const real_t* __restrict__ x, real_t* __restrict__ a) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreOut s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, forward_rows, u, rows_per_chunk, s, naive != 0, stochastic ? *rounding_key : 0, x, a);
}

// keys[u] = the rounding key of unit u < units in this forward pass (quant_rounding_key), from the pass's draw,
// which then counts on: draw[0] += 1, the next pass's. One thread (launch one block of one): the keys of a pass are
// taken once, before its units run, from a draw the host writes before a step (step.py) or a forward.
extern "C" __global__ void rounding_keys(int units, long long seed_hash, long long* __restrict__ draw,
                                         long long* __restrict__ keys) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (int u = 0; u < units; ++u) keys[u] = quant_rounding_key(seed_hash, draw[0], u);
        draw[0] += 1;
    }
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
extern "C" __global__ void batchnorm_relu_restore(long long rows, int C, int rows_per_chunk, int bits, int stochastic,
                                                  const real_t* __restrict__ x_copy,
                                                  const unsigned char* __restrict__ codes,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  const real_t* __restrict__ stats, const real_t* __restrict__ beta,
                                                  real_t* __restrict__ a) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, restore_rows, u, rows_per_chunk, s, a);
}

// One row's terms of dbeta_c = sum(dy) and dgamma_c = sum(dy * xhat~), dy = da * mask (the mask as a factor, as
// the reference), added into the reduction's sums w.sum0, w.sum1 (laid out as the row). RESTORE: the row's a
// (exact mode) or a~ is written to a too, from the same read of the store (restore_row's values).
template <int BITS, bool RESTORE, class Row>
__device__ __forceinline__ void backward_sums_row(const Row& w, const real_t* __restrict__ da, const StoreIn& s,
                                                  real_t* __restrict__ a) {
    real_t* __restrict__ dbeta = w.sum0;
    real_t* __restrict__ dgamma = w.sum1;
    da += w.e, a += RESTORE ? w.e : 0;
    if constexpr (BITS == 0) {  // (the two loops spelled out: a shared helper taking a lambda stopped g++ vectorising)
        const real_t* __restrict__ x = s.x_at(w.e);
        FOR_CHANNELS(c, w, 1) {
            real_t on;
            const real_t xhat = xhat_from_x(w, x[c], c, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
            if constexpr (RESTORE) a[c] = activation(w, xhat, c);
        }
    } else {
        for_codes<BITS>(w, s.codes_at(w.e), [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(w, q, c, s.stochastic, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
            if constexpr (RESTORE) a[c] = restored(w, q, c, s.stochastic);
        });
    }
}

template <int BITS, bool ONE_THREAD>
__device__ void backward_sums_rows(const Unit& u, int rows_per_chunk, const StoreIn& s, const real_t* da,
                                   real_t* partial, real_t* a) {
    using Row = RowOf<ONE_THREAD>;
    if (a)
        for_sum_rows<BITS, ONE_THREAD>(u, rows_per_chunk, BITS != 0, partial,
                                       [&](const Row& w) { backward_sums_row<BITS, true>(w, da, s, a); });
    else
        for_sum_rows<BITS, ONE_THREAD>(u, rows_per_chunk, BITS != 0, partial,
                                       [&](const Row& w) { backward_sums_row<BITS, false>(w, da, s, a); });
}

// Partial sums over each chunk of rows of dbeta = sum(dy) and dgamma = sum(dy * xhat~), dy = da * mask: partial
// is (2, chunks, C). With a (rows, C), the restored activation too (batchnorm_relu_restore's), which the unit's
// conv reads for its weight gradient: the store is read once for both.
extern "C" __global__ void batchnorm_relu_backward_sums(long long rows, int C, int rows_per_chunk, int bits,
                                                        int stochastic, const real_t* __restrict__ x_copy,
                                                        const unsigned char* __restrict__ codes,
                                                        const real_t* __restrict__ windows, long long block_rows,
                                                        const real_t* __restrict__ stats,
                                                        const real_t* __restrict__ beta,
                                                        const real_t* __restrict__ da, real_t* __restrict__ partial,
                                                        real_t* __restrict__ a) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, backward_sums_rows, u, rows_per_chunk, s, da, partial, a);
}

// The batch's dbeta and dgamma from batchnorm_relu_backward_sums's partial sums (2, chunks, C), added in order, one
// thread a channel: into sums (2, C), for batchnorm_relu_backward_dx, and into the gradients dbeta, dgamma (added to
// them with accumulate; else 0 + them, what a zeroed gradient and accumulate give, a negative zero included).
extern "C" __global__ void batchnorm_backward_finish(int C, long long chunks, int accumulate,
                                                     const real_t* __restrict__ partial, real_t* __restrict__ sums,
                                                     real_t* __restrict__ dbeta, real_t* __restrict__ dgamma) {
    GRID_STRIDE_LOOP(c, C) {
        real_t sum = 0, sum_xhat = 0;
        for (long long k = 0; k < chunks; ++k) sum += partial[k * C + c], sum_xhat += partial[(chunks + k) * C + c];
        sums[c] = sum, sums[C + c] = sum_xhat;
        dbeta[c] = (accumulate ? dbeta[c] : (real_t)0) + sum;
        dgamma[c] = (accumulate ? dgamma[c] : (real_t)0) + sum_xhat;
    }
}

// One row's dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad] [and
// shortcut_grad = dx], the batch's dbeta and dgamma in w.sums.
template <int BITS, class Row>
__device__ __forceinline__ void backward_dx_row(const Row& w, const real_t* __restrict__ da, const StoreIn& s,
                                                real_t inv_count, const real_t* residual_grad, real_t* shortcut_grad,
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
    if (shortcut_grad)
        FOR_CHANNELS(c, w, PER) shortcut_grad[w.e + c] = dx[c];
}

template <int BITS, bool ONE_THREAD>
__device__ void backward_dx_rows(const Unit& u, int rows_per_chunk, const StoreIn& s, const real_t* da,
                                 const real_t* sums, real_t inv_count, const real_t* residual_grad,
                                 real_t* shortcut_grad, real_t* dx) {
    for_rows<ONE_THREAD>(u, rows_per_chunk, WalkNeeds{BITS != 0, sums, false, 0},
                         [&](const RowOf<ONE_THREAD>& w) {
                             backward_dx_row<BITS>(w, da, s, inv_count, residual_grad, shortcut_grad, dx);
                         });
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) [+ residual_grad, the residual gradient
// arriving at a block's input] [and shortcut_grad = dx, the gradient a block's shortcut takes back to the block's
// input: the same buffer as residual_grad may be], sums = (2, C) = this batch's dbeta and dgamma. (rows, C) arrays;
// dx is not da.
extern "C" __global__ void batchnorm_relu_backward_dx(long long rows, int C, int rows_per_chunk, int bits,
                                                      int stochastic,
                                                      const real_t* __restrict__ x_copy,
                                                      const unsigned char* __restrict__ codes,
                                                      const real_t* __restrict__ windows, long long block_rows,
                                                      const real_t* __restrict__ stats, const real_t* __restrict__ beta,
                                                      const real_t* __restrict__ da, const real_t* __restrict__ sums,
                                                      real_t inv_count, const real_t* residual_grad,
                                                      real_t* shortcut_grad,
                                                      real_t* __restrict__ dx) {
    const Unit u{rows, C, stats, beta, windows, block_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    DISPATCH(bits, backward_dx_rows, u, rows_per_chunk, s, da, sums, inv_count, residual_grad, shortcut_grad, dx);
}
