// CPU shim: lets a CUDA kernel source (kernels/*.cu) compile with g++ unchanged.
//
// Every .cu file includes this header only when __CUDACC__ is undefined (NVRTC and nvcc
// define it). It supplies what CUDA C++ gives a kernel for free: the qualifiers, dim3,
// threadIdx/blockIdx/blockDim/gridDim, and a launcher that runs a grid: OpenMP threads share
// the blocks, and each block runs its threads one after another. That is correct for the
// kernels minibp writes (grid-stride loops, no shared memory, no __syncthreads, no atomics).
#pragma once
#include <math.h>  // the C++ <math.h> also declares the float overloads (floor(float), ...)
#include <omp.h>
#include <stdint.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

// One copy per OpenMP thread, as each CUDA thread sees its own.
static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace minibp_shim {

// Run kernel<<<grid, block>>>(args...) on the CPU. flatten inlines the kernel into the thread loop.
// Blocks are handed out dynamically, in about 16 chunks a thread: when another process shares the cores
// (an evaluation beside a training run), a thread the OS has parked holds up one chunk, not a static
// half of the grid that every other thread then waits for at the end. Blocks write disjoint outputs, so
// which thread runs which block changes no result.
template <auto kernel, class... Args>
__attribute__((flatten)) void launch(dim3 grid, dim3 block, Args... args) {
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    const long long chunk = blocks / (16 * omp_get_max_threads()) + 1;
#pragma omp parallel for schedule(dynamic, chunk) if (blocks > 1)
    for (long long b = 0; b < blocks; ++b) {
        gridDim = grid;
        blockDim = block;
        blockIdx = dim3((unsigned)(b % grid.x), (unsigned)((b / grid.x) % grid.y),
                        (unsigned)(b / ((long long)grid.x * grid.y)));
        for (unsigned tz = 0; tz < block.z; ++tz)
            for (unsigned ty = 0; ty < block.y; ++ty)
                for (unsigned tx = 0; tx < block.x; ++tx) {
                    threadIdx = dim3(tx, ty, tz);
                    kernel(args...);
                }
    }
}

}  // namespace minibp_shim
