// How bn.cu's kernels walk a unit's activation, (rows, C) channels last: the GPU's lanes and the CPU's wide
// rows. bn.cu states the method one row at a time; this header hands it the rows. The one contract: a walker
// calls body(row) for each row it deals this thread, `row` describing one row's channels and the tables laid
// out for them (LaneRow on the GPU, WideRow on the CPU, below), and a row function reads only `row` and the
// arrays at row.e, the row's first element (a reduction's row also carries the two sums its terms go to). The walker
// alone chooses the row (a block of one thread: the CPU's launch) and makes the store's bits its Row::bits.
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

// What every pass reads of its unit, built once by a kernel from its arguments: the (4, C) statistics, beta,
// and at k bits the windows of the codes (windows, 3, C), a window per channel for each window_rows rows (one
// window, window_rows >= rows, for the fixed and range windows); backward_dx's (2, C) sums; the forward's draws.
struct UnitTables {
    long long rows;
    int C;
    const real_t *stats, *beta, *windows;
    long long window_rows;
    const real_t* sums = nullptr;  // backward_dx's dbeta and dgamma
    bool draws = false;            // stochastic rounding: element (r, c)'s draw from rounding_key (forward)
    long long rounding_key = 0;

    // Row r's window (one window costs no division).
    __device__ __forceinline__ const real_t* window(long long r) const {
        return window_rows >= rows ? windows : windows + r / window_rows * 3 * C;
    }
};

// The store: x itself (bits = 0, exact mode) or the k-bit codes of v = xhat + b, rounded to the bins' midpoints or,
// stochastic, to their edges (quant.cuh): the forward pass writes it (StoreOut), the backward pass reads it (StoreIn).
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

// A row as a row function reads it, with the tables laid out for its C channels: the GPU's one row of the unit,
// shared by a lane's blockDim.x threads (LaneRow), or the CPU's n consecutive rows of C/n channels from c0 as one
// row of C <= SCRATCH channels (WideRow, for_wide_rows). A thread's channels: the whole row on the CPU (its loops
// vectorise), else its groups t, t + blockDim.x, ..., a code byte's channels at k bits, one in exact mode.
template <bool ONE_THREAD, int BITS>
struct UnitRow {
    static constexpr bool one_thread = ONE_THREAD;
    static constexpr int bits = BITS, per = BITS ? 8 / BITS : 1;  // per: channels a group
    long long e;            // the row's first element (the wide row's: r*C_unit + c0)
    int C;
    const real_t* stats;    // (4, C): StatsRow's; the wide row's then gamma / sigma
    const real_t* win;      // (3, C): the row's window; the wide row's then 1/below and 1/above
    const real_t* beta;     // (C,)
    const real_t* sums;     // (2, C): backward_dx's dbeta and dgamma, or null
    real_t *sum0, *sum1;    // a reduction's two sums (for_sum_rows), laid out as the row; else null
    unsigned int row_hash;  // a LaneRow's, stochastic rounding: the row's hash (quant_row_hash)
    long long r;            // a WideRow's: its first row, and n rows of C/n channels from c0
    int c0, n;
    const float* draws;     // a WideRow's, stochastic rounding: element c's draw (wide_row_draws)

    __device__ __forceinline__ real_t stat(StatsRow i, int c) const { return stats[i * C + c]; }
    __device__ __forceinline__ float window(WindowRow i, int c) const { return (float)win[i * C + c]; }
    __device__ __forceinline__ real_t dx_scale(int c) const {
        return ONE_THREAD ? stats[STATS_ROWS * C + c] : stat(GAMMA, c) / stat(SIGMA, c);
    }
    __device__ __forceinline__ float inv_below(int c) const {
        return ONE_THREAD ? (float)win[3 * C + c] : 1.0f / window(BELOW, c);
    }
    __device__ __forceinline__ float inv_above(int c) const {
        return ONE_THREAD ? (float)win[4 * C + c] : 1.0f / window(ABOVE, c);
    }
    __device__ __forceinline__ float draw(int c) const { return ONE_THREAD ? draws[c] : quant_uniform(row_hash, c); }

    __device__ __forceinline__ static int first_group() { return ONE_THREAD ? 0 : threadIdx.x; }
    __device__ __forceinline__ static int group_step() { return ONE_THREAD ? 1 : blockDim.x; }
    __device__ __forceinline__ static int first_channel() { return first_group() * per; }
    // the channel after c: the next of its group, else the first of the thread's next group
    __device__ __forceinline__ static int next_channel(int c) {
        return ONE_THREAD || (c + 1) % per ? c + 1 : c + 1 + (group_step() - 1) * per;
    }
};
template <int BITS> using LaneRow = UnitRow<false, BITS>;
template <int BITS> using WideRow = UnitRow<true, BITS>;
constexpr int SCRATCH = 128;
struct WideTables {  // a WideRow's, laid out for its C channels
    real_t stats[5 * SCRATCH];  // (5, C): the unit's stats, then gamma / sigma
    real_t beta[SCRATCH];       // (C,)
    real_t win[5 * SCRATCH];    // (5, C): shift, below, above, then 1/below and 1/above (as floats)
    real_t sums[2 * SCRATCH];   // (2, C): backward_dx's dbeta and dgamma
    float draws[SCRATCH];       // stochastic rounding: element c's draw (wide_row_draws)
};

// for (each channel c of `row` that is this thread's)
#define FOR_CHANNELS(c, row) for (int c = (row).first_channel(); c < (row).C; c = (row).next_channel(c))
// for (each group j of `row` that is this thread's)
#define FOR_GROUPS(j, row) for (int j = (row).first_group(); j < (row).C / (row).per; j += (row).group_step())

// body(q, c) for each of this thread's channels c of a row of codes, q the code as a number.
template <class Row, class Body>
__device__ __forceinline__ void for_codes(const Row& row, const unsigned char* __restrict__ row_codes, Body body) {
    constexpr int BITS = Row::bits, PER = Row::per;
    if constexpr (Row::one_thread) {
        // its codes into a local row of numbers first: the loop over them is a float loop, which g++ vectorises
        real_t q[SCRATCH];
        quant_unpack_row<BITS>(row_codes, q, row.C);
        for (int c = 0; c < row.C; ++c) body((float)q[c], c);
    } else {  // threads sharing a row: each decodes its own bytes, in registers
        FOR_GROUPS(j, row) {
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

// Rows a wide row: the most, a power of two (so that it divides a window's rows), with n*C <= SCRATCH.
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

// The tables of a wide row of n rows of channels [c0, c0 + piece) into t: the stats (and gamma / sigma), beta,
// backward_dx's sums; the window's (and 1/below, 1/above) with window (k bits).
__device__ __forceinline__ void wide_tables(const UnitTables& u, int c0, int piece, int n, WideTables& t) {
    const int Cw = n * piece;
    repeat_rows(u.stats, STATS_ROWS, u.C, c0, piece, n, t.stats);
    for (int c = 0; c < Cw; ++c) t.stats[STATS_ROWS * Cw + c] = t.stats[GAMMA * Cw + c] / t.stats[SIGMA * Cw + c];
    repeat_rows(u.beta, 1, u.C, c0, piece, n, t.beta);
    if (u.sums) repeat_rows(u.sums, 2, u.C, c0, piece, n, t.sums);
}
__device__ __forceinline__ void wide_window(const real_t* window, int C, int c0, int piece, int n, WideTables& t) {
    const int Cw = n * piece;
    repeat_rows(window, 3, C, c0, piece, n, t.win);
    for (int c = 0; c < 2 * Cw; ++c) t.win[3 * Cw + c] = (real_t)(1.0f / (float)t.win[Cw + c]);
}

// body(row) for the wide rows of rows [first, end) of one thread; a wide row never crosses a multiple of split
// rows (a reduction's chunk) or of window_rows.
template <int BITS, class Body>
__device__ void for_wide_rows(const UnitTables& u, long long first, long long end, long long split, Body body) {
    const int C = u.C, most = wide_rows(C), P = C < SCRATCH ? C : SCRATCH;
    WideTables t;
    int tables_n = 0, tables_c0 = -1;       // what the tables are laid out for: n rows of channels from c0 ...
    const real_t* tables_window = nullptr;  // ... and which window they hold
    for (long long run = first; run < end;) {  // a run of rows in one window
        const real_t* window = BITS ? u.window(run) : nullptr;
        const long long window_end = BITS ? (run / u.window_rows + 1) * u.window_rows : end,
                        run_end = min_ll(min_ll(window_end, (run / split + 1) * split), end);
        for (int c0 = 0; c0 < C; c0 += P) {
            const int piece = C - c0 < P ? C - c0 : P;
            for (long long r = run; r < run_end; r += most) {  // n rows a wide row: most, but for the last
                const int n = run_end - r < most ? (int)(run_end - r) : most;
                if (n != tables_n || c0 != tables_c0) wide_tables(u, c0, piece, n, t), tables_window = nullptr;
                if (window && window != tables_window) wide_window(window, C, c0, piece, n, t), tables_window = window;
                tables_n = n, tables_c0 = c0;
                if (BITS && u.draws) wide_row_draws(u.rounding_key, r, c0, piece, n * piece, t.draws);
                WideRow<BITS> row{};
                row.r = r, row.e = r * C + c0, row.C = n * piece, row.c0 = c0, row.n = n;
                row.stats = t.stats, row.win = t.win, row.beta = t.beta, row.sums = t.sums, row.draws = t.draws;
                body(row);
            }
        }
        run = run_end;
    }
}

// ----------------------------------------------------------------------------- the walkers bn.cu calls

// The GPU's row r of the unit (its window at k bits, its draws' hash when the pass draws).
template <int BITS>
__device__ __forceinline__ LaneRow<BITS> lane_row(const UnitTables& u, long long r) {
    LaneRow<BITS> row{};
    row.e = r * u.C, row.C = u.C, row.stats = u.stats, row.beta = u.beta, row.sums = u.sums;
    row.win = BITS ? u.window(r) : nullptr;
    row.row_hash = BITS && u.draws ? quant_row_hash(u.rounding_key, r) : 0u;
    return row;
}

// f<BITS>(...) for the runtime bits: straight-line loops in every case.
#define DISPATCH_BITS(bits, f, ...)                                                                                \
    do { if ((bits) == 0) f<0>(__VA_ARGS__); else if ((bits) == 2) f<2>(__VA_ARGS__);                            \
         else if ((bits) == 4) f<4>(__VA_ARGS__); else if ((bits) == 8) f<8>(__VA_ARGS__); } while (0)

// for_rows at BITS: the CPU's wide rows (a block of one thread), else the GPU's rows.
template <int BITS, class Body>
__device__ __forceinline__ void rows_at(const UnitTables& u, int rows_per_chunk, Body body) {
    if (blockDim.x == 1) {  // a contiguous run of chunks
        long long first, end;
        lane_chunks((u.rows + rows_per_chunk - 1) / rows_per_chunk, &first, &end);
        for_wide_rows<BITS>(u, first * rows_per_chunk, min_ll(end * rows_per_chunk, u.rows), u.rows, body);
    } else {
        ROW_LOOP(r, u.rows, rows_per_chunk) body(lane_row<BITS>(u, r));
    }
}

// body(row) for each row of this thread, row a WideRow<bits> on the CPU (a block of one thread), else a
// LaneRow<bits>.
template <class Body>
__device__ __forceinline__ void for_rows(const UnitTables& u, int bits, int rows_per_chunk, Body body) {
    DISPATCH_BITS(bits, rows_at, u, rows_per_chunk, body);
}

// The CPU's reduction: a wide row's terms go to zeros first (which leaves each as it is but for the sign of a
// zero, which a sum that starts at +0 never keeps), then to its chunk's sums a row at a time, in order.
template <int BITS, class Body>
__device__ void wide_sum_rows(const UnitTables& u, int rows_per_chunk, long long chunks, real_t* partial, Body body) {
    const int C = u.C;
    long long first, end;
    lane_chunks(chunks, &first, &end);
    for (long long chunk = first; chunk < end; ++chunk)
        for (int c = 0; c < C; ++c) partial[chunk * C + c] = partial[(chunks + chunk) * C + c] = 0;
    for_wide_rows<BITS>(u, first * rows_per_chunk, min_ll(end * rows_per_chunk, u.rows), rows_per_chunk,
                        [&](const WideRow<BITS>& row) {
        const long long chunk = row.r / rows_per_chunk;
        real_t* sum0 = partial + chunk * C + row.c0;
        real_t* sum1 = partial + (chunks + chunk) * C + row.c0;
        const int piece = row.C / row.n;
        real_t terms0[SCRATCH], terms1[SCRATCH];
        for (int c = 0; c < row.C; ++c) terms0[c] = terms1[c] = 0;
        WideRow<BITS> summed = row;
        summed.sum0 = terms0, summed.sum1 = terms1;
        body(summed);
        for (int i = 0; i < row.n; ++i)
            for (int c = 0; c < piece; ++c) {
                sum0[c] += terms0[i * piece + c];
                sum1[c] += terms1[i * piece + c];
            }
    });
}

// for_sum_rows at BITS: the CPU's (wide_sum_rows), or the GPU's, whose row's terms go to its chunk's sums themselves.
template <int BITS, class Body>
__device__ void sum_rows_at(const UnitTables& u, int rows_per_chunk, real_t* partial, Body body) {
    const long long chunks = (u.rows + rows_per_chunk - 1) / rows_per_chunk;
    if (blockDim.x == 1) return wide_sum_rows<BITS>(u, rows_per_chunk, chunks, partial, body);
    CHUNK_LOOP(chunk, chunks) {
        LaneRow<BITS> row = lane_row<BITS>(u, chunk * rows_per_chunk);
        row.sum0 = partial + chunk * u.C, row.sum1 = partial + (chunks + chunk) * u.C;
        FOR_CHANNELS(c, row) row.sum0[c] = row.sum1[c] = 0;  // this thread's channels, as below
        CHUNK_ROWS(r, chunk, u.rows, rows_per_chunk) {
            row.e = r * u.C, row.win = BITS ? u.window(r) : nullptr;
            body(row);
        }
    }
}

// A reduction over rows: partial is (2, chunks, C), one row of each of two sums per chunk of rows_per_chunk
// rows. body(row) adds the row's terms into row.sum0[c], row.sum1[c] for this thread's channels c of the row,
// the sums laid out as the row: the same sums in the same order on either device.
template <class Body>
__device__ __forceinline__ void for_sum_rows(const UnitTables& u, int bits, int rows_per_chunk, real_t* partial,
                                             Body body) {
    DISPATCH_BITS(bits, sum_rows_at, u, rows_per_chunk, partial, body);
}

// The statistics' walk, which sums each chunk's rows about their own shift and so takes a piece of channels
// through its chunks: body(c0, P) for each piece [c0, c0 + P) of this thread's channels, SCRATCH consecutive
// channels on the CPU's one thread (its loops over a piece vectorise), else one (common.cuh's OneChannel).
template <class Body>
__device__ __forceinline__ void for_channel_pieces(int C, Body body) {
    if (blockDim.x == 1)
        for (int c0 = 0; c0 < C; c0 += SCRATCH) body(c0, min_int(SCRATCH, C - c0));
    else
        for (int c = threadIdx.x; c < C; c += blockDim.x) body(c, OneChannel());
}
