// Max and average pooling over NHWC activations, and the reference's parameter-free shortcut
// (average-pool by the stride, zero-pad the channels). NumPy references: minibp/layers/pool.py.
//
// x is (N, H, W, C), y is (N, Ho, Wo, Cy). A size x size region at stride s starts at
// (oh * s - pad_top, ow * s - pad_left); taps outside x are skipped (max) or count as 0 (average,
// which always divides by size*size).
//
// Layout as bn.cu's (common.cuh's ROW_LOOP; layers/launch.py picks the shape by device): a row per pixel a
// kernel writes. A thread takes its channels a tile at a time: one channel, t, t + blockDim.x, ..., where
// threads share a row (the GPU: adjacent threads read adjacent addresses); a run of up to TILE_MAX channels in
// a one-thread block (the CPU's launch), so that the loops over a tile are plain loops over consecutive
// channels, which g++ vectorises. Each value is computed by the same arithmetic in the same order whichever
// thread computes it, so the results do not depend on the launch shape.
#include "common.cuh"

// The longest tile: 128 channels on the CPU; 1 on the GPU, which launches one-thread blocks only for C = 1
// (and NVRTC compiles 10x slower over local arrays).
#ifdef __CUDACC__
#define TILE_MAX 1
#else
#define TILE_MAX 128
#endif
// for (each tile [c0, c0 + m) of this thread's channels below C)
#define TILE_LOOP(c0, m, C)                                                 \
    for (int tile = blockDim.x == 1 ? TILE_MAX : 1, c0 = threadIdx.x * tile, m; \
         c0 < (C) && (m = min_int(tile, (C) - c0)) > 0; c0 += blockDim.x * tile)

// The loops below read the kernels' parameters size, stride, H, W, Ho, Wo, pad_top and pad_left.
// for (each tap (h, w) of the region at (h0, w0) that lies inside the H x W image), in scan order
#define WINDOW_TAPS(h, w, h0, w0)                                 \
    for (int h = (h0) > 0 ? (h0) : 0; h < (h0) + size && h < H; ++h) \
        for (int w = (w0) > 0 ? (w0) : 0; w < (w0) + size && w < W; ++w)

// The first region (index along one axis) that covers padded position p: ceil((p - size + 1) / stride), >= 0.
__device__ __forceinline__ int first_region(int p, int size, int stride) {
    const int a = p - size + 1;
    return a > 0 ? (a + stride - 1) / stride : 0;
}

// for (each output region (oh, ow) that covers input pixel (h, w)), in scan order
#define COVERING_WINDOWS(oh, ow, h, w)                                                                   \
    for (int oh = first_region((h) + pad_top, size, stride), oh##_end = min_int(((h) + pad_top) / stride, Ho - 1); \
         oh <= oh##_end; ++oh)                                                                                  \
        for (int ow = first_region((w) + pad_left, size, stride),                                                  \
                 ow##_end = min_int(((w) + pad_left) / stride, Wo - 1);                                         \
             ow <= ow##_end; ++ow)

// (n, i, j) of row r of an (N, rows, cols) grid of pixels; the offset of pixel (n, i, j) in such a grid.
#define PIXEL(r, rows, cols)                                                 \
    const int j = (int)((r) % (cols)), i = (int)(((r) / (cols)) % (rows)), \
              n = (int)((r) / ((long long)(cols) * (rows)))
#define AT(n, i, j, rows, cols, channels) ((((long long)(n) * (rows) + (i)) * (cols) + (j)) * (channels))

// The max over the region's valid taps, per channel; y is (N, Ho, Wo, C).
extern "C" __global__ void maxpool_forward(int N, int H, int W, int C, int size, int stride, int pad_top, int pad_left,
                                           int Ho, int Wo, int rows_per_chunk, const real_t* __restrict__ x,
                                           real_t* __restrict__ y) {
    ROW_LOOP(r, (long long)N * Ho * Wo, rows_per_chunk) {
        PIXEL(r, Ho, Wo);
        TILE_LOOP(c0, m, C) {
            real_t* dst = y + r * C + c0;
            bool first = true;
            WINDOW_TAPS(h, w, i * stride - pad_top, j * stride - pad_left) {
                const real_t* src = x + AT(n, h, w, H, W, C) + c0;
                for (int t = 0; t < m; ++t) dst[t] = first || src[t] > dst[t] ? src[t] : dst[t];
                first = false;
            }
        }
    }
}

// dx[n, h, w, c] = sum of dy over the regions whose maximum (first in scan order) is at (h, w).
// A gather, a row per input pixel: it re-finds the argmax of every region that covers it.
extern "C" __global__ void maxpool_backward(int N, int H, int W, int C, int size, int stride, int pad_top, int pad_left,
                                            int Ho, int Wo, int rows_per_chunk, const real_t* __restrict__ x,
                                            const real_t* __restrict__ dy, real_t* __restrict__ dx) {
    ROW_LOOP(r, (long long)N * H * W, rows_per_chunk) {
        PIXEL(r, H, W);
        TILE_LOOP(c0, m, C) {
            real_t grad[TILE_MAX], best[TILE_MAX], mine[TILE_MAX];  // mine: 1 where (i, j) holds the max so far
            for (int t = 0; t < m; ++t) grad[t] = 0;
            COVERING_WINDOWS(oh, ow, i, j) {
                bool first = true;
                WINDOW_TAPS(h, w, oh * stride - pad_top, ow * stride - pad_left) {
                    const real_t* src = x + AT(n, h, w, H, W, C) + c0;
                    const real_t here = h == i && w == j ? 1 : 0;
                    for (int t = 0; t < m; ++t) {
                        const bool take = first || src[t] > best[t];
                        best[t] = take ? src[t] : best[t];
                        mine[t] = take ? here : mine[t];
                    }
                    first = false;
                }
                // grad starts at +0, so it is never -0 and adding 0 leaves it as it is
                const real_t* d = dy + AT(n, oh, ow, Ho, Wo, C) + c0;
                for (int t = 0; t < m; ++t) grad[t] += mine[t] != 0 ? d[t] : 0;
            }
            for (int t = 0; t < m; ++t) dx[r * C + c0 + t] = grad[t];
        }
    }
}

// dst[t] = (or +=, by accumulate) sum[t] / size^2 for t < m.
__device__ __forceinline__ void store_mean(real_t* __restrict__ dst, const real_t* __restrict__ sum, int m, int size,
                                           int accumulate) {
    const real_t inv_area = (real_t)1 / (real_t)(size * size);
    for (int t = 0; t < m; ++t) dst[t] = accumulate ? dst[t] + sum[t] * inv_area : sum[t] * inv_area;
}

// y[..., c] (= or +=, by accumulate) the size x size average of x for c < C; y[..., c >= C] = 0 (or unchanged
// when accumulating). Cy >= C. With size = stride and accumulate = 1 this is the parameter-free shortcut.
extern "C" __global__ void avgpool_forward(int N, int H, int W, int C, int size, int stride, int pad_top, int pad_left,
                                           int Ho, int Wo, int rows_per_chunk, int Cy, int accumulate,
                                           const real_t* __restrict__ x, real_t* __restrict__ y) {
    ROW_LOOP(r, (long long)N * Ho * Wo, rows_per_chunk) {
        PIXEL(r, Ho, Wo);
        TILE_LOOP(c0, m, C) {
            real_t sum[TILE_MAX];
            for (int t = 0; t < m; ++t) sum[t] = 0;
            WINDOW_TAPS(h, w, i * stride - pad_top, j * stride - pad_left) {
                const real_t* src = x + AT(n, h, w, H, W, C) + c0;
                for (int t = 0; t < m; ++t) sum[t] += src[t];
            }
            store_mean(y + r * Cy + c0, sum, m, size, accumulate);
        }
        if (!accumulate)
            TILE_LOOP(c0, m, Cy - C) for (int t = 0; t < m; ++t) y[r * Cy + C + c0 + t] = 0;
    }
}

// The adjoint: dx[n, h, w, c] (= or +=) sum over the regions covering (h, w) of dy[..., c] / size^2, c < C.
extern "C" __global__ void avgpool_backward(int N, int H, int W, int C, int size, int stride, int pad_top, int pad_left,
                                            int Ho, int Wo, int rows_per_chunk, int Cy, int accumulate,
                                            const real_t* __restrict__ dy, real_t* __restrict__ dx) {
    ROW_LOOP(r, (long long)N * H * W, rows_per_chunk) {
        PIXEL(r, H, W);
        TILE_LOOP(c0, m, C) {
            real_t sum[TILE_MAX];
            for (int t = 0; t < m; ++t) sum[t] = 0;
            COVERING_WINDOWS(oh, ow, i, j) {
                const real_t* src = dy + AT(n, oh, ow, Ho, Wo, Cy) + c0;
                for (int t = 0; t < m; ++t) sum[t] += src[t];
            }
            store_mean(dx + r * C + c0, sum, m, size, accumulate);
        }
    }
}

// The global average pool of x (N, HW, C): y[n, c] = the sum over the HW pixels, in order, divided by HW; one
// thread per (n, c).
extern "C" __global__ void global_avgpool_forward(int N, int HW, int C, const real_t* __restrict__ x,
                                                  real_t* __restrict__ y) {
    GRID_STRIDE_LOOP(i, (long long)N * C) {
        const long long n = i / C, c = i % C;
        real_t sum = 0;
        for (int p = 0; p < HW; ++p) sum += x[(n * HW + p) * C + c];
        y[i] = sum / (real_t)HW;
    }
}

// Its gradient: dx[n, p, c] = dy[n, c] * scale (scale = 1 / HW); one thread per element of dx.
extern "C" __global__ void global_avgpool_backward(int N, int HW, int C, real_t scale, const real_t* __restrict__ dy,
                                                   real_t* __restrict__ dx) {
    GRID_STRIDE_LOOP(i, (long long)N * HW * C) {
        const long long c = i % C, n = i / ((long long)HW * C);
        dx[i] = dy[n * C + c] * scale;
    }
}
