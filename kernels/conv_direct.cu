// NHWC direct convolutions, the CPU's float32 fast path (minibp/layers/conv_direct.py chooses them): the
// convolution (and its data gradient) and its weight gradient computed in place from x and dy, with no col
// matrix. One source for every CPU: the float loops are written with GCC vector types whose width comes
// from the instruction set the build targets (kernels.py's CPU target: 16 floats with AVX-512, 8 with
// AVX2, 4 with SSE or NEON), so the compiler emits that set's instructions. The plain C++ loops run the
// double instantiation and the GPU: correct, not meant to be fast. Both are tested against im2col + GEMM
// (conv.cu, tests/test_conv.py).
#include "common.cuh"

// The vector a build computes with, in bytes.
#if defined(__CUDACC__) || defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif
#define LANES (VEC_BYTES / 4)  // floats a vector

// Register blocking, sized to the register file of the vectors' instruction set so that the
// accumulators, the vectors they read and a broadcast all stay in registers. A conv_direct tile is
// TILE_PIXELS output pixels along a row x up to TILE_VECTORS vectors of output channels; a
// conv_weight_grad task is one tap x GRAD_INPUTS input channels x GRAD_VECTORS vectors of output channels.
// Channel counts need not be multiples of these: the last block is partial.
#if VEC_BYTES == 64  // AVX-512: 32 registers; 16 accumulators either way
#define TILE_PIXELS 8
#define TILE_VECTORS 2
#define GRAD_INPUTS 16
#define GRAD_VECTORS 1
#elif VEC_BYTES == 32  // AVX2: 16 registers; 12 and 8 accumulators
#define TILE_PIXELS 6
#define TILE_VECTORS 2
#define GRAD_INPUTS 4
#define GRAD_VECTORS 2
#else  // SSE (16 registers) or NEON (32): 12 and 8 accumulators
#define TILE_PIXELS 6
#define TILE_VECTORS 2
#define GRAD_INPUTS 4
#define GRAD_VECTORS 2
#endif
#define TILE_CHANNELS (TILE_VECTORS * LANES)
#define GRAD_OUTPUTS (GRAD_VECTORS * LANES)

// The geometry above, for conv_direct.py (which sizes its launches and workspace by it): defined here
// once. Call with one thread.
extern "C" __global__ void conv_direct_geometry(int* geometry) {
    geometry[0] = LANES;
    geometry[1] = TILE_PIXELS;
    geometry[2] = TILE_VECTORS;
    geometry[3] = GRAD_INPUTS;
    geometry[4] = GRAD_VECTORS;
}

// dilation: x is read as if dilation - 1 zeros lay between its rows and between its columns (1 but in the
// data gradient of a strided conv: a stride-1 conv of dy so dilated, with the flipped kernel). The weights of tap
// (i, j) and input channel c start at wt + tap * w_tap + c * w_row, their Cout output channels contiguous; tap is
// i * kw + j, or flipped (kh - 1 - i) * kw + (kw - 1 - j).
struct ConvShape {
    int N, H, W, C, kh, kw, stride, dilation, pad_top, pad_left, Ho, Wo, Cout;
    long long w_tap, w_row;
    bool flip;
};

// The weights of tap (i, j): channel c's row of Cout at + c * w_row.
template <class T>
__device__ __forceinline__ const T* tap_weights(const ConvShape& s, const T* wt, int i, int j) {
    return wt + (s.flip ? (s.kh - 1 - i) * s.kw + (s.kw - 1 - j) : i * s.kw + j) * s.w_tap;
}

// The input index that output index o reads at kernel offset k, or -1 for a zero (padding or dilation).
__device__ __forceinline__ int input_index(int o, int k, int stride, int dilation, int pad, int size) {
    const int v = o * stride - pad + k;
    if (dilation == 1) return v < 0 || v >= size ? -1 : v;  // no division: a tile asks for each pixel and tap
    return v < 0 || v % dilation || v / dilation >= size ? -1 : v / dilation;
}

struct Tile {
    long long row;                          // n * Ho + oh
    int n, oh, ow0, co0, pixels, channels;  // the tile's part inside y: pixels x channels from (ow0, co0)
};

__device__ __forceinline__ Tile tile_at(const ConvShape& s, int tile_channels, long long t) {
    const int blocks = (s.Cout + tile_channels - 1) / tile_channels;
    const int tiles_w = (s.Wo + TILE_PIXELS - 1) / TILE_PIXELS;
    Tile b;
    b.co0 = (int)(t % blocks) * tile_channels;
    b.ow0 = (int)((t / blocks) % tiles_w) * TILE_PIXELS;
    b.row = t / ((long long)blocks * tiles_w);
    b.oh = (int)(b.row % s.Ho);
    b.n = (int)(b.row / s.Ho);
    b.pixels = min_int(TILE_PIXELS, s.Wo - b.ow0);
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
    const int cblocks = (s.C + GRAD_INPUTS - 1) / GRAD_INPUTS, oblocks = (s.Cout + GRAD_OUTPUTS - 1) / GRAD_OUTPUTS;
    GradTask g;
    g.co0 = (int)(t % oblocks) * GRAD_OUTPUTS;
    g.c0 = (int)((t / oblocks) % cblocks) * GRAD_INPUTS;
    const int tap = (int)((t / ((long long)oblocks * cblocks)) % (s.kh * s.kw));
    g.chunk = (int)(t / ((long long)oblocks * cblocks * s.kh * s.kw));
    g.i = tap / s.kw;
    g.j = tap % s.kw;
    g.cn = min_int(GRAD_INPUTS, s.C - g.c0);
    g.kn = min_int(GRAD_OUTPUTS, s.Cout - g.co0);
    valid_outputs(s.H, s.Ho, s.stride, s.pad_top, g.i, &g.oh_lo, &g.oh_hi);
    valid_outputs(s.W, s.Wo, s.stride, s.pad_left, g.j, &g.ow_lo, &g.ow_hi);
    return g;
}

// partial[chunk, i, j, c0 + c, co0 + k]
__device__ __forceinline__ long long grad_offset(const ConvShape& s, const GradTask& g, int c) {
    return ((((long long)g.chunk * s.kh + g.i) * s.kw + g.j) * s.C + g.c0 + c) * s.Cout + g.co0;
}

// The plain loops of both kernels. The vector versions below add the same products in the same order
// (a tile's or a task's sum runs over taps, then input channels, or over images, rows and columns), so
// only the rounding of a fused multiply-add separates them.
template <class T>
__device__ void direct_tile_plain(const ConvShape& s, int tile_channels, int accumulate, const T* x, const T* wt,
                                  T* y, long long t) {
    const Tile b = tile_at(s, tile_channels, t);
    T acc[TILE_PIXELS][TILE_CHANNELS] = {};
    for (int i = 0; i < s.kh; ++i) {
        const int h = input_index(b.oh, i, s.stride, s.dilation, s.pad_top, s.H);
        if (h < 0) continue;
        for (int j = 0; j < s.kw; ++j) {
            const T* wk = tap_weights(s, wt, i, j) + b.co0;
            for (int p = 0; p < b.pixels; ++p) {
                const int w = input_index(b.ow0 + p, j, s.stride, s.dilation, s.pad_left, s.W);
                if (w < 0) continue;
                const T* src = x + (((long long)b.n * s.H + h) * s.W + w) * s.C;
                for (int c = 0; c < s.C; ++c)
                    for (int k = 0; k < b.channels; ++k) acc[p][k] += src[c] * wk[(long long)c * s.w_row + k];
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
    T acc[GRAD_INPUTS][GRAD_OUTPUTS] = {};  // (input channel, output channel)
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

#ifndef __CUDACC__
// The vector loops: float only. Fused multiply-adds here (every other kernel is built without
// contraction, to round as its NumPy reference does): half the instructions, and these kernels are
// tested to float32 rounding, not bit for bit. The pragma holds only for functions compiled on their
// own, so the two entry points are noinline: inlined into the launcher (cpu_shim.h flattens it), they
// would take its options and lose the fusion (1.4x slower).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

typedef float vfloat __attribute__((vector_size(VEC_BYTES)));
typedef float vfloat_u __attribute__((vector_size(VEC_BYTES), aligned(4), may_alias));  // at any float

// The first n (>= 0) floats at p as a vector, zeros after them; all LANES of them when n >= LANES. The
// partial case names each lane by a constant: indexing a vector by a variable, or going through a
// copy in memory, makes GCC keep every accumulator of the tile on the stack, not in registers.
static inline vfloat load_lanes(const float* p, int n) {
    if (n >= LANES) return *(const vfloat_u*)p;
    vfloat v = {};
#pragma GCC unroll 16
    for (int l = 0; l < LANES; ++l)
        if (l < n) v[l] = p[l];
    return v;
}

static inline void store_lanes(float* p, vfloat v, int n) {
    if (n >= LANES) {
        *(vfloat_u*)p = v;
        return;
    }
#pragma GCC unroll 16
    for (int l = 0; l < LANES; ++l)
        if (l < n) p[l] = v[l];
}

// As direct_tile_plain, with V vectors of output channels, the first `lanes` of them holding channels
// (all of them when WHOLE): the tile's sums live in TILE_PIXELS x V registers; each input value is
// broadcast against its tap's and channel's weights. A pixel outside x (padding, dilation, past the
// row's end) reads a row of zeros.
#define ZERO_ROW 4096  // input channels the row of zeros covers; a conv with more takes the plain loop
static const float zero_row[ZERO_ROW] = {};

// acc[p][v] += pixel p's value of each input channel c x the tap's weights of channel c: a tile's inner
// loop. ALONG_ROW: the pixels lie step apart from src[0], which lets GCC address all of them from one
// register (else it advances a pointer a pixel, and the loop is 1.3x slower on AVX-512).
template <int V, bool WHOLE, bool ALONG_ROW>
__attribute__((always_inline)) static inline void add_tap(vfloat (&acc)[TILE_PIXELS][V],
                                                          const float* const (&src)[TILE_PIXELS], long long step,
                                                          const float* wk, const ConvShape& s, const int (&lanes)[V]) {
    for (int c = 0; c < s.C; ++c, wk += s.w_row) {
        vfloat wv[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) wv[v] = load_lanes(wk + v * LANES, WHOLE ? LANES : lanes[v]);
#pragma GCC unroll 8
        for (int p = 0; p < TILE_PIXELS; ++p) {
            const float xp = ALONG_ROW ? src[0][p * step + c] : src[p][c];
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) acc[p][v] += xp * wv[v];
        }
    }
}

template <int V, bool WHOLE>
__attribute__((noinline)) static void direct_tile_vector(const ConvShape& s, const Tile& b, int accumulate, const float* x, const float* wt,
                               float* y) {
    int lanes[V];
    for (int v = 0; v < V; ++v) lanes[v] = b.channels - v * LANES;
    // Every loop that indexes acc is unrolled (constant bounds and the pragmas): else GCC keeps acc on the
    // stack and stores all of it each step of the inner loop (2x slower).
    vfloat acc[TILE_PIXELS][V];
#pragma GCC unroll 8
    for (int p = 0; p < TILE_PIXELS; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = vfloat{};
    for (int i = 0; i < s.kh; ++i) {
        const int h = input_index(b.oh, i, s.stride, s.dilation, s.pad_top, s.H);
        if (h < 0) continue;
        for (int j = 0; j < s.kw; ++j) {
            const float* wk = tap_weights(s, wt, i, j) + b.co0;
            const float* src[TILE_PIXELS];
            bool along_row = s.dilation == 1 && b.pixels == TILE_PIXELS;  // every pixel inside x
            for (int p = 0; p < TILE_PIXELS; ++p) {
                const int w = input_index(b.ow0 + p, j, s.stride, s.dilation, s.pad_left, s.W);
                src[p] = w >= 0 && p < b.pixels ? x + (((long long)b.n * s.H + h) * s.W + w) * s.C : zero_row;
                along_row = along_row && w >= 0;
            }
            if (along_row)
                add_tap<V, WHOLE, true>(acc, src, (long long)s.stride * s.C, wk, s, lanes);
            else
                add_tap<V, WHOLE, false>(acc, src, 0, wk, s, lanes);
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < TILE_PIXELS; ++p) {
        if (p >= b.pixels) continue;
        float* dst = y + (b.row * s.Wo + b.ow0 + p) * s.Cout + b.co0;
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) {
            float* d = dst + v * LANES;
            store_lanes(d, accumulate ? load_lanes(d, lanes[v]) + acc[p][v] : acc[p][v], lanes[v]);
        }
    }
}

// As weight_grad_task_plain: GRAD_INPUTS x GRAD_VECTORS registers, a row per input channel holding its
// output channels. A block of fewer input channels (C = 3) computes the missing ones from its last
// channel and does not store them.
__attribute__((noinline)) static void weight_grad_task_vector(const ConvShape& s, int images_per_chunk, const float* x, const float* dy,
                                    float* partial, long long t) {
    const GradTask g = grad_task_at(s, t);
    int offset[GRAD_INPUTS], lanes[GRAD_VECTORS];
    vfloat acc[GRAD_INPUTS][GRAD_VECTORS];  // unrolled wherever indexed, to stay in registers
    for (int c = 0; c < GRAD_INPUTS; ++c) offset[c] = c < g.cn ? c : g.cn - 1;
    for (int v = 0; v < GRAD_VECTORS; ++v) lanes[v] = g.kn - v * LANES;
#pragma GCC unroll 16
    for (int c = 0; c < GRAD_INPUTS; ++c)
#pragma GCC unroll 4
        for (int v = 0; v < GRAD_VECTORS; ++v) acc[c][v] = vfloat{};
    const bool whole = g.cn == GRAD_INPUTS && g.kn == GRAD_OUTPUTS;
    const long long x_step = (long long)s.stride * s.C;
    const int n_end = min_int((g.chunk + 1) * images_per_chunk, s.N);
    for (int n = g.chunk * images_per_chunk; n < n_end; ++n)
        for (int oh = g.oh_lo; oh < g.oh_hi; ++oh) {
            const float* xs = x + (((long long)n * s.H + oh * s.stride - s.pad_top + g.i) * s.W +
                                   g.ow_lo * s.stride - s.pad_left + g.j) * s.C + g.c0;
            const float* ds = dy + (((long long)n * s.Ho + oh) * s.Wo + g.ow_lo) * s.Cout + g.co0;
            if (whole) {
                for (int ow = g.ow_lo; ow < g.ow_hi; ++ow, xs += x_step, ds += s.Cout) {
                    vfloat dv[GRAD_VECTORS];
#pragma GCC unroll 4
                    for (int v = 0; v < GRAD_VECTORS; ++v) dv[v] = *(const vfloat_u*)(ds + v * LANES);
#pragma GCC unroll 16
                    for (int c = 0; c < GRAD_INPUTS; ++c)
#pragma GCC unroll 4
                        for (int v = 0; v < GRAD_VECTORS; ++v) acc[c][v] += xs[c] * dv[v];
                }
            } else {
                for (int ow = g.ow_lo; ow < g.ow_hi; ++ow, xs += x_step, ds += s.Cout) {
                    vfloat dv[GRAD_VECTORS];
#pragma GCC unroll 4
                    for (int v = 0; v < GRAD_VECTORS; ++v) dv[v] = load_lanes(ds + v * LANES, lanes[v]);
#pragma GCC unroll 16
                    for (int c = 0; c < GRAD_INPUTS; ++c)
#pragma GCC unroll 4
                        for (int v = 0; v < GRAD_VECTORS; ++v) acc[c][v] += xs[offset[c]] * dv[v];
                }
            }
        }
#pragma GCC unroll 16
    for (int c = 0; c < GRAD_INPUTS; ++c)
        if (c < g.cn)
#pragma GCC unroll 4
            for (int v = 0; v < GRAD_VECTORS; ++v)
                store_lanes(partial + grad_offset(s, g, c) + v * LANES, acc[c][v], lanes[v]);
}

#pragma GCC pop_options

static inline void direct_tile(const ConvShape& s, int vectors, int accumulate, const float* x, const float* wt,
                               float* y, long long t) {
    static_assert(TILE_VECTORS == 2, "direct_tile instantiates the vector tile for 1 and 2 vectors");
    if (s.C > ZERO_ROW) return direct_tile_plain(s, vectors * LANES, accumulate, x, wt, y, t);
    const Tile b = tile_at(s, vectors * LANES, t);
    const bool whole = b.channels == vectors * LANES;  // every lane a channel: all but a last, partial block
    if (vectors == 1)
        whole ? direct_tile_vector<1, true>(s, b, accumulate, x, wt, y) : direct_tile_vector<1, false>(s, b, accumulate, x, wt, y);
    else
        whole ? direct_tile_vector<2, true>(s, b, accumulate, x, wt, y) : direct_tile_vector<2, false>(s, b, accumulate, x, wt, y);
}

static inline void weight_grad_task(const ConvShape& s, int images_per_chunk, const float* x, const float* dy,
                                    float* partial, long long t) {
    weight_grad_task_vector(s, images_per_chunk, x, dy, partial, t);
}
#endif

template <class T>
__device__ __forceinline__ void direct_tile(const ConvShape& s, int vectors, int accumulate, const T* x, const T* wt,
                                            T* y, long long t) {
    direct_tile_plain(s, vectors * LANES, accumulate, x, wt, y, t);
}

template <class T>
__device__ __forceinline__ void weight_grad_task(const ConvShape& s, int images_per_chunk, const T* x, const T* dy,
                                                 T* partial, long long t) {
    weight_grad_task_plain(s, images_per_chunk, x, dy, partial, t);
}

// y (N, Ho, Wo, Cout) = (or += with accumulate) the convolution of x (N, H, W, C), dilated by dilation,
// with wt (kh, kw, C, Cout), or, flipped (the data gradient), with a conv's own weights wt (C, kh, kw, Cout) read
// with the taps reversed. One thread per tile of TILE_PIXELS pixels x vectors (1 to TILE_VECTORS) vectors of
// LANES channels: N * Ho * ceil(Wo / TILE_PIXELS) * ceil(Cout / (vectors * LANES)) of them.
extern "C" __global__ void conv_direct(int N, int H, int W, int C, int kh, int kw, int stride, int dilation,
                                       int pad_top, int pad_left, int Ho, int Wo, int Cout, int vectors,
                                       int accumulate, int flipped, const real_t* x, const real_t* wt, real_t* y) {
    const long long taps = (long long)kh * kw;
    const ConvShape s{N, H, W, C, kh, kw, stride, dilation, pad_top, pad_left, Ho, Wo, Cout,
                      flipped ? Cout : C * (long long)Cout, flipped ? taps * Cout : Cout, flipped != 0};
    vectors = vectors < 1 ? 1 : vectors > TILE_VECTORS ? TILE_VECTORS : vectors;
    const long long tiles =
        (long long)N * Ho * ((Wo + TILE_PIXELS - 1) / TILE_PIXELS) * ((Cout + vectors * LANES - 1) / (vectors * LANES));
    GRID_STRIDE_LOOP(t, tiles) direct_tile(s, vectors, accumulate, x, wt, y, t);
}

// partial (chunks, kh, kw, C, Cout): chunk q's sum, over its images [q * images_per_chunk, ...) and every
// output pixel, of x[n, oh*stride - pad_top + i, ow*stride - pad_left + j, c] * dy[n, oh, ow, co] (taps
// outside x add nothing). Summed over the chunks it is dL/dw in wt's layout. One thread per task:
// chunks * kh * kw * ceil(C / GRAD_INPUTS) * ceil(Cout / GRAD_OUTPUTS).
extern "C" __global__ void conv_weight_grad(int N, int H, int W, int C, int kh, int kw, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, int Cout, int images_per_chunk,
                                            const real_t* x, const real_t* dy, real_t* partial) {
    const ConvShape s{N, H, W, C, kh, kw, stride, 1, pad_top, pad_left, Ho, Wo, Cout, 0, 0, false};
    const long long chunks = (N + images_per_chunk - 1) / images_per_chunk;
    const long long tasks = chunks * kh * kw * ((C + GRAD_INPUTS - 1) / GRAD_INPUTS) *
                            ((Cout + GRAD_OUTPUTS - 1) / GRAD_OUTPUTS);
    GRID_STRIDE_LOOP(t, tasks) weight_grad_task(s, images_per_chunk, x, dy, partial, t);
}

// dw (Cout, K) = (+= with accumulate) the sum over chunks of partial (chunks, K, Cout), conv_weight_grad's, added
// in order: one thread per weight, K = kh * kw * C. (0 + sum, not sum: what a zeroed gradient and accumulate give.)
extern "C" __global__ void conv_weight_grad_finish(int chunks, long long K, int Cout, int accumulate,
                                                   const real_t* partial, real_t* dw) {
    GRID_STRIDE_LOOP(i, K * Cout) {
        const long long co = i / K, k = i % K;
        real_t sum = 0;
        for (int q = 0; q < chunks; ++q) sum += partial[(q * K + k) * Cout + co];
        dw[i] = (accumulate ? dw[i] : (real_t)0) + sum;
    }
}
