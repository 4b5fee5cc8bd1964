// Included first by every kernel file: the CPU shim when not compiling for CUDA, and the
// grid-stride loop every kernel uses (any grid covers any n, which the tests check).
#pragma once
#ifndef __CUDACC__
#include "cpu_shim.h"
#endif

// for (i = this thread's first index; i < n; i += all threads in the grid)
#define GRID_STRIDE_LOOP(i, n)                                                     \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (long long)blockDim.x * gridDim.x)
