// Included first by every kernel file: the CPU shim when not compiling for CUDA, and the loops the
// kernels walk their work with (any grid covers any n, which the tests check).
#pragma once
#ifndef __CUDACC__
#include "cpu_shim.h"
#endif

__device__ __forceinline__ int min_int(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ long long min_ll(long long a, long long b) { return a < b ? a : b; }

// for (i = this thread's first index; i < n; i += all threads in the grid)
#define GRID_STRIDE_LOOP(i, n)                                                     \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)

// Blocks walk rows (a pixel's channels, contiguous) in chunks: blockDim.y row lanes a block, chunks
// handed out grid-stride over the lanes; a block's x threads then share each row (bn.cu, pool.cu).
// for (each chunk of this thread's row lane)
#define CHUNK_LOOP(chunk, chunks)                                                                     \
    for (long long chunk = (long long)blockIdx.x * blockDim.y + threadIdx.y; chunk < (chunks); \
         chunk += (long long)gridDim.x * blockDim.y)

// for (each row r of chunk)
#define CHUNK_ROWS(r, chunk, rows, rows_per_chunk)                                                        \
    for (long long r = (chunk) * (rows_per_chunk),                                                        \
                   r##_end = r + (rows_per_chunk) < (rows) ? r + (rows_per_chunk) : (rows); r < r##_end; ++r)

// for (each row r of this thread's row lane)
#define ROW_LOOP(r, rows, rows_per_chunk)                                        \
    CHUNK_LOOP(r##_chunk, ((rows) + (rows_per_chunk) - 1) / (rows_per_chunk)) \
    CHUNK_ROWS(r, r##_chunk, rows, rows_per_chunk)

// A piece of one channel, 1 at compile time (a GPU thread's share of a channel walk).
struct OneChannel { __device__ constexpr operator int() const { return 1; } };

// The finishing kernels' walk, which add each channel's partial sums over every chunk in order: body(c0, P) for
// the pieces [c0, c0 + P) of this thread's channels, FINISH_PIECE of them (constants.py) on the CPU, whose blocks
// are one thread and share the pieces (a thread a channel there would read each cache line of partial sums once a
// channel, on one core: 0.18 s of a ResNet-164 step), else one channel a thread, adjacent threads on adjacent
// channels. Either way a channel's sum runs over the chunks in the same order.
template <class Body>
__device__ __forceinline__ void for_finish_channels(int C, Body body) {
    if (blockDim.x == 1)
        for (int c0 = blockIdx.x * FINISH_PIECE; c0 < C; c0 += gridDim.x * FINISH_PIECE)
            body(c0, min_int(FINISH_PIECE, C - c0));
    else
        GRID_STRIDE_LOOP(c, C) body((int)c, OneChannel());
}
