// Batch normalisation + ReLU of one unit, fused with writing (and reading) its activation store.
// NumPy references: minibp/layers/bn.py (batchnorm_relu_*_ref) and minibp/quant.py.
//
// Activations are (rows, C), channels last. stats is the unit's (7, C) table, written by the
// forward pass and read by the backward pass:
//     stats[0] = mean_c      stats[1] = sigma_c = sqrt(var_c + eps)
//     stats[2] = gamma_c, gamma clamped to >= GAMMA_MIN (1e-8)      stats[3] = b_c = beta_c / gamma_c
//     stats[4:7] = shift_c, below_c, above_c: the window of channel c's k-bit code (quant.cuh)
// The store is x itself (bits = 0, "exact" mode) or the k-bit codes of v = xhat + b (quant.cuh), coded
// through windows (blocks, 3, C): a window per channel for each block of block_rows rows. The fixed and
// range windows are one block, stats[4:7] (block_rows >= rows); the block window is the unit's own.
//
// Layout: blocks walk rows, the threads of a block walk a row's channels. Rows are dealt out in chunks
// of rows_per_chunk consecutive rows: a block has blockDim.y row lanes (threadIdx.y), the grid
// gridDim.x * blockDim.y, and lane l takes chunks l, l + lanes, ... The blockDim.x threads of a lane
// share each of its rows: thread t takes the row's groups t, t + blockDim.x, ..., a group being one
// channel in exact mode and one code byte (8/k channels) at k bits, so no two threads write one byte.
// On the GPU (layers/launch.py picks the shape by device) adjacent threads read adjacent addresses, and a
// thread decodes its code bytes in registers. On the CPU a block is one thread and takes one contiguous
// run of rows, which it walks as wide rows (for_wide_rows: several narrow rows, or a piece of a broad one,
// as one row of at most SCRATCH channels); its loops over a row are the plain loops over channels, and it
// decodes a row's codes into a local row of numbers first (for_codes), so that those loops vectorise.
// Reductions write one row of partial sums per chunk, summing the chunk's rows in order, and xp adds
// the chunks up: their results do not depend on the launch shape.
#include "common.cuh"
#include "quant.cuh"

#ifndef GAMMA_MIN
#error "GAMMA_MIN comes from minibp/constants.py: build through minibp.kernels"
#endif

#define MEAN(c) stats[(c)]
#define SIGMA(c) stats[C + (c)]
#define GAMMA(c) stats[2 * C + (c)]
#define B(c) stats[3 * C + (c)]
// A k-bit code's window: win is the (3, C) window of the row's block (UnitStore::window).
#define SHIFT(c) win[(c)]
#define BELOW(c) win[C + (c)]
#define ABOVE(c) win[2 * C + (c)]

// A unit's store as its kernels read it, built once by each kernel from its arguments: the (7, C) stats and
// beta, and x itself (x_copy, bits = 0) or the codes of v = xhat + b (bits > 0) through windows (blocks, 3, C),
// a window per channel for each block of block_rows rows, its levels the bins' midpoints or, stochastic, their
// edges (quant.cuh). The row functions below take a row's parts.
struct UnitStore {
    long long rows;
    int C, bits;
    const real_t* stats;
    const real_t* beta;
    const real_t* windows;
    long long block_rows;
    bool stochastic;
    real_t* x_copy;        // (rows, C), exact mode
    unsigned char* codes;  // (rows * C * bits / 8,), k bits

    // Row r's window (one block, the fixed and range windows', costs no division).
    template <int BITS>
    __device__ __forceinline__ const real_t* window(long long r) const {
        return !BITS ? nullptr : block_rows >= rows ? windows : windows + r / block_rows * 3 * C;
    }
    // The store from element e = r*C + c on (c a whole code byte's first channel at k bits).
    template <int BITS>
    __device__ __forceinline__ real_t* x_at(long long e) const { return BITS || !x_copy ? nullptr : x_copy + e; }
    template <int BITS>
    __device__ __forceinline__ unsigned char* codes_at(long long e) const { return BITS ? codes + e * BITS / 8 : nullptr; }
};

// The loops over a row's groups and channels that are this thread's. STEP is a template parameter of
// the functions below: 1 when a block has one thread (the CPU's launch), so that g++ sees a unit step
// and vectorises, else 0, meaning blockDim.x.
// for (each of this thread's groups j of a row of n groups)
#define GROUP_LOOP(j, n) for (int j = STEP ? 0 : threadIdx.x; j < (n); j += STEP ? STEP : blockDim.x)
// for (each channel c of this thread's groups, PER channels a group)
#define CHANNEL_LOOP(c, C)                                         \
    for (int c = STEP ? 0 : threadIdx.x * PER; c < (C);            \
         c += STEP || (c + 1) % PER ? 1 : (blockDim.x - 1) * PER + 1)

// Channels a group: a code byte's at k bits, one in exact mode (BITS = 0).
template <int BITS>
__device__ __forceinline__ constexpr int group_size() { return BITS ? 8 / BITS : 1; }

// f<BITS, STEP>(...) for the runtime bits and block shape: straight-line loops in every case.
#define DISPATCH_BITS(bits, f, STEP, ...)         \
    do {                                          \
        if ((bits) == 0) f<0, STEP>(__VA_ARGS__); \
        if ((bits) == 2) f<2, STEP>(__VA_ARGS__); \
        if ((bits) == 4) f<4, STEP>(__VA_ARGS__); \
        if ((bits) == 8) f<8, STEP>(__VA_ARGS__); \
    } while (0)
#define DISPATCH(bits, f, ...)                                  \
    do {                                                        \
        if (blockDim.x == 1) DISPATCH_BITS(bits, f, 1, __VA_ARGS__); \
        else DISPATCH_BITS(bits, f, 0, __VA_ARGS__);            \
    } while (0)

// xhat as the forward pass computes it from x.
__device__ __forceinline__ real_t xhat_of(real_t x, int c, int C, const real_t* stats) {
    return (x - MEAN(c)) / SIGMA(c);
}

// xhat and the ReLU mask (as 0 or 1) of element c as the backward pass reads them: from x (exact mode) ...
__device__ __forceinline__ real_t xhat_from_x(real_t x, int c, int C, const real_t* stats, const real_t* beta,
                                              real_t* on) {
    const real_t xhat = xhat_of(x, c, C, stats);
    *on = GAMMA(c) * xhat + beta[c] > 0 ? (real_t)1 : (real_t)0;  // a select: g++ does not vectorise bool -> float
    return xhat;
}

// ... and from the code q (k bits) through its row's window.
__device__ __forceinline__ real_t xhat_from_code(float q, int c, int C, const real_t* stats, const real_t* win,
                                                 bool stochastic, real_t* on) {
    *on = quant_mask(q, (float)SHIFT(c)) ? (real_t)1 : (real_t)0;
    return quant_xhat(q, (float)SHIFT(c), (float)BELOW(c), (float)ABOVE(c), stochastic, B(c));
}

// body(q, c) for each of this thread's channels c of a row of codes, q the code as a number.
constexpr int SCRATCH = 128;  // channels of a CPU thread's rows at most (for_wide_rows)
template <int BITS, int STEP, class Body>
__device__ __forceinline__ void for_codes(int C, const unsigned char* __restrict__ row_codes, Body body) {
    constexpr int PER = group_size<BITS>();
    if constexpr (STEP == 1) {
        // One thread a row (the CPU), of at most SCRATCH channels: its codes into a local row of numbers
        // first, so that the loop over them is a plain float loop, which g++ vectorises even for a short row.
        real_t q[SCRATCH];
        quant_unpack_row<BITS>(row_codes, q, C);
        for (int c = 0; c < C; ++c) body((float)q[c], c);
    } else {  // threads sharing a row (the GPU): each decodes its own bytes, in registers
        GROUP_LOOP(j, C / PER) {
            const int byte = row_codes[j];
            for (int t = 0; t < PER; ++t) body((float)quant_slot<BITS>(byte, t), j * PER + t);
        }
    }
}

// ----------------------------------------------------------------------------- the CPU's wide rows

// On the CPU a block is one thread, and a row of few channels (16 in ResNet-164's first stage) leaves each
// of its vector loops a vector or two long, so that setting a loop up costs more than its work (a 4-bit
// unit of 16 channels took 2.5x its exact time). So the CPU walks a run of rows that share a window as
// wide rows: n consecutive rows are one row of n*C channels whose per-channel tables repeat n times in a
// local copy (a row of more than SCRATCH channels goes in pieces of SCRATCH channels). The tables also
// hold per channel what a GPU thread divides out per value (DX_SCALE, SCALE_BELOW, SCALE_ABOVE: the same
// float operations on the same operands, so the same bits). Every element sees the same arithmetic, so the
// bytes are the same; the reductions still add their rows in order (backward_sums_rows).
struct WideTables {  // laid out for the wide row's Cw <= SCRATCH channels
    real_t stats[8 * SCRATCH];  // (8, Cw): the unit's stats, then gamma / sigma
    real_t beta[SCRATCH];       // (Cw,)
    real_t win[5 * SCRATCH];    // (5, Cw): shift, below, above, then 1/below and 1/above (as floats)
    real_t sums[2 * SCRATCH];   // (2, Cw): backward_dx's dbeta and dgamma
};

// Rows a wide row: the most, a power of two (so that it divides a block window's rows), with n*C <= SCRATCH.
__device__ __forceinline__ int wide_rows(int C) {
    int n = 1;
    while (2 * n * C <= SCRATCH) n *= 2;
    return n;
}

// to[i, t*P + c] = from[i, c0 + c] for t < n, c < P: rows [0, count) of a (count, C) table, channels
// [c0, c0 + P), repeated n times side by side.
__device__ __forceinline__ void repeat_rows(const real_t* __restrict__ from, int count, int C, int c0, int P, int n,
                                            real_t* __restrict__ to) {
    for (int i = 0; i < count; ++i)
        for (int t = 0; t < n; ++t)
            for (int c = 0; c < P; ++c) to[(i * n + t) * P + c] = from[i * C + c0 + c];
}

// The chunks of rows_per_chunk rows that are this thread's on the CPU: [*first, *end), a contiguous share
// (CHUNK_LOOP deals every lanes-th chunk), so that its wide rows' tables are built once, not once a chunk.
// Which thread sums which chunk changes no result.
__device__ __forceinline__ void lane_chunks(long long chunks, long long* first, long long* end) {
    const long long lanes = (long long)gridDim.x * blockDim.y, lane = (long long)blockIdx.x * blockDim.y + threadIdx.y,
                    per = (chunks + lanes - 1) / lanes;
    *first = min_ll(lane * per, chunks);
    *end = min_ll(*first + per, chunks);
}

// body(r, c0, n, Cw, tables) for rows [first, end) of one thread: channels [c0, c0 + Cw/n) of rows r .. r + n
// as one row of Cw channels, the tables laid out for it; a wide row never crosses a multiple of split rows
// (a reduction's chunk) or of the window's block. sums, (2, C) or null, is read by backward_dx.
template <int BITS, class Body>
__device__ void for_wide_rows(const UnitStore& s, long long first, long long end, long long split, const real_t* sums,
                              Body body) {
    const int C = s.C, most = wide_rows(C), P = C < SCRATCH ? C : SCRATCH;
    WideTables t;
    int tables_n = 0, tables_c0 = -1;  // what the tables are laid out for: n rows of channels from c0 ...
    const real_t* tables_window = nullptr;  // ... and which window they hold
    for (long long run = first; run < end;) {  // a run of rows in one window's block
        const real_t* window = s.window<BITS>(run);
        const long long block_end = BITS ? (run / s.block_rows + 1) * s.block_rows : end,
                        run_end = min_ll(min_ll(block_end, (run / split + 1) * split), end);
        for (int c0 = 0; c0 < C; c0 += P) {
            const int piece = C - c0 < P ? C - c0 : P;
            for (long long r = run; r < run_end;) {
                const int n = run_end - r < most ? (int)(run_end - r) : most, Cw = n * piece;
                if (n != tables_n || c0 != tables_c0) {
                    repeat_rows(s.stats, 7, C, c0, piece, n, t.stats);
                    for (int c = 0; c < Cw; ++c) t.stats[7 * Cw + c] = t.stats[2 * Cw + c] / t.stats[Cw + c];
                    repeat_rows(s.beta, 1, C, c0, piece, n, t.beta);
                    if (sums) repeat_rows(sums, 2, C, c0, piece, n, t.sums);
                    tables_window = nullptr;
                }
                if (BITS && (window != tables_window || n != tables_n || c0 != tables_c0)) {
                    repeat_rows(window, 3, C, c0, piece, n, t.win);
                    for (int c = 0; c < 2 * Cw; ++c) t.win[3 * Cw + c] = (real_t)(1.0f / (float)t.win[Cw + c]);
                    tables_window = window;
                }
                tables_n = n, tables_c0 = c0;
                body(r, c0, n, Cw, t);
                r += n;
            }
        }
        run = run_end;
    }
}

// On the CPU (STEP = 1, the wide tables) read, on the GPU computed: a value of channel c of a row's
// tables that the CPU computes once per wide row.
#define DX_SCALE(c) (STEP == 1 ? stats[7 * C + (c)] : GAMMA(c) / SIGMA(c))
#define SCALE_BELOW(c) (STEP == 1 ? (float)win[3 * C + (c)] : 1.0f / (float)BELOW(c))
#define SCALE_ABOVE(c) (STEP == 1 ? (float)win[4 * C + (c)] : 1.0f / (float)ABOVE(c))

// ----------------------------------------------------------------------------- statistics

template <int STEP>
__device__ __forceinline__ void channel_sums_row(int C, const real_t* __restrict__ x_row,
                                                 const real_t* __restrict__ shift, real_t* __restrict__ sum,
                                                 real_t* __restrict__ sum_sq) {
    constexpr int PER = 1;
    CHANNEL_LOOP(c, C) {
        const real_t d = x_row[c] - shift[c];
        sum[c] += d;
        sum_sq[c] += d * d;
    }
}

// In a loop of its own: with the sums above it would keep g++ from vectorising either.
template <int STEP>
__device__ __forceinline__ void channel_extremes_row(int C, const real_t* __restrict__ x_row,
                                                     real_t* __restrict__ least, real_t* __restrict__ most) {
    constexpr int PER = 1;
    CHANNEL_LOOP(c, C) {
        least[c] = x_row[c] < least[c] ? x_row[c] : least[c];
        most[c] = x_row[c] > most[c] ? x_row[c] : most[c];
    }
}

template <int STEP>
__device__ void channel_sums_rows(long long rows, int C, int rows_per_chunk, bool extremes,
                                  const real_t* __restrict__ x, const real_t* __restrict__ shift,
                                  real_t* __restrict__ partial) {
    constexpr int PER = 1;
    const long long chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    CHUNK_LOOP(chunk, chunks) {
        real_t* sum = partial + chunk * C;
        real_t* sum_sq = partial + (chunks + chunk) * C;
        real_t* least = partial + (2 * chunks + chunk) * C;
        real_t* most = partial + (3 * chunks + chunk) * C;
        CHANNEL_LOOP(c, C) sum[c] = sum_sq[c] = 0;
        if (extremes) CHANNEL_LOOP(c, C) least[c] = most[c] = x[chunk * rows_per_chunk * C + c];
        CHUNK_ROWS(r, chunk, rows, rows_per_chunk) {
            channel_sums_row<STEP>(C, x + r * C, shift, sum, sum_sq);
            if (extremes) channel_extremes_row<STEP>(C, x + r * C, least, most);
        }
    }
}

// partial[0, chunk, c] = sum over the chunk's rows of x - shift, partial[1, chunk, c] of (x - shift)^2,
// and with extremes partial[2, chunk, c], partial[3, chunk, c] the chunk's least and largest x (for the
// range windows): partial is (2 or 4, chunks, C). With the shift near the mean (layers/bn.py: the mean of
// rows spread over the batch) one pass gives the variance without the cancellation of a large mean.
extern "C" __global__ void channel_sums(long long rows, int C, int rows_per_chunk, int extremes,
                                        const real_t* __restrict__ x, const real_t* __restrict__ shift,
                                        real_t* __restrict__ partial) {
    if (blockDim.x == 1) channel_sums_rows<1>(rows, C, rows_per_chunk, extremes != 0, x, shift, partial);
    else channel_sums_rows<0>(rows, C, rows_per_chunk, extremes != 0, x, shift, partial);
}

// Given the batch mean and variance in stats[0], stats[1]: sigma, the clamped gamma and b into stats[1:4].
// One thread per channel.
extern "C" __global__ void batchnorm_coefficients(int C, real_t eps, const real_t* __restrict__ gamma,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ stats) {
    GRID_STRIDE_LOOP(c, C) {
        SIGMA(c) = sqrt(SIGMA(c) + eps);
        const real_t g = gamma[c] < (real_t)GAMMA_MIN ? (real_t)GAMMA_MIN : gamma[c];  // (NaN passes through)
        GAMMA(c) = g;
        B(c) = beta[c] / g;
    }
}

// The code's windows (blocks, 3, C) from stats[0:4] (batchnorm_coefficients): fixed, or (range) from extremes
// (2, chunks, C), the least and largest x of each chunk of rows, a block being chunks_per_block chunks, its
// [lo, hi] narrowed to b +- clip, its bins split at zero by below_weight. One thread per block and channel.
// [lo, hi] is v of those x computed as the forward pass computes v, so that every v of the block lies
// within it. (extremes and windows may overlap, hence no __restrict__: the range window's are rows of
// stats, and a thread reads its extremes before it writes its window.)
extern "C" __global__ void code_windows(int C, int blocks, int chunks, int chunks_per_block, int bits, int range,
                                        float clip, float below_weight, int stochastic, const real_t* __restrict__ stats,
                                        const real_t* extremes, real_t* windows) {
    GRID_STRIDE_LOOP(i, (long long)blocks * C) {
        const int c = (int)(i % C);
        const long long block = i / C;
        float shift, below, above;
        if (range) {
            const long long first = block * chunks_per_block;
            real_t least = extremes[first * C + c], most = extremes[(chunks + first) * C + c];
            for (long long k = first + 1; k < chunks && k < first + chunks_per_block; ++k) {
                const real_t lo = extremes[k * C + c], hi = extremes[(chunks + k) * C + c];
                least = lo < least ? lo : least;
                most = hi > most ? hi : most;
            }
            quant_window_range((float)(xhat_of(least, c, C, stats) + B(c)), (float)(xhat_of(most, c, C, stats) + B(c)),
                               (float)B(c), clip, bits, below_weight, stochastic != 0, &shift, &below, &above);
        } else {
            quant_window_fixed((float)B(c), bits, &shift, &below, &above);
        }
        real_t* win = windows + block * 3 * C;
        SHIFT(c) = shift, BELOW(c) = below, ABOVE(c) = above;
    }
}

// ----------------------------------------------------------------------------- forward

// body(r, c0, n, e, Cw, stats, win, beta, sums) for each row of this thread (the GPU: one row, c0 = 0, n = 1,
// Cw = C) or wide row (the CPU: for_wide_rows): channels [c0, c0 + Cw/n) of rows r .. r + n, its first element
// e = r*C + c0, Cw channels in all, the tables laid out for them.
template <int BITS, int STEP, class Body>
__device__ __forceinline__ void for_rows(const UnitStore& s, int rows_per_chunk, const real_t* sums, Body body) {
    const int C = s.C;
    if constexpr (STEP == 1) {
        long long first, end;
        lane_chunks((s.rows + rows_per_chunk - 1) / rows_per_chunk, &first, &end);
        for_wide_rows<BITS>(s, first * rows_per_chunk, min_ll(end * rows_per_chunk, s.rows), s.rows, sums,
                            [&](long long r, int c0, int n, int Cw, const WideTables& t) {
            body(r, c0, n, r * C + c0, Cw, t.stats, t.win, t.beta, t.sums);
        });
    } else
        ROW_LOOP(r, s.rows, rows_per_chunk) body(r, 0, 1, r * C, C, s.stats, s.window<BITS>(r), s.beta, sums);
}

// The stochastic draws of a CPU thread's wide row (for_wide_rows): channels [c0, c0 + piece) of rows r, r + 1, ...,
// Cw channels in all, element (row, c)'s draw as a GPU thread takes it (quant_uniform), each row hashed once.
__device__ __forceinline__ void wide_row_draws(long long rounding_key, long long r, int c0, int piece, int Cw,
                                               float* __restrict__ draws) {
    for (int t = 0; t * piece < Cw; ++t) {
        const unsigned int row_hash = quant_row_hash(rounding_key, r + t);
        for (int c = 0; c < piece; ++c) draws[t * piece + c] = quant_uniform(row_hash, c0 + c);
    }
}

// One row's a and store. Stochastic rounding's draws: on the CPU draws[c] is channel c's (wide_row_draws), on
// the GPU it is computed from row_hash, channel c of the row being channel c0 + c.
template <int BITS, int STEP>
__device__ __forceinline__ void forward_row(int C, bool naive, bool stochastic, const float* __restrict__ draws,
                                            unsigned int row_hash, int c0, const real_t* __restrict__ x_row,
                                            const real_t* __restrict__ stats, const real_t* __restrict__ win,
                                            const real_t* __restrict__ beta,
                                            real_t* __restrict__ a_row, real_t* __restrict__ x_copy_row,
                                            unsigned char* __restrict__ row_codes) {
    constexpr int PER = group_size<BITS>();
    if constexpr (BITS == 0) {
        if (x_copy_row) CHANNEL_LOOP(c, C) x_copy_row[c] = x_row[c];
    } else if constexpr (STEP == 1) {  // the CPU: the codes as numbers into a local row and a beside them, from one xhat
        real_t q[SCRATCH];
        if (stochastic)  // (a loop each: one with a branch inside would not vectorise)
            for (int c = 0; c < C; ++c) {
                const real_t xhat = xhat_of(x_row[c], c, C, stats);
                q[c] = quant_code_stochastic((float)(xhat + B(c)), (float)SHIFT(c), SCALE_BELOW(c), SCALE_ABOVE(c),
                                             BITS, draws[c]);
                a_row[c] = relu(GAMMA(c) * xhat + beta[c]);
            }
        else
            for (int c = 0; c < C; ++c) {
                const real_t xhat = xhat_of(x_row[c], c, C, stats);
                q[c] = quant_code((float)(xhat + B(c)), (float)SHIFT(c), SCALE_BELOW(c), SCALE_ABOVE(c), BITS);
                a_row[c] = relu(GAMMA(c) * xhat + beta[c]);
            }
        for (int j = 0; j < C / PER; ++j) row_codes[j] = quant_pack_byte<BITS>(q + j * PER);
        if (naive)  // a~ goes forward instead of a (a NaN still does, so divergence shows)
            for (int c = 0; c < C; ++c) {
                const real_t restored = quant_restore((float)q[c], (float)SHIFT(c), (float)BELOW(c), (float)ABOVE(c),
                                                      stochastic, GAMMA(c));
                a_row[c] = a_row[c] == a_row[c] ? restored : a_row[c];
            }
        return;
    } else {  // the GPU: the codes as numbers into a_row (scratch: a is written below), then packed
        if (stochastic)
            CHANNEL_LOOP(c, C) {
                const float v = (float)(xhat_of(x_row[c], c, C, stats) + B(c));
                a_row[c] = quant_code_stochastic(v, (float)SHIFT(c), SCALE_BELOW(c), SCALE_ABOVE(c), BITS,
                                                 quant_uniform(row_hash, c0 + c));
            }
        else
            CHANNEL_LOOP(c, C) {
                const float v = (float)(xhat_of(x_row[c], c, C, stats) + B(c));
                a_row[c] = quant_code(v, (float)SHIFT(c), SCALE_BELOW(c), SCALE_ABOVE(c), BITS);
            }
        GROUP_LOOP(j, C / PER) row_codes[j] = quant_pack_byte<BITS>(a_row + j * PER);
    }
    if (BITS && naive) {  // a~ goes forward instead of a (a NaN still does, so divergence shows)
        CHANNEL_LOOP(c, C) {
            const real_t exact = relu(GAMMA(c) * xhat_of(x_row[c], c, C, stats) + beta[c]);
            const real_t restored =
                quant_restore((float)a_row[c], (float)SHIFT(c), (float)BELOW(c), (float)ABOVE(c), stochastic, GAMMA(c));
            a_row[c] = exact == exact ? restored : exact;
        }
        return;
    }
    CHANNEL_LOOP(c, C) a_row[c] = relu(GAMMA(c) * xhat_of(x_row[c], c, C, stats) + beta[c]);
}

template <int BITS, int STEP>
__device__ void forward_rows(const UnitStore& s, int rows_per_chunk, bool naive, long long rounding_key,
                             const real_t* x, real_t* a) {
    const bool stochastic = s.stochastic;
    for_rows<BITS, STEP>(s, rows_per_chunk, nullptr,
                         [&](long long r, int c0, int n, long long e, int Cw, const real_t* stats, const real_t* win,
                             const real_t* beta, const real_t*) {
        float draws[STEP == 1 ? SCRATCH : 1];
        if (STEP == 1 && stochastic) wide_row_draws(rounding_key, r, c0, Cw / n, Cw, draws);
        forward_row<BITS, STEP>(Cw, naive, stochastic, draws,
                                STEP != 1 && stochastic ? quant_row_hash(rounding_key, r) : 0u, c0, x + e, stats, win,
                                beta, a + e, s.x_at<BITS>(e), s.codes_at<BITS>(e));
    });
}

// a = relu(gamma_c * (x - mean) / sigma + beta), and the store: x_copy = x (exact mode) or the codes
// of v = xhat + b (bits > 0) through windows (above), rounded down (quant_code) or, stochastic, at random
// (quant_code_stochastic, element (r, c)'s draw from rounding_key). naive writes a~ (restored from the
// codes) instead of a: the ablation that feeds approximations forward. x, a, x_copy are (rows, C); codes
// (rows * C * k / 8,).
extern "C" __global__ void batchnorm_relu_forward(long long rows, int C, int rows_per_chunk, int bits, int naive,
                                                  int stochastic, long long rounding_key,
                                                  const real_t* __restrict__ x, const real_t* __restrict__ stats,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  const real_t* __restrict__ beta, real_t* __restrict__ a,
                                                  real_t* __restrict__ x_copy, unsigned char* __restrict__ codes) {
    const UnitStore s{rows, C, bits, stats, beta, windows, block_rows, stochastic != 0, x_copy, codes};
    DISPATCH(bits, forward_rows, s, rows_per_chunk, naive != 0, rounding_key, x, a);
}

// ----------------------------------------------------------------------------- backward

template <int BITS, int STEP>
__device__ __forceinline__ void restore_row(int C, const real_t* __restrict__ x_row,
                                            const unsigned char* __restrict__ row_codes,
                                            const real_t* __restrict__ stats, const real_t* __restrict__ win,
                                            const real_t* __restrict__ beta, bool stochastic,
                                            real_t* __restrict__ a_row) {
    constexpr int PER = group_size<BITS>();
    if constexpr (BITS == 0)
        CHANNEL_LOOP(c, C) a_row[c] = relu(GAMMA(c) * xhat_of(x_row[c], c, C, stats) + beta[c]);
    else
        for_codes<BITS, STEP>(C, row_codes, [&](float q, int c) {
            a_row[c] = quant_restore(q, (float)SHIFT(c), (float)BELOW(c), (float)ABOVE(c), stochastic, GAMMA(c));
        });
}

template <int BITS, int STEP>
__device__ void restore_rows(const UnitStore& s, int rows_per_chunk, real_t* a) {
    for_rows<BITS, STEP>(s, rows_per_chunk, nullptr,
                         [&](long long, int, int, long long e, int Cw, const real_t* stats, const real_t* win,
                             const real_t* beta, const real_t*) {
        restore_row<BITS, STEP>(Cw, s.x_at<BITS>(e), s.codes_at<BITS>(e), stats, win, beta, s.stochastic, a + e);
    });
}

// Recompute a (exact mode) or restore a~ = relu(gamma_c * vhat) (k-bit) from the store. a is (rows, C).
extern "C" __global__ void batchnorm_relu_restore(long long rows, int C, int rows_per_chunk, int bits,
                                                  const real_t* __restrict__ x_copy,
                                                  const unsigned char* __restrict__ codes,
                                                  const real_t* __restrict__ stats,
                                                  const real_t* __restrict__ windows, long long block_rows,
                                                  int stochastic, const real_t* __restrict__ beta,
                                                  real_t* __restrict__ a) {
    // (a store the kernels below only read: the casts let it share UnitStore with the forward pass's)
    const UnitStore s{rows, C, bits, stats, beta, windows, block_rows, stochastic != 0, (real_t*)x_copy,
                      (unsigned char*)codes};
    DISPATCH(bits, restore_rows, s, rows_per_chunk, a);
}

// dbeta_c += dy, dgamma_c += dy * xhat~ over one row, dy = da * mask (the mask as a factor, as the reference).
template <int BITS, int STEP>
__device__ __forceinline__ void backward_sums_row(int C, const real_t* __restrict__ da_row,
                                                  const real_t* __restrict__ x_row,
                                                  const unsigned char* __restrict__ row_codes,
                                                  const real_t* __restrict__ stats, const real_t* __restrict__ win,
                                                  const real_t* __restrict__ beta, bool stochastic,
                                                  real_t* __restrict__ dbeta, real_t* __restrict__ dgamma) {
    constexpr int PER = group_size<BITS>();
    if constexpr (BITS == 0)  // (the two loops spelled out: a shared helper taking a lambda stopped g++ vectorising)
        CHANNEL_LOOP(c, C) {
            real_t on;
            const real_t xhat = xhat_from_x(x_row[c], c, C, stats, beta, &on), dy = da_row[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
        }
    else
        for_codes<BITS, STEP>(C, row_codes, [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(q, c, C, stats, win, stochastic, &on), dy = da_row[c] * on;
            dbeta[c] += dy;
            dgamma[c] += dy * xhat;
        });
}

template <int BITS, int STEP>
__device__ void backward_sums_rows(const UnitStore& s, int rows_per_chunk, const real_t* da, real_t* partial) {
    constexpr int PER = group_size<BITS>();
    const int C = s.C;
    const long long chunks = (s.rows + rows_per_chunk - 1) / rows_per_chunk;
    if constexpr (STEP == 1) {
        long long first, end;
        lane_chunks(chunks, &first, &end);
        for (long long chunk = first; chunk < end; ++chunk)
            for (int c = 0; c < C; ++c) partial[chunk * C + c] = partial[(chunks + chunk) * C + c] = 0;
        for_wide_rows<BITS>(s, first * rows_per_chunk, min_ll(end * rows_per_chunk, s.rows), rows_per_chunk, nullptr,
                            [&](long long r, int c0, int n, int Cw, const WideTables& t) {
            // The wide row's terms, each added to a zero (which leaves it as it is but for the sign of a zero,
            // which a sum that starts at +0 never keeps), then to its chunk's sums a row at a time, in order.
            const long long e = r * C + c0, chunk = r / rows_per_chunk;
            real_t* dbeta = partial + chunk * C + c0;
            real_t* dgamma = partial + (chunks + chunk) * C + c0;
            const int piece = Cw / n;
            real_t dy[SCRATCH], dy_xhat[SCRATCH];
            for (int c = 0; c < Cw; ++c) dy[c] = dy_xhat[c] = 0;
            backward_sums_row<BITS, STEP>(Cw, da + e, s.x_at<BITS>(e), s.codes_at<BITS>(e), t.stats, t.win, t.beta,
                                          s.stochastic, dy, dy_xhat);
            for (int row = 0; row < n; ++row)
                for (int c = 0; c < piece; ++c) {
                    dbeta[c] += dy[row * piece + c];
                    dgamma[c] += dy_xhat[row * piece + c];
                }
        });
    } else {
        CHUNK_LOOP(chunk, chunks) {
            real_t* dbeta = partial + chunk * C;
            real_t* dgamma = partial + (chunks + chunk) * C;
            CHANNEL_LOOP(c, C) dbeta[c] = dgamma[c] = 0;  // this thread's channels, as below
            CHUNK_ROWS(r, chunk, s.rows, rows_per_chunk)
                backward_sums_row<BITS, STEP>(C, da + r * C, s.x_at<BITS>(r * C), s.codes_at<BITS>(r * C), s.stats,
                                              s.window<BITS>(r), s.beta, s.stochastic, dbeta, dgamma);
        }
    }
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
    const UnitStore s{rows, C, bits, stats, beta, windows, block_rows, stochastic != 0, (real_t*)x_copy,
                      (unsigned char*)codes};
    DISPATCH(bits, backward_sums_rows, s, rows_per_chunk, da, partial);
}

// dx = gamma_c / sigma_c * (dy - dbeta_c / M - xhat~ * dgamma_c / M) of one row [+ residual_grad].
template <int BITS, int STEP>
__device__ __forceinline__ void backward_dx_row(int C, const real_t* __restrict__ da_row,
                                                const real_t* __restrict__ x_row,
                                                const unsigned char* __restrict__ row_codes,
                                                const real_t* __restrict__ stats, const real_t* __restrict__ win,
                                                const real_t* __restrict__ beta, bool stochastic,
                                                const real_t* __restrict__ sums, real_t inv_count,
                                                const real_t* __restrict__ residual_row, real_t* __restrict__ dx_row) {
    constexpr int PER = group_size<BITS>();
    if constexpr (BITS == 0)
        CHANNEL_LOOP(c, C) {
            real_t on;
            const real_t xhat = xhat_from_x(x_row[c], c, C, stats, beta, &on), dy = da_row[c] * on;
            dx_row[c] = DX_SCALE(c) * (dy - sums[c] * inv_count - xhat * sums[C + c] * inv_count);
        }
    else
        for_codes<BITS, STEP>(C, row_codes, [&](float q, int c) {
            real_t on;
            const real_t xhat = xhat_from_code(q, c, C, stats, win, stochastic, &on), dy = da_row[c] * on;
            dx_row[c] = DX_SCALE(c) * (dy - sums[c] * inv_count - xhat * sums[C + c] * inv_count);
        });
    if (residual_row)  // in a loop of its own, which keeps the one above simple enough for g++ to vectorise
        CHANNEL_LOOP(c, C) dx_row[c] += residual_row[c];
}

template <int BITS, int STEP>
__device__ void backward_dx_rows(const UnitStore& s, int rows_per_chunk, const real_t* da, const real_t* sums,
                                 real_t inv_count, const real_t* residual_grad, real_t* dx) {
    for_rows<BITS, STEP>(s, rows_per_chunk, sums,
                         [&](long long, int, int, long long e, int Cw, const real_t* stats, const real_t* win,
                             const real_t* beta, const real_t* row_sums) {
        backward_dx_row<BITS, STEP>(Cw, da + e, s.x_at<BITS>(e), s.codes_at<BITS>(e), stats, win, beta, s.stochastic,
                                    row_sums, inv_count, residual_grad ? residual_grad + e : nullptr, dx + e);
    });
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
    const UnitStore s{rows, C, bits, stats, beta, windows, block_rows, stochastic != 0, (real_t*)x_copy,
                      (unsigned char*)codes};
    DISPATCH(bits, backward_dx_rows, s, rows_per_chunk, da, sums, inv_count, residual_grad, dx);
}
