// Batch normalisation + ReLU of one unit, fused with writing (and reading) its activation store: the method,
// one row at a time. How the rows are dealt out to threads, the GPU's lanes and the CPU's wide rows, is
// bn_walk.cuh's; a row function here sees one row (`row`: LaneRow or WideRow) and the arrays at its element
// row.e, and states a line of docs/method.md ("method:" and its section). NumPy references: minibp/layers/bn.py
// (batchnorm_*_ref) and minibp/quant.py.
//
// Activations are (rows, C), channels last. stats is the unit's (4, C) statistics, written by the forward
// pass and read by the backward pass (bn_walk.cuh's StatsRow names its rows):
//     stats[MEAN] = mean_c      stats[SIGMA] = sigma_c = sqrt(var_c + eps)
//     stats[GAMMA] = gamma_c, clamped to >= GAMMA_MIN (1e-8)      stats[B] = b_c = beta_c / gamma_c
// The store is x itself (bits = 0, "exact" mode) or the k-bit codes of v = xhat + b (quant.cuh), coded through
// the unit's windows (windows, 3, C): channel c's shift_c, below_c, above_c (WindowRow) for each window_rows
// rows, one window a channel under the fixed and range windows, one each WINDOW_ROWS rows under the block window.
#include "bn_walk.cuh"

#if !defined(GAMMA_MIN) || !defined(WINDOW_ROWS)
#error "GAMMA_MIN and WINDOW_ROWS come from minibp/constants.py: build through minibp.kernels"
#endif

// method: xhat = (x - mean_c) / sigma_c ("The unit"), as the forward pass computes it from x.
template <class Row>
__device__ __forceinline__ real_t xhat_of(const Row& row, real_t x, int c) {
    return (x - row.stat(MEAN, c)) / row.stat(SIGMA, c);
}

// method: a = relu(y), y = gamma_c * xhat + beta_c ("The unit").
template <class Row>
__device__ __forceinline__ real_t activation(const Row& row, real_t xhat, int c) {
    return relu(row.stat(GAMMA, c) * xhat + row.beta[c]);
}

// method: xhat and the mask y > 0 from x in exact mode ("What a unit keeps"), 0 or 1 by a select (g++ does not
// vectorise bool -> float) ...
template <class Row>
__device__ __forceinline__ real_t xhat_from_x(const Row& row, real_t x, int c, real_t* on) {
    const real_t xhat = xhat_of(row, x, c);
    *on = row.stat(GAMMA, c) * xhat + row.beta[c] > 0 ? (real_t)1 : (real_t)0;
    return xhat;
}

// ... method: mask = q >= shift_c, xhat~ = vhat - b_c ("The k-bit store"), from the code q through its window.
template <class Row>
__device__ __forceinline__ real_t xhat_from_code(const Row& row, float q, int c, bool stochastic, real_t* on) {
    *on = quant_mask(q, row.window(SHIFT, c)) ? (real_t)1 : (real_t)0;
    return quant_xhat(q, row.window(SHIFT, c), row.window(BELOW, c), row.window(ABOVE, c), stochastic, row.stat(B, c));
}

// method: a~ = relu(gamma_c * vhat) ("The k-bit store"), from the code q.
template <class Row>
__device__ __forceinline__ real_t restored(const Row& row, float q, int c, bool stochastic) {
    return quant_restore(q, row.window(SHIFT, c), row.window(BELOW, c), row.window(ABOVE, c), stochastic,
                         row.stat(GAMMA, c));
}

// ----------------------------------------------------------------------------- statistics

// The statistics' partial sums, per chunk of rows (batchnorm_statistics), are the rows of partial (VALUES, chunks, C):
enum PartialRow { SUM = 0, SUM_SQ = 1, CHUNK_SHIFT = 2, LEAST = 3, MOST = 4 };

// method: each chunk's sums about its own first row ("The schedule through shared buffers"). One row's terms at
// P channels: sum[SUM] += d = x - shift and sum[SUM_SQ] += d^2, shift = sum[CHUNK_SHIFT] the chunk's first x
// (near its rows' mean: a chunk is neighbouring pixels, so one pass keeps the variance's digits whatever the
// mean), and (extremes: range and block windows) the least and largest x. sum[i] is row i's, `apart` apart.
template <class Count>
__device__ __forceinline__ void statistics_row(const real_t* __restrict__ x, bool first, bool extremes, Count P,
                                               real_t* sums, long long apart) {
    real_t *__restrict__ sum = sums + SUM * apart, *__restrict__ sum_sq = sums + SUM_SQ * apart;
    real_t *__restrict__ shift = sums + CHUNK_SHIFT * apart, *__restrict__ least = sums + LEAST * apart,
                         *__restrict__ most = sums + MOST * apart;
    if (first) {  // the chunk's first row: its shift
        for (int c = 0; c < P; ++c) shift[c] = x[c], sum[c] = sum_sq[c] = 0;
        if (extremes)
            for (int c = 0; c < P; ++c) least[c] = most[c] = x[c];
    }
    for (int c = 0; c < P; ++c) {
        const real_t d = x[c] - shift[c];
        sum[c] += d;
        sum_sq[c] += d * d;
    }
    if (extremes)  // in a loop of its own: with the sums above it would keep g++ from vectorising either
        for (int c = 0; c < P; ++c) {
            least[c] = x[c] < least[c] ? x[c] : least[c];
            most[c] = x[c] > most[c] ? x[c] : most[c];
        }
}

// The first pass of a training forward over x (rows, C): its partial sums (statistics_row), (3 or, with the
// extremes, 5, chunks, C). A chunk reads its own rows alone, so x may be written as it is read: x += residual (a
// residual block's shortcut) first, in place, then saved = x (a residual block's input, kept), each when given.
extern "C" __global__ void batchnorm_statistics(
    long long rows, int C, int rows_per_chunk, int extremes, real_t* __restrict__ x, const real_t* residual,
    real_t* saved, real_t* __restrict__ partial) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    for_channel_pieces(C, [&](int c0, auto P) {
        CHUNK_LOOP(chunk, chunks) CHUNK_ROWS(r, chunk, rows, rows_per_chunk) {
            real_t* x_row = x + r * C + c0;
            if (residual)
                for (int c = 0; c < P; ++c) x_row[c] += residual[r * C + c0 + c];
            if (saved)
                for (int c = 0; c < P; ++c) saved[r * C + c0 + c] = x_row[c];
            statistics_row(x_row, r == chunk * rows_per_chunk, extremes != 0, P, partial + chunk * C + c0, chunks * C);
        }
    });
}

// method: mean_c and the biased var_c of the batch ("The unit"), from batchnorm_statistics's partial sums
// over chunks of rows_per_chunk rows, combined in order in double ("The schedule"): the mean, then the sum of
// squares about it, chunk k's S2 + 2 (s_k - mean) S1 + n_k (s_k - mean)^2 with S1, S2 its sums about its shift s_k.
__device__ __forceinline__ void batch_moments(const real_t* __restrict__ partial, long long rows, int rows_per_chunk,
                                              int C, int c, real_t* mean, real_t* var) {
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    const real_t *sum = partial + SUM * chunks * C + c, *sum_sq = partial + SUM_SQ * chunks * C + c,
                 *shift = partial + CHUNK_SHIFT * chunks * C + c;  // chunk k's at [k * C]
    double total = 0;
    for (long long k = 0; k < chunks; ++k)
        total += (double)sum[k * C] + (double)min_ll(rows - k * rows_per_chunk, rows_per_chunk) * shift[k * C];
    const double m = total / (double)rows;
    double squares = 0;
    for (long long k = 0; k < chunks; ++k) {
        const double off = (double)shift[k * C] - m;
        squares += (double)sum_sq[k * C] + 2 * off * sum[k * C] +
                   (double)min_ll(rows - k * rows_per_chunk, rows_per_chunk) * off * off;
    }
    *mean = (real_t)m;
    *var = (real_t)(squares > 0 ? squares / (double)rows : squares == squares ? 0.0 : squares);  // (NaN stays)
}

// The running statistics' update at a channel (its variance S after its mean; layers/bn.py's update_running):
// running = momentum * running + increment, the increment (1 - momentum) * (mean, rows / (rows - 1) * var: the
// unbiased variance), running's values kept in before first; or, deferred, the increments written alone.
__device__ __forceinline__ void update_running(real_t mean, real_t var, long long rows, double momentum, int S,
                                               real_t* run, real_t* before, real_t* increments) {
    const real_t increment[2] = {(real_t)(1 - momentum) * mean,
                                 (real_t)((1 - momentum) * (double)rows / (double)(rows > 1 ? rows - 1 : 1)) * var};
    for (int i = 0; i < 2; ++i)
        if (increments) {
            increments[i * S] = increment[i];
        } else if (run) {
            if (before) before[i * S] = run[i * S];
            run[i * S] = run[i * S] * (real_t)momentum + increment[i];
        }
}

// method: sigma_c = sqrt(var_c + eps), gamma_c clamped to >= 1e-8 ("The unit") and b_c = beta_c / gamma_c ("The
// k-bit store"): channel c's stats.
__device__ __forceinline__ void coefficients(real_t mean, real_t var, real_t eps, real_t gamma, real_t beta, int C,
                                             int c, real_t* __restrict__ stats) {
    stats[MEAN * C + c] = mean;
    stats[SIGMA * C + c] = sqrt(var + eps);
    const real_t g = gamma < (real_t)GAMMA_MIN ? (real_t)GAMMA_MIN : gamma;  // (NaN passes through)
    stats[GAMMA * C + c] = g;
    stats[B * C + c] = beta / g;
}

// The second pass, over channels (for_finish_channels): the batch's mean and variance (training: partial (3 or 5,
// chunks, C) of `rows` rows) and the running statistics' update with them (running may be null: the batch's
// statistics alone), or (evaluation: no partial) the running statistics; then stats. running, running_before and
// increments are (2, S), this unit's channels from offset. A k-bit store's windows come next (code_windows).
extern "C" __global__ void batchnorm_finish(
    long long rows, int C, int rows_per_chunk, real_t eps, double momentum, int S, int offset,
    const real_t* __restrict__ gamma, const real_t* __restrict__ beta, const real_t* __restrict__ partial,
    real_t* __restrict__ running, real_t* __restrict__ running_before, real_t* __restrict__ increments,
    real_t* __restrict__ stats) {
    for_finish_channels(C, [&](int c0, auto P) {  // (a piece's chunks read from memory once, then from the cache)
        for (int c = c0; c < c0 + P; ++c) {
            const long long at = offset + c;  // the channel's running mean; its variance S on
            real_t mean = partial ? 0 : running[at], var = partial ? 0 : running[S + at];  // (evaluation: running's)
            if (partial) {
                batch_moments(partial, rows, rows_per_chunk, C, c, &mean, &var);
                update_running(mean, var, rows, momentum, S, running ? running + at : nullptr,
                               running_before ? running_before + at : nullptr, increments ? increments + at : nullptr);
            }
            coefficients(mean, var, eps, gamma[c], beta[c], C, c, stats);
        }
    });
}

// ----------------------------------------------------------------------------- the windows

// [lo, hi]: v of the least and largest x of channels [c0, c0 + P) over chunks [first, first + per) of extremes
// (2, chunks, C), computed as the forward pass computes v, so that every v of those rows lies within it.
template <class Count>
__device__ __forceinline__ void v_ranges(const LaneRow<0>& row, int c0, Count P, const real_t* __restrict__ extremes,
                                         long long chunks, long long first, long long per, float* lo, float* hi) {
    const int C = row.C;
    real_t least[FINISH_PIECE], most[FINISH_PIECE];
    for (int c = 0; c < P; ++c)
        least[c] = extremes[first * C + c0 + c], most[c] = extremes[(chunks + first) * C + c0 + c];
    for (long long k = first + 1; k < min_ll(first + per, chunks); ++k)
        for (int c = 0; c < P; ++c) {
            const real_t x_lo = extremes[k * C + c0 + c], x_hi = extremes[(chunks + k) * C + c0 + c];
            least[c] = x_lo < least[c] ? x_lo : least[c];
            most[c] = x_hi > most[c] ? x_hi : most[c];
        }
    for (int c = 0; c < P; ++c) {
        lo[c] = (float)(xhat_of(row, least[c], c0 + c) + row.stat(B, c0 + c));
        hi[c] = (float)(xhat_of(row, most[c], c0 + c) + row.stat(B, c0 + c));
    }
}

// The window kinds (layers/bn.py's WINDOW_KIND), and the one place a kernel reads one: how many windows a channel
// has, and the chunks of the statistics' extremes each spans (*per): the fixed window none (of b alone), the range
// window all, the block window's WINDOW_ROWS rows (constants.py); an exact store has no window.
enum WindowKind { NO_WINDOW = 0, FIXED_WINDOW = 1, RANGE_WINDOW = 2, BLOCK_WINDOW = 3 };
__device__ __forceinline__ long long windows_per_channel(int window, long long chunks, int rows_per_chunk,
                                                         long long* per) {
    *per = window == BLOCK_WINDOW ? WINDOW_ROWS / rows_per_chunk : window == RANGE_WINDOW ? chunks : 0;
    return window == NO_WINDOW ? 0 : *per ? (chunks + *per - 1) / *per : 1;
}

// The windows' walk: body(w, c0, P) for window w's channels [c0, c0 + P): on the CPU one-thread blocks share
// (window, piece of FINISH_PIECE channels) items, whose loops over the piece vectorise; on the GPU a thread a
// window and channel (OneChannel).
template <class Body>
__device__ __forceinline__ void for_window_pieces(long long count, int C, Body body) {
    if (blockDim.x == 1) {
        const long long pieces = (C + FINISH_PIECE - 1) / FINISH_PIECE;
        for (long long i = blockIdx.x; i < count * pieces; i += gridDim.x) {
            const int c0 = (int)(i % pieces) * FINISH_PIECE;
            body(i / pieces, c0, min_int(FINISH_PIECE, C - c0));
        }
    } else {
        GRID_STRIDE_LOOP(i, count * C) body(i / C, (int)(i % C), OneChannel());
    }
}

// method: the windows a channel's codes go through ("The k-bit store"): the fixed one, or the range window of
// v_ranges over its rows (extremes (2, chunks, C): each chunk's least and largest x), narrowed to b +- clip, its
// bins split at zero by below_weight. Into windows (windows, 3, C), from batchnorm_finish's stats
// (for_window_pieces).
extern "C" __global__ void code_windows(
    int C, long long chunks, int rows_per_chunk, int window, int bits, float clip, float below_weight, int stochastic,
    const real_t* __restrict__ stats, const real_t* __restrict__ extremes, real_t* __restrict__ windows) {
    const LaneRow<0> row{0, C, stats};  // (the channel's statistics, as a row reads them)
    long long per;
    const long long count = windows_per_channel(window, chunks, rows_per_chunk, &per);
    for_window_pieces(count, C, [&](long long w, int c0, auto P) {
        float b[FINISH_PIECE], lo[FINISH_PIECE], hi[FINISH_PIECE], shift[FINISH_PIECE], below[FINISH_PIECE],
            above[FINISH_PIECE];
        for (int c = 0; c < P; ++c) b[c] = (float)row.stat(B, c0 + c);
        if (!per) {
            for (int c = 0; c < P; ++c) quant_window_fixed(b[c], bits, &shift[c], &below[c], &above[c]);
        } else {
            v_ranges(row, c0, P, extremes, chunks, w * per, per, lo, hi);
            quant_window_range(P, lo, hi, b, clip, bits, below_weight, stochastic != 0, shift, below, above);
        }
        real_t* win = windows + w * 3 * C + c0;
        for (int c = 0; c < P; ++c)
            win[SHIFT * C + c] = shift[c], win[BELOW * C + c] = below[c], win[ABOVE * C + c] = above[c];
    });
}

// ----------------------------------------------------------------------------- forward

// method: q = clamp(floor((v - 1e-6) * (1/width)) + shift_c, 0, K-1), v = xhat + b_c ("The k-bit store"), or its
// stochastic rounding by the element's draw: element c's code as a number, and its a, from one xhat.
template <bool STOCHASTIC, class Row>
__device__ __forceinline__ void code_element(const Row& row, const real_t* __restrict__ x, int c,
                                             real_t* __restrict__ q, real_t* __restrict__ a) {
    const real_t xhat = xhat_of(row, x[c], c);
    const float v = (float)(xhat + row.stat(B, c));
    *q = STOCHASTIC ? quant_code_stochastic(v, row.window(SHIFT, c), row.inv_below(c), row.inv_above(c), Row::bits,
                                            row.draw(c))
                    : quant_code(v, row.window(SHIFT, c), row.inv_below(c), row.inv_above(c), Row::bits);
    a[c] = activation(row, xhat, c);
}

// At k bits: one row's codes of v = xhat + b, packed a byte per group, and a beside them from one xhat. naive: a~,
// restored from the codes just written, goes forward instead of a (the ablation); a NaN still does, so it shows.
template <class Row>
__device__ __forceinline__ void forward_codes_row(const Row& row, const real_t* __restrict__ x, real_t* __restrict__ a,
                                                  const StoreOut& s, bool naive) {
    constexpr int BITS = Row::bits, PER = Row::per;
    unsigned char* __restrict__ codes = s.codes_at(row.e);
    if constexpr (Row::one_thread) {  // the codes as numbers into a local row, then packed
        real_t q[SCRATCH];
        if (s.stochastic)  // (a loop each: one with a branch inside would not vectorise)
            for (int c = 0; c < row.C; ++c) code_element<true>(row, x, c, q + c, a);
        else
            for (int c = 0; c < row.C; ++c) code_element<false>(row, x, c, q + c, a);
        for (int j = 0; j < row.C / PER; ++j) codes[j] = quant_pack_byte<BITS>(q + j * PER);
    } else {  // threads sharing a row: each codes its own groups, in registers
        FOR_GROUPS(j, row) {
            real_t q[PER];
            for (int t = 0; t < PER; ++t)
                if (s.stochastic) code_element<true>(row, x, j * PER + t, q + t, a);
                else code_element<false>(row, x, j * PER + t, q + t, a);
            codes[j] = quant_pack_byte<BITS>(q);
        }
    }
    if (naive)
        for_codes(row, codes, [&](float q, int c) { a[c] = a[c] == a[c] ? restored(row, q, c, s.stochastic) : a[c]; });
}

// method: a = relu(gamma_c * (x - mean_c) / sigma_c + beta_c) ("The unit") and the unit's store: x_copy = x
// (exact mode, when the store has one) or the codes (forward_codes_row).
template <class Row>
__device__ __forceinline__ void forward_row(const Row& row, const real_t* __restrict__ x, real_t* __restrict__ a,
                                            const StoreOut& s, bool naive) {
    x += row.e, a += row.e;
    if constexpr (Row::bits == 0) {
        real_t* __restrict__ x_copy = s.x_at(row.e);
        if (x_copy) FOR_CHANNELS(c, row) x_copy[c] = x[c];
        FOR_CHANNELS(c, row) a[c] = activation(row, xhat_of(row, x[c], c), c);
    } else {
        forward_codes_row(row, x, a, s, naive);
    }
}

// a and the store (forward_row) of x, a, x_copy (rows, C), codes (rows * C * k / 8,), through code_windows's windows,
// stochastic codes by element (r, c)'s draw from rounding_key; naive: a~ goes forward instead of a (the ablation).
extern "C" __global__ void batchnorm_relu_forward(
    long long rows, int C, int rows_per_chunk, int bits, int stochastic, real_t* __restrict__ x_copy,
    unsigned char* __restrict__ codes, const real_t* __restrict__ windows, long long window_rows,
    const real_t* __restrict__ stats, const real_t* __restrict__ beta, int naive,
    const long long* __restrict__ rounding_key, const real_t* __restrict__ x, real_t* __restrict__ a) {
    const UnitTables u{rows, C, stats, beta, windows, window_rows, nullptr, stochastic != 0,
                       stochastic ? *rounding_key : 0};
    const StoreOut s{bits, stochastic != 0, x_copy, codes};
    for_rows(u, bits, rows_per_chunk, [&](const auto& row) { forward_row(row, x, a, s, naive != 0); });
}

// keys[u] = the rounding key of unit u < units in this forward pass (quant_rounding_key), from the pass's draw,
// which then counts on: draw[0] += 1, the next pass's. One thread (launch one block of one): the keys of a pass are
// taken once, before its units run, from a draw the host writes before a step (step.py) or a forward.
extern "C" __global__ void rounding_keys(
    int units, long long seed_hash, long long* __restrict__ draw, long long* __restrict__ keys) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        for (int u = 0; u < units; ++u) keys[u] = quant_rounding_key(seed_hash, draw[0], u);
        draw[0] += 1;
    }
}

// ----------------------------------------------------------------------------- backward

// method: a recomputed from x in exact mode, a~ = relu(gamma_c * vhat) restored from the codes at k bits
// ("What a unit keeps and its backward pass"): one row's.
template <class Row>
__device__ __forceinline__ void restore_row(const Row& row, const StoreIn& s, real_t* __restrict__ a) {
    a += row.e;
    if constexpr (Row::bits == 0) {
        const real_t* __restrict__ x = s.x_at(row.e);
        FOR_CHANNELS(c, row) a[c] = activation(row, xhat_of(row, x[c], c), c);
    } else {
        for_codes(row, s.codes_at(row.e), [&](float q, int c) { a[c] = restored(row, q, c, s.stochastic); });
    }
}

// Recompute a (exact mode) or restore a~ = relu(gamma_c * vhat) (k-bit) from the store. a is (rows, C).
extern "C" __global__ void batchnorm_relu_restore(
    long long rows, int C, int rows_per_chunk, int bits, int stochastic, const real_t* __restrict__ x_copy,
    const unsigned char* __restrict__ codes, const real_t* __restrict__ windows, long long window_rows,
    const real_t* __restrict__ stats, const real_t* __restrict__ beta, real_t* __restrict__ a) {
    const UnitTables u{rows, C, stats, beta, windows, window_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    for_rows(u, bits, rows_per_chunk, [&](const auto& row) { restore_row(row, s, a); });
}

// method: dy = da * mask, dbeta += sum(dy), dgamma += sum(dy * xhat~) ("What a unit keeps and its backward pass"):
// one row's terms (the mask a factor, as the reference's) into the reduction's sums row.sum0 and row.sum1.
// RESTORE: the row's a (exact mode) or a~ into a too (restore_row's), from the same read of the store.
template <bool RESTORE, class Row>
__device__ __forceinline__ void backward_sums_row(const Row& row, const real_t* __restrict__ da, const StoreIn& s,
                                                  real_t* __restrict__ a) {
    real_t* __restrict__ dbeta = row.sum0;
    real_t* __restrict__ dgamma = row.sum1;
    da += row.e, a += RESTORE ? row.e : 0;
    // (the two loops spelled out: a shared helper taking a lambda stopped g++ vectorising)
    if constexpr (Row::bits == 0) {
        const real_t* __restrict__ x = s.x_at(row.e);
        FOR_CHANNELS(c, row) {
            real_t on;
            const real_t xhat = xhat_from_x(row, x[c], c, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
            if constexpr (RESTORE) a[c] = activation(row, xhat, c);
        }
    } else {
        for_codes(row, s.codes_at(row.e), [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(row, q, c, s.stochastic, &on), dy = da[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
            if constexpr (RESTORE) a[c] = restored(row, q, c, s.stochastic);
        });
    }
}

// The partial sums (2, chunks, C) of dbeta and dgamma over each chunk of rows (backward_sums_row); with a (rows,
// C), the restored activation too, which the unit's conv reads for its weight gradient: one read of the store.
extern "C" __global__ void batchnorm_relu_backward_sums(
    long long rows, int C, int rows_per_chunk, int bits, int stochastic, const real_t* __restrict__ x_copy,
    const unsigned char* __restrict__ codes, const real_t* __restrict__ windows, long long window_rows,
    const real_t* __restrict__ stats, const real_t* __restrict__ beta, const real_t* __restrict__ da,
    real_t* __restrict__ partial, real_t* __restrict__ a) {
    const UnitTables u{rows, C, stats, beta, windows, window_rows};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    const auto sums_row = [&](const auto& row) { backward_sums_row<false>(row, da, s, a); };
    const auto sums_and_a_row = [&](const auto& row) { backward_sums_row<true>(row, da, s, a); };
    if (a) for_sum_rows(u, bits, rows_per_chunk, partial, sums_and_a_row);
    else for_sum_rows(u, bits, rows_per_chunk, partial, sums_row);
}

// The batch's dbeta and dgamma from batchnorm_relu_backward_sums's partial sums (2, chunks, C), added in order
// (for_finish_channels): into sums (2, C), for batchnorm_relu_backward_dx, and into the gradients dbeta, dgamma
// (added to them with accumulate; else 0 + them, what a zeroed gradient and accumulate give, a negative zero included).
extern "C" __global__ void batchnorm_backward_finish(
    int C, long long chunks, int accumulate, const real_t* __restrict__ partial, real_t* __restrict__ sums,
    real_t* __restrict__ dbeta, real_t* __restrict__ dgamma) {
    for_finish_channels(C, [&](int c0, auto P) {
        real_t sum[FINISH_PIECE] = {}, sum_xhat[FINISH_PIECE] = {}, *d = dbeta + c0, *g = dgamma + c0;
        const real_t* __restrict__ part = partial + c0;  // (2, chunks, C) from channel c0
        for (long long k = 0; k < chunks; ++k)
            for (int c = 0; c < P; ++c) sum[c] += part[k * C + c], sum_xhat[c] += part[(chunks + k) * C + c];
        for (int c = 0; c < P; ++c) {
            sums[c0 + c] = sum[c], sums[C + c0 + c] = sum_xhat[c];
            d[c] = (accumulate ? d[c] : (real_t)0) + sum[c], g[c] = (accumulate ? g[c] : (real_t)0) + sum_xhat[c];
        }
    });
}

// method: dx = gamma_c / sigma_c * (dy - sum(dy)/M - xhat~ * sum(dy * xhat~)/M) [+ residual gradient] ("What a
// unit keeps and its backward pass"): one row's [and shortcut_grad = dx], the batch's dbeta and dgamma in
// row.sums, inv_count = 1/M.
template <class Row>
__device__ __forceinline__ void backward_dx_row(const Row& row, const real_t* __restrict__ da, const StoreIn& s,
                                                real_t inv_count, const real_t* residual_grad, real_t* shortcut_grad,
                                                real_t* __restrict__ dx) {
    da += row.e, dx += row.e;
    const real_t* __restrict__ dbeta = row.sums;
    const real_t* __restrict__ dgamma = row.sums + row.C;
    if constexpr (Row::bits == 0) {
        const real_t* __restrict__ x = s.x_at(row.e);
        FOR_CHANNELS(c, row) {
            real_t on;
            const real_t xhat = xhat_from_x(row, x[c], c, &on), dy = da[c] * on;
            dx[c] = row.dx_scale(c) * (dy - dbeta[c] * inv_count - xhat * dgamma[c] * inv_count);
        }
    } else {
        for_codes(row, s.codes_at(row.e), [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(row, q, c, s.stochastic, &on), dy = da[c] * on;
            dx[c] = row.dx_scale(c) * (dy - dbeta[c] * inv_count - xhat * dgamma[c] * inv_count);
        });
    }
    if (residual_grad)  // in a loop of its own, which keeps the one above simple enough for g++ to vectorise
        FOR_CHANNELS(c, row) dx[c] += residual_grad[row.e + c];
    if (shortcut_grad)
        FOR_CHANNELS(c, row) shortcut_grad[row.e + c] = dx[c];
}

// dx (backward_dx_row) of (rows, C) arrays, sums (2, C) this batch's dbeta and dgamma: residual_grad the residual
// gradient arriving at a residual block's input, shortcut_grad the gradient its shortcut takes back to the block's
// input (it may be residual_grad's buffer). dx is not da.
extern "C" __global__ void batchnorm_relu_backward_dx(
    long long rows, int C, int rows_per_chunk, int bits, int stochastic, const real_t* __restrict__ x_copy,
    const unsigned char* __restrict__ codes, const real_t* __restrict__ windows, long long window_rows,
    const real_t* __restrict__ stats, const real_t* __restrict__ beta, const real_t* __restrict__ da,
    const real_t* __restrict__ sums, real_t inv_count, const real_t* residual_grad, real_t* shortcut_grad,
    real_t* __restrict__ dx) {
    const UnitTables u{rows, C, stats, beta, windows, window_rows, sums};
    const StoreIn s{bits, stochastic != 0, x_copy, codes};
    for_rows(u, bits, rows_per_chunk,
             [&](const auto& row) { backward_dx_row(row, da, s, inv_count, residual_grad, shortcut_grad, dx); });
}
