// How bn.cu's kernels walk a unit's activation, (rows, C) channels last: the GPU's lanes and the CPU's wide
// rows. bn.cu states the method one row at a time; this header hands it the rows. The one contract: a walker
// calls body(const Row& w) for each row it deals this thread, w describing one row's channels and the tables
// laid out for them (LaneRow on the GPU, WideRow on the CPU, below), and a row function reads only w and the
// arrays at w.e, the row's first element (a reduction's row also carries the two sums its terms go to).
//
// Layout: blocks walk rows, the threads of a block walk a row's channels. Rows are dealt out in chunks of
// rows_per_chunk consecutive rows: a block has blockDim.y row lanes (threadIdx.y), the grid gridDim.x *
// blockDim.y, and lane l takes chunks l, l + lanes, ... The blockDim.x threads of a lane share each of its rows:
// thread t takes the row's groups t, t + blockDim.x, ..., a group being one channel in exact mode and one code
// byte (8/k channels) at k bits, so no two threads write one byte. On the GPU (layers/launch.py picks the shape
// by device) adjacent threads read adjacent addresses, and a thread decodes its code bytes in registers. On the
// CPU a block is one thread and takes one contiguous run of rows, which it walks as wide rows (for_wide_rows:
// several narrow rows, or a piece of a broad one, as one row of at most SCRATCH channels); its loops over a row
// are the plain loops over channels, and it decodes a row's codes into a local row of numbers first
// (for_codes), so that those loops vectorise. Reductions write one row of partial sums per chunk, summing the
// chunk's rows in order, and xp adds the chunks up: their results do not depend on the launch shape.
#pragma once
#include "common.cuh"
#include "quant.cuh"

// ----------------------------------------------------------------------------- what a pass reads and writes

// The rows of a unit's (4, C) statistics (bn.cu) and of a (3, C) window (quant.cuh).
enum StatsRow { MEAN = 0, SIGMA = 1, GAMMA = 2, B = 3 };
constexpr int STATS_ROWS = 4;  // a unit's stats (STATS_ROWS, C): these rows alone (layers/bn.py's STATS_ROWS)
enum WindowRow { SHIFT = 0, BELOW = 1, ABOVE = 2 };

// The unit as every pass reads it: its (4, C) statistics, beta, and the windows of its codes (blocks, 3, C), a
// window per channel for each block of block_rows rows (one block, block_rows >= rows, for the fixed and range
// windows). The kernels build it once from their arguments.
struct Unit {
    long long rows;
    int C;
    const real_t* stats;
    const real_t* beta;
    const real_t* windows;
    long long block_rows;

    // Row r's window (one block costs no division).
    __device__ __forceinline__ const real_t* window(long long r) const {
        return block_rows >= rows ? windows : windows + r / block_rows * 3 * C;
    }
};

// The store: x itself (bits = 0, exact mode) or the k-bit codes of v = xhat + b, rounded to the bins' midpoints
// or, stochastic, to their edges (quant.cuh). The forward pass writes it (StoreOut), the backward pass reads it
// (StoreIn).
template <class Real, class Byte>
struct StoreOf {
    int bits;
    bool stochastic;
    Real* x_copy;  // (rows, C), exact mode (the forward pass may have none: an evaluation)
    Byte* codes;   // (rows * C * bits / 8,), k bits
    // From element e = r*C + c on (c a whole code byte's first channel at k bits).
    __device__ __forceinline__ Real* x_at(long long e) const { return x_copy ? x_copy + e : nullptr; }
    __device__ __forceinline__ Byte* codes_at(long long e) const { return codes + e * bits / 8; }
};
using StoreIn = StoreOf<const real_t, const unsigned char>;
using StoreOut = StoreOf<real_t, unsigned char>;

// ----------------------------------------------------------------------------- a row

// Channels a group: a code byte's at k bits, one in exact mode (BITS = 0).
template <int BITS>
__device__ __forceinline__ constexpr int group_size() { return BITS ? 8 / BITS : 1; }

// Which of a row's channels are this thread's: all of them when a thread has a row to itself (the CPU, where
// the unit step is known at compile time and the loops vectorise), else its groups t, t + blockDim.x, ...
template <bool ONE_THREAD>
struct Lanes {
    static constexpr bool one_thread = ONE_THREAD;
    __device__ __forceinline__ static int first_group() { return ONE_THREAD ? 0 : threadIdx.x; }
    __device__ __forceinline__ static int group_step() { return ONE_THREAD ? 1 : blockDim.x; }
    template <int PER>
    __device__ __forceinline__ static int first_channel() { return first_group() * PER; }
    template <int PER>  // the channel after c: the next of its group, else the first of the thread's next group
    __device__ __forceinline__ static int next_channel(int c) {
        return ONE_THREAD || (c + 1) % PER ? c + 1 : c + 1 + (group_step() - 1) * PER;
    }
};

// for (each channel c of row w that is this thread's, PER channels a group)
#define FOR_CHANNELS(c, w, PER) \
    for (int c = (w).template first_channel<PER>(); c < (w).C; c = (w).template next_channel<PER>(c))
// for (each group j of row w that is this thread's, PER channels a group)
#define FOR_GROUPS(j, w, PER) for (int j = (w).first_group(); j < (w).C / (PER); j += (w).group_step())

// The GPU's row: one row of the unit, its channels shared by a lane's blockDim.x threads. What the CPU's tables
// hold per channel (WideRow) is computed per value, with the same float operations on the same operands.
struct LaneRow : Lanes<false> {
    long long e;           // the row's first element r*C
    int C;
    const real_t* stats;   // (4, C): StatsRow's
    const real_t* win;     // (3, C): the row's window
    const real_t* beta;    // (C,)
    const real_t* sums;    // (2, C): backward_dx's dbeta and dgamma, or null
    real_t* sum0;          // a reduction's two sums (for_sum_rows), laid out as the row; else null
    real_t* sum1;
    unsigned int row_hash; // stochastic rounding: the row's hash (quant_row_hash)
    __device__ __forceinline__ real_t stat(StatsRow i, int c) const { return stats[i * C + c]; }
    __device__ __forceinline__ real_t dx_scale(int c) const { return stat(GAMMA, c) / stat(SIGMA, c); }
    __device__ __forceinline__ float window(WindowRow i, int c) const { return (float)win[i * C + c]; }
    __device__ __forceinline__ float inv_below(int c) const { return 1.0f / window(BELOW, c); }
    __device__ __forceinline__ float inv_above(int c) const { return 1.0f / window(ABOVE, c); }
    __device__ __forceinline__ float draw(int c) const { return quant_uniform(row_hash, c); }
};

// The CPU's row: n consecutive rows of the unit, channels [c0, c0 + C/n) of each, as one row of C <= SCRATCH
// channels whose tables repeat n times (for_wide_rows).
constexpr int SCRATCH = 128;
struct WideTables {  // laid out for the wide row's C channels
    real_t stats[5 * SCRATCH];  // (5, C): the unit's stats, then gamma / sigma
    real_t beta[SCRATCH];       // (C,)
    real_t win[5 * SCRATCH];    // (5, C): shift, below, above, then 1/below and 1/above (as floats)
    real_t sums[2 * SCRATCH];   // (2, C): backward_dx's dbeta and dgamma
    float draws[SCRATCH];       // stochastic rounding: element c's draw (wide_row_draws)
};
struct WideRow : Lanes<true> {
    long long r, e;  // the first row, its first element r*C_unit + c0
    int C, c0, n;    // C channels in all: n rows of C/n channels from c0
    const real_t* stats;  // WideTables' rows, as LaneRow's
    const real_t* win;
    const real_t* beta;
    const real_t* sums;
    real_t* sum0;
    real_t* sum1;
    const float* draws;
    __device__ __forceinline__ real_t stat(StatsRow i, int c) const { return stats[i * C + c]; }
    __device__ __forceinline__ real_t dx_scale(int c) const { return stats[STATS_ROWS * C + c]; }
    __device__ __forceinline__ float window(WindowRow i, int c) const { return (float)win[i * C + c]; }
    __device__ __forceinline__ float inv_below(int c) const { return (float)win[3 * C + c]; }
    __device__ __forceinline__ float inv_above(int c) const { return (float)win[4 * C + c]; }
    __device__ __forceinline__ float draw(int c) const { return draws[c]; }
};

// The row a walker hands a thread: WideRow when a block is one thread (the CPU), else LaneRow.
template <bool ONE_THREAD> struct RowKind { using type = LaneRow; };
template <> struct RowKind<true> { using type = WideRow; };
template <bool ONE_THREAD> using RowOf = typename RowKind<ONE_THREAD>::type;

// body(q, c) for each of this thread's channels c of a row of codes, q the code as a number.
template <int BITS, class Row, class Body>
__device__ __forceinline__ void for_codes(const Row& w, const unsigned char* __restrict__ row_codes, Body body) {
    constexpr int PER = group_size<BITS>();
    if constexpr (Row::one_thread) {
        // A row of at most SCRATCH channels: its codes into a local row of numbers first, so that the loop over
        // them is a plain float loop, which g++ vectorises even for a short row.
        real_t q[SCRATCH];
        quant_unpack_row<BITS>(row_codes, q, w.C);
        for (int c = 0; c < w.C; ++c) body((float)q[c], c);
    } else {  // threads sharing a row: each decodes its own bytes, in registers
        FOR_GROUPS(j, w, PER) {
            const int byte = row_codes[j];
            for (int t = 0; t < PER; ++t) body((float)quant_slot<BITS>(byte, t), j * PER + t);
        }
    }
}

// ----------------------------------------------------------------------------- the CPU's wide rows

// On the CPU a block is one thread, and a row of few channels (16 in ResNet-164's first stage) leaves each of
// its vector loops a vector or two long, so that setting a loop up costs more than its work (a 4-bit unit of 16
// channels took 2.5x its exact time). So the CPU walks a run of rows that share a window as wide rows: n
// consecutive rows are one row of n*C channels whose per-channel tables repeat n times in a local copy (a row of
// more than SCRATCH channels goes in pieces of SCRATCH channels). The tables also hold per channel what a GPU
// thread divides out per value (LaneRow's dx_scale, inv_below, inv_above: the same float operations on the same
// operands, so the same bits). Every element sees the same arithmetic, so the bytes are the same; the
// reductions still add their rows in order (for_sum_rows).

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

// The draws of a wide row: element (r + t, c0 + c)'s at draws[t * piece + c], as a GPU thread takes it
// (quant_uniform), each row hashed once.
__device__ __forceinline__ void wide_row_draws(long long rounding_key, long long r, int c0, int piece, int C,
                                               float* __restrict__ draws) {
    for (int t = 0; t * piece < C; ++t) {
        const unsigned int row_hash = quant_row_hash(rounding_key, r + t);
        for (int c = 0; c < piece; ++c) draws[t * piece + c] = quant_uniform(row_hash, c0 + c);
    }
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

// What a walk reads besides the unit: the windows (k bits), backward_dx's (2, C) sums, the forward pass's draws.
struct WalkNeeds {
    bool windows;
    const real_t* sums;        // or null
    bool draws;
    long long rounding_key;
};

// body(w) for the wide rows of rows [first, end) of one thread; a wide row never crosses a multiple of split
// rows (a reduction's chunk) or of the window's block.
template <class Body>
__device__ void for_wide_rows(const Unit& u, long long first, long long end, long long split, const WalkNeeds& needs,
                              Body body) {
    const int C = u.C, most = wide_rows(C), P = C < SCRATCH ? C : SCRATCH;
    WideTables t;
    int tables_n = 0, tables_c0 = -1;       // what the tables are laid out for: n rows of channels from c0 ...
    const real_t* tables_window = nullptr;  // ... and which window they hold
    for (long long run = first; run < end;) {  // a run of rows in one window's block
        const real_t* window = needs.windows ? u.window(run) : nullptr;
        const long long block_end = needs.windows ? (run / u.block_rows + 1) * u.block_rows : end,
                        run_end = min_ll(min_ll(block_end, (run / split + 1) * split), end);
        for (int c0 = 0; c0 < C; c0 += P) {
            const int piece = C - c0 < P ? C - c0 : P;
            for (long long r = run; r < run_end;) {
                const int n = run_end - r < most ? (int)(run_end - r) : most, Cw = n * piece;
                if (n != tables_n || c0 != tables_c0) {
                    repeat_rows(u.stats, STATS_ROWS, C, c0, piece, n, t.stats);
                    for (int c = 0; c < Cw; ++c) t.stats[STATS_ROWS * Cw + c] = t.stats[GAMMA * Cw + c] / t.stats[SIGMA * Cw + c];
                    repeat_rows(u.beta, 1, C, c0, piece, n, t.beta);
                    if (needs.sums) repeat_rows(needs.sums, 2, C, c0, piece, n, t.sums);
                    tables_window = nullptr;
                }
                if (window && (window != tables_window || n != tables_n || c0 != tables_c0)) {
                    repeat_rows(window, 3, C, c0, piece, n, t.win);
                    for (int c = 0; c < 2 * Cw; ++c) t.win[3 * Cw + c] = (real_t)(1.0f / (float)t.win[Cw + c]);
                    tables_window = window;
                }
                tables_n = n, tables_c0 = c0;
                if (needs.draws) wide_row_draws(needs.rounding_key, r, c0, piece, Cw, t.draws);
                WideRow w;
                w.r = r, w.e = r * C + c0, w.C = Cw, w.c0 = c0, w.n = n;
                w.stats = t.stats, w.win = t.win, w.beta = t.beta, w.sums = t.sums, w.draws = t.draws;
                w.sum0 = w.sum1 = nullptr;
                body(w);
                r += n;
            }
        }
        run = run_end;
    }
}

// ----------------------------------------------------------------------------- the walkers bn.cu calls

// body(w) for each row of this thread: the GPU's rows (LaneRow), the CPU's wide rows (WideRow). ONE_THREAD: a
// block is one thread (the CPU's launch).
template <bool ONE_THREAD, class Body>
__device__ __forceinline__ void for_rows(const Unit& u, int rows_per_chunk, const WalkNeeds& needs, Body body) {
    if constexpr (ONE_THREAD) {
        long long first, end;
        lane_chunks((u.rows + rows_per_chunk - 1) / rows_per_chunk, &first, &end);
        for_wide_rows(u, first * rows_per_chunk, min_ll(end * rows_per_chunk, u.rows), u.rows, needs, body);
    } else {
        ROW_LOOP(r, u.rows, rows_per_chunk) {
            LaneRow w;
            w.e = r * u.C, w.C = u.C;
            w.stats = u.stats, w.win = needs.windows ? u.window(r) : nullptr, w.beta = u.beta, w.sums = needs.sums;
            w.sum0 = w.sum1 = nullptr;
            w.row_hash = needs.draws ? quant_row_hash(needs.rounding_key, r) : 0u;
            body(w);
        }
    }
}

// A reduction over rows: partial is (2, chunks, C), one row of each of two sums per chunk of rows_per_chunk
// rows. body(w) adds row w's terms into w.sum0[c], w.sum1[c] for this thread's channels c of the row, the sums
// laid out as the row. On the GPU those are the chunk's sums themselves; on the CPU a wide row's terms
// go to zeros first (which leaves each as it is but for the sign of a zero, which a sum that starts at +0 never
// keeps), then to its chunk's sums a row at a time, in order: the same sums in the same order either way.
template <int BITS, bool ONE_THREAD, class Body>
__device__ void for_sum_rows(const Unit& u, int rows_per_chunk, bool windows, real_t* partial, Body body) {
    const int C = u.C;
    const long long chunks = (u.rows + rows_per_chunk - 1) / rows_per_chunk;
    const WalkNeeds needs{windows, nullptr, false, 0};
    if constexpr (ONE_THREAD) {
        long long first, end;
        lane_chunks(chunks, &first, &end);
        for (long long chunk = first; chunk < end; ++chunk)
            for (int c = 0; c < C; ++c) partial[chunk * C + c] = partial[(chunks + chunk) * C + c] = 0;
        for_wide_rows(u, first * rows_per_chunk, min_ll(end * rows_per_chunk, u.rows), rows_per_chunk, needs,
                      [&](const WideRow& w) {
            const long long chunk = w.r / rows_per_chunk;
            real_t* sum0 = partial + chunk * C + w.c0;
            real_t* sum1 = partial + (chunks + chunk) * C + w.c0;
            const int piece = w.C / w.n;
            real_t terms0[SCRATCH], terms1[SCRATCH];
            for (int c = 0; c < w.C; ++c) terms0[c] = terms1[c] = 0;
            WideRow summed = w;
            summed.sum0 = terms0, summed.sum1 = terms1;
            body(summed);
            for (int row = 0; row < w.n; ++row)
                for (int c = 0; c < piece; ++c) {
                    sum0[c] += terms0[row * piece + c];
                    sum1[c] += terms1[row * piece + c];
                }
        });
    } else {
        CHUNK_LOOP(chunk, chunks) {
            real_t* sum0 = partial + chunk * C;
            real_t* sum1 = partial + (chunks + chunk) * C;
            LaneRow w;
            w.C = C, w.stats = u.stats, w.beta = u.beta, w.sums = nullptr, w.row_hash = 0u;
            w.sum0 = sum0, w.sum1 = sum1;
            FOR_CHANNELS(c, w, group_size<BITS>()) sum0[c] = sum1[c] = 0;  // this thread's channels, as below
            CHUNK_ROWS(r, chunk, u.rows, rows_per_chunk) {
                w.e = r * C, w.win = windows ? u.window(r) : nullptr;
                body(w);
            }
        }
    }
}

// f<BITS, ONE_THREAD>(...) for the runtime bits and block shape: straight-line loops in every case.
#define DISPATCH_BITS(bits, f, ONE_THREAD, ...)         \
    do {                                                \
        if ((bits) == 0) f<0, ONE_THREAD>(__VA_ARGS__); \
        if ((bits) == 2) f<2, ONE_THREAD>(__VA_ARGS__); \
        if ((bits) == 4) f<4, ONE_THREAD>(__VA_ARGS__); \
        if ((bits) == 8) f<8, ONE_THREAD>(__VA_ARGS__); \
    } while (0)
#define DISPATCH(bits, f, ...)                                          \
    do {                                                                \
        if (blockDim.x == 1) DISPATCH_BITS(bits, f, true, __VA_ARGS__); \
        else DISPATCH_BITS(bits, f, false, __VA_ARGS__);                \
    } while (0)
