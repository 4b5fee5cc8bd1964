// NHWC direct convolutions, the CPU's float32 fast path (minibp/conv_direct.py chooses them): the
// convolution (and its data gradient) and its weight gradient computed in place from x and dy, with no col
// matrix, on AVX-512 (checked at run time). Their plain C++ loops run elsewhere (double, other CPUs, the
// GPU): correct, not meant to be fast. The reference they are tested against is im2col + GEMM (conv.cu).
#include "common.cuh"

// Weights with the output channel fastest: wt is (kh, kw, C, Cout), w reshaped to (kh*kw*C, Cout).
// A conv_direct tile is DIRECT_PIXELS output pixels along a row x tile_channels (16 or 32) output
// channels; a conv_weight_grad task is one tap x DIRECT_LANES input channels x DIRECT_LANES output channels.
// Channel counts need not be multiples of these: the last block is partial.
#define DIRECT_PIXELS 8
#define DIRECT_LANES 16

// dilation: x is read as if dilation - 1 zeros lay between its rows and between its columns (1 but in the
// data gradient of a strided conv: a stride-1 conv of dy so dilated, with the flipped kernel).
struct ConvShape {
    int N, H, W, C, kh, kw, stride, dilation, pad_top, pad_left, Ho, Wo, Cout;
};

// The input index that output index o reads at kernel offset k, or -1 for a zero (padding or dilation).
__device__ __forceinline__ int input_index(int o, int k, int stride, int dilation, int pad, int size) {
    const int v = o * stride - pad + k;
    return v < 0 || v % dilation || v / dilation >= size ? -1 : v / dilation;
}

struct Tile {
    long long row;                          // n * Ho + oh
    int n, oh, ow0, co0, pixels, channels;  // the tile's part inside y: pixels x channels from (ow0, co0)
};

__device__ __forceinline__ Tile tile_at(const ConvShape& s, int tile_channels, long long t) {
    const int blocks = (s.Cout + tile_channels - 1) / tile_channels;
    const int tiles_w = (s.Wo + DIRECT_PIXELS - 1) / DIRECT_PIXELS;
    Tile b;
    b.co0 = (int)(t % blocks) * tile_channels;
    b.ow0 = (int)((t / blocks) % tiles_w) * DIRECT_PIXELS;
    b.row = t / ((long long)blocks * tiles_w);
    b.oh = (int)(b.row % s.Ho);
    b.n = (int)(b.row / s.Ho);
    b.pixels = min_int(DIRECT_PIXELS, s.Wo - b.ow0);
    b.channels = min_int(tile_channels, s.Cout - b.co0);
    return b;
}

struct GradTask {
    int chunk, i, j, c0, co0, cn, kn;  // kn output channels from co0, cn input channels from c0
    int oh_lo, oh_hi, ow_lo, ow_hi;    // the outputs whose tap (i, j) reads inside x
};

// The outputs o in [lo, hi) whose tap at offset k reads an input index in [0, size).
__device__ __forceinline__ void valid_outputs(int size, int out_size, int stride, int pad, int k, int* lo, int* hi) {
    const int first = pad - k, last = size - 1 + pad - k;  // o * stride must lie in [first, last]
    *lo = first <= 0 ? 0 : (first + stride - 1) / stride;
    *hi = last < 0 ? 0 : min_int(last / stride + 1, out_size);
}

__device__ __forceinline__ GradTask grad_task_at(const ConvShape& s, long long t) {
    const int cblocks = (s.C + DIRECT_LANES - 1) / DIRECT_LANES, oblocks = (s.Cout + DIRECT_LANES - 1) / DIRECT_LANES;
    GradTask g;
    g.co0 = (int)(t % oblocks) * DIRECT_LANES;
    g.c0 = (int)((t / oblocks) % cblocks) * DIRECT_LANES;
    const int tap = (int)((t / ((long long)oblocks * cblocks)) % (s.kh * s.kw));
    g.chunk = (int)(t / ((long long)oblocks * cblocks * s.kh * s.kw));
    g.i = tap / s.kw;
    g.j = tap % s.kw;
    g.cn = min_int(DIRECT_LANES, s.C - g.c0);
    g.kn = min_int(DIRECT_LANES, s.Cout - g.co0);
    valid_outputs(s.H, s.Ho, s.stride, s.pad_top, g.i, &g.oh_lo, &g.oh_hi);
    valid_outputs(s.W, s.Wo, s.stride, s.pad_left, g.j, &g.ow_lo, &g.ow_hi);
    return g;
}

// partial[chunk, i, j, c0 + c, co0 + k]
__device__ __forceinline__ long long grad_offset(const ConvShape& s, const GradTask& g, int c) {
    return ((((long long)g.chunk * s.kh + g.i) * s.kw + g.j) * s.C + g.c0 + c) * s.Cout + g.co0;
}

// The plain loops of both kernels; the AVX-512 versions below do the same sums in another order.
template <class T>
__device__ void direct_tile_plain(const ConvShape& s, int tile_channels, int accumulate, const T* x, const T* wt,
                                  T* y, long long t) {
    const Tile b = tile_at(s, tile_channels, t);
    T acc[DIRECT_PIXELS][2 * DIRECT_LANES] = {};
    for (int i = 0; i < s.kh; ++i) {
        const int h = input_index(b.oh, i, s.stride, s.dilation, s.pad_top, s.H);
        if (h < 0) continue;
        for (int j = 0; j < s.kw; ++j) {
            const T* wk = wt + (long long)(i * s.kw + j) * s.C * s.Cout + b.co0;
            for (int p = 0; p < b.pixels; ++p) {
                const int w = input_index(b.ow0 + p, j, s.stride, s.dilation, s.pad_left, s.W);
                if (w < 0) continue;
                const T* src = x + (((long long)b.n * s.H + h) * s.W + w) * s.C;
                for (int c = 0; c < s.C; ++c)
                    for (int k = 0; k < b.channels; ++k) acc[p][k] += src[c] * wk[(long long)c * s.Cout + k];
            }
        }
    }
    for (int p = 0; p < b.pixels; ++p) {
        T* dst = y + (b.row * s.Wo + b.ow0 + p) * s.Cout + b.co0;
        for (int k = 0; k < b.channels; ++k) dst[k] = accumulate ? dst[k] + acc[p][k] : acc[p][k];
    }
}

template <class T>
__device__ void weight_grad_task_plain(const ConvShape& s, int images_per_chunk, const T* x, const T* dy, T* partial,
                                       long long t) {
    const GradTask g = grad_task_at(s, t);
    T acc[DIRECT_LANES][DIRECT_LANES] = {};  // (input channel, output channel)
    const int n_end = min_int((g.chunk + 1) * images_per_chunk, s.N);
    for (int n = g.chunk * images_per_chunk; n < n_end; ++n)
        for (int oh = g.oh_lo; oh < g.oh_hi; ++oh)
            for (int ow = g.ow_lo; ow < g.ow_hi; ++ow) {
                const T* xs = x + (((long long)n * s.H + oh * s.stride - s.pad_top + g.i) * s.W + ow * s.stride -
                                   s.pad_left + g.j) * s.C + g.c0;
                const T* ds = dy + (((long long)n * s.Ho + oh) * s.Wo + ow) * s.Cout + g.co0;
                for (int c = 0; c < g.cn; ++c)
                    for (int k = 0; k < g.kn; ++k) acc[c][k] += xs[c] * ds[k];
            }
    for (int c = 0; c < g.cn; ++c)
        for (int k = 0; k < g.kn; ++k) partial[grad_offset(s, g, c) + k] = acc[c][k];
}

#if !defined(__CUDACC__) && defined(__x86_64__)
#include <immintrin.h>

static inline bool cpu_has_avx512() {
    static const bool has = __builtin_cpu_supports("avx512f");
    return has;
}

__attribute__((target("avx512f"))) static inline __mmask16 lane_mask(int lanes) {
    return lanes >= DIRECT_LANES ? (__mmask16)0xFFFF : lanes <= 0 ? (__mmask16)0 : (__mmask16)((1u << lanes) - 1);
}

// As direct_tile_plain for float, with V 16-channel vectors a pixel: the 8 pixels' sums live in 8V
// registers; each input value is broadcast against its tap's and channel's weights. Padding taps read 0.
template <int V>
__attribute__((target("avx512f"))) static void direct_tile_avx512(const ConvShape& s, int accumulate, const float* x,
                                                                  const float* wt, float* y, long long t) {
    static const float zero = 0.0f;
    const Tile b = tile_at(s, V * DIRECT_LANES, t);
    // Every loop that indexes acc is unrolled (constant bounds and the pragma): else GCC keeps acc on the
    // stack and stores all of it each step of the inner loop (2x slower).
    __mmask16 mask[V];
    __m512 acc[DIRECT_PIXELS][V];
    for (int v = 0; v < V; ++v) mask[v] = lane_mask(b.channels - v * DIRECT_LANES);
#pragma GCC unroll 8
    for (int p = 0; p < DIRECT_PIXELS; ++p)
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) acc[p][v] = _mm512_setzero_ps();
    for (int i = 0; i < s.kh; ++i) {
        const int h = input_index(b.oh, i, s.stride, s.dilation, s.pad_top, s.H);
        if (h < 0) continue;
        for (int j = 0; j < s.kw; ++j) {
            const float* wk = wt + (long long)(i * s.kw + j) * s.C * s.Cout + b.co0;
            const int w0 = input_index(b.ow0, j, s.stride, s.dilation, s.pad_left, s.W);
            const int w_last = input_index(b.ow0 + DIRECT_PIXELS - 1, j, s.stride, s.dilation, s.pad_left, s.W);
            if (s.dilation == 1 && w0 >= 0 && w_last >= 0 && b.pixels == DIRECT_PIXELS) {
                // every pixel inside x: one pointer, the pixels at fixed offsets from it
                const float* src = x + (((long long)b.n * s.H + h) * s.W + w0) * s.C;
                const long long pixel_step = (long long)s.stride * s.C;
                for (int c = 0; c < s.C; ++c, wk += s.Cout, ++src) {
                    __m512 wv[V];
                    for (int v = 0; v < V; ++v) wv[v] = _mm512_maskz_loadu_ps(mask[v], wk + v * DIRECT_LANES);
#pragma GCC unroll 8
                    for (int p = 0; p < DIRECT_PIXELS; ++p) {
                        const __m512 xv = _mm512_set1_ps(src[p * pixel_step]);
                        for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
                    }
                }
                continue;
            }
            const float* src[DIRECT_PIXELS];
            long long step[DIRECT_PIXELS];
            for (int p = 0; p < DIRECT_PIXELS; ++p) {
                const int w = input_index(b.ow0 + p, j, s.stride, s.dilation, s.pad_left, s.W);
                const bool inside = w >= 0 && p < b.pixels;
                src[p] = inside ? x + (((long long)b.n * s.H + h) * s.W + w) * s.C : &zero;
                step[p] = inside;
            }
            for (int c = 0; c < s.C; ++c, wk += s.Cout) {
                __m512 wv[V];
                for (int v = 0; v < V; ++v) wv[v] = _mm512_maskz_loadu_ps(mask[v], wk + v * DIRECT_LANES);
#pragma GCC unroll 8
                for (int p = 0; p < DIRECT_PIXELS; ++p) {
                    const __m512 xv = _mm512_set1_ps(*src[p]);
                    src[p] += step[p];
                    for (int v = 0; v < V; ++v) acc[p][v] = _mm512_fmadd_ps(xv, wv[v], acc[p][v]);
                }
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < DIRECT_PIXELS; ++p) {
        if (p >= b.pixels) break;
        float* dst = y + (b.row * s.Wo + b.ow0 + p) * s.Cout + b.co0;
        for (int v = 0; v < V; ++v) {
            float* d = dst + v * DIRECT_LANES;
            const __m512 sum = accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(mask[v], d), acc[p][v]) : acc[p][v];
            _mm512_mask_storeu_ps(d, mask[v], sum);
        }
    }
}

// As weight_grad_task_plain for float: 16 registers, one per input channel, each holding its 16 output
// channels. A block of fewer input channels (C = 3) computes the missing ones from its last channel
// and does not store them.
__attribute__((target("avx512f"))) static void weight_grad_task_avx512(const ConvShape& s, int images_per_chunk,
                                                                       const float* x, const float* dy,
                                                                       float* partial, long long t) {
    const GradTask g = grad_task_at(s, t);
    const __mmask16 mask = lane_mask(g.kn);
    int offset[DIRECT_LANES];
    __m512 acc[DIRECT_LANES];  // unrolled wherever indexed, to stay in registers (as in direct_tile_avx512)
    for (int c = 0; c < DIRECT_LANES; ++c) offset[c] = c < g.cn ? c : g.cn - 1;
#pragma GCC unroll 16
    for (int c = 0; c < DIRECT_LANES; ++c) acc[c] = _mm512_setzero_ps();
    const long long x_step = (long long)s.stride * s.C;
    const int n_end = min_int((g.chunk + 1) * images_per_chunk, s.N);
    for (int n = g.chunk * images_per_chunk; n < n_end; ++n)
        for (int oh = g.oh_lo; oh < g.oh_hi; ++oh) {
            const float* xs = x + (((long long)n * s.H + oh * s.stride - s.pad_top + g.i) * s.W +
                                   g.ow_lo * s.stride - s.pad_left + g.j) * s.C + g.c0;
            const float* ds = dy + (((long long)n * s.Ho + oh) * s.Wo + g.ow_lo) * s.Cout + g.co0;
            if (g.cn == DIRECT_LANES) {
                for (int ow = g.ow_lo; ow < g.ow_hi; ++ow, xs += x_step, ds += s.Cout) {
                    const __m512 dv = _mm512_maskz_loadu_ps(mask, ds);
#pragma GCC unroll 16
                    for (int c = 0; c < DIRECT_LANES; ++c) acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xs[c]), dv, acc[c]);
                }
            } else {
                for (int ow = g.ow_lo; ow < g.ow_hi; ++ow, xs += x_step, ds += s.Cout) {
                    const __m512 dv = _mm512_maskz_loadu_ps(mask, ds);
#pragma GCC unroll 16
                    for (int c = 0; c < DIRECT_LANES; ++c)
                        acc[c] = _mm512_fmadd_ps(_mm512_set1_ps(xs[offset[c]]), dv, acc[c]);
                }
            }
        }
#pragma GCC unroll 16
    for (int c = 0; c < DIRECT_LANES; ++c)
        if (c < g.cn) _mm512_mask_storeu_ps(partial + grad_offset(s, g, c), mask, acc[c]);
}

static inline void direct_tile(const ConvShape& s, int tile_channels, int accumulate, const float* x,
                               const float* wt, float* y, long long t) {
    if (!cpu_has_avx512())
        direct_tile_plain(s, tile_channels, accumulate, x, wt, y, t);
    else if (tile_channels == 2 * DIRECT_LANES)
        direct_tile_avx512<2>(s, accumulate, x, wt, y, t);
    else
        direct_tile_avx512<1>(s, accumulate, x, wt, y, t);
}

static inline void weight_grad_task(const ConvShape& s, int images_per_chunk, const float* x, const float* dy,
                                    float* partial, long long t) {
    if (cpu_has_avx512())
        weight_grad_task_avx512(s, images_per_chunk, x, dy, partial, t);
    else
        weight_grad_task_plain(s, images_per_chunk, x, dy, partial, t);
}
#endif

template <class T>
__device__ __forceinline__ void direct_tile(const ConvShape& s, int tile_channels, int accumulate, const T* x,
                                            const T* wt, T* y, long long t) {
    direct_tile_plain(s, tile_channels, accumulate, x, wt, y, t);
}

template <class T>
__device__ __forceinline__ void weight_grad_task(const ConvShape& s, int images_per_chunk, const T* x, const T* dy,
                                                 T* partial, long long t) {
    weight_grad_task_plain(s, images_per_chunk, x, dy, partial, t);
}

// y (N, Ho, Wo, Cout) = (or += with accumulate) the convolution of x (N, H, W, C), dilated by dilation,
// with wt (kh, kw, C, Cout). One thread per tile (tile_channels 16 or 32):
// N * Ho * ceil(Wo / DIRECT_PIXELS) * ceil(Cout / tile_channels) of them.
extern "C" __global__ void conv_direct(int N, int H, int W, int C, int kh, int kw, int stride, int dilation,
                                       int pad_top, int pad_left, int Ho, int Wo, int Cout, int tile_channels,
                                       int accumulate, const real_t* x, const real_t* wt, real_t* y) {
    const ConvShape s{N, H, W, C, kh, kw, stride, dilation, pad_top, pad_left, Ho, Wo, Cout};
    tile_channels = tile_channels > DIRECT_LANES ? 2 * DIRECT_LANES : DIRECT_LANES;  // the two the tiles hold
    const long long tiles =
        (long long)N * Ho * ((Wo + DIRECT_PIXELS - 1) / DIRECT_PIXELS) * ((Cout + tile_channels - 1) / tile_channels);
    GRID_STRIDE_LOOP(t, tiles) direct_tile(s, tile_channels, accumulate, x, wt, y, t);
}

// partial (chunks, kh, kw, C, Cout): chunk q's sum, over its images [q * images_per_chunk, ...) and every
// output pixel, of x[n, oh*stride - pad_top + i, ow*stride - pad_left + j, c] * dy[n, oh, ow, co] (taps
// outside x add nothing). Summed over the chunks it is dL/dw in wt's layout. One thread per task:
// chunks * kh * kw * ceil(C / DIRECT_LANES) * ceil(Cout / DIRECT_LANES).
extern "C" __global__ void conv_weight_grad(int N, int H, int W, int C, int kh, int kw, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, int Cout, int images_per_chunk,
                                            const real_t* x, const real_t* dy, real_t* partial) {
    const ConvShape s{N, H, W, C, kh, kw, stride, 1, pad_top, pad_left, Ho, Wo, Cout};
    const long long chunks = (N + images_per_chunk - 1) / images_per_chunk;
    const long long tasks = chunks * kh * kw * ((C + DIRECT_LANES - 1) / DIRECT_LANES) *
                            ((Cout + DIRECT_LANES - 1) / DIRECT_LANES);
    GRID_STRIDE_LOOP(t, tasks) weight_grad_task(s, images_per_chunk, x, dy, partial, t);
}
