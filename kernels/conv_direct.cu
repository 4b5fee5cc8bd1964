// NHWC direct convolutions, the CPU's float32 fast path (minibp/layers/conv_direct.py chooses them): the
// convolution (and its data gradient) and its weight gradient computed in place from x and dy, with no col
// matrix. One source for every CPU: the float loops are written with GCC vector types whose width comes
// from the instruction set the build targets (kernels.py's CPU target: 16 floats with AVX-512, 8 with
// AVX2, 4 with SSE or NEON), so the compiler emits that set's instructions. The plain C++ loops run the
// double instantiation and the GPU: correct, not meant to be fast. Both are tested against im2col + GEMM
// (conv.cu, tests/layers/test_conv.py).
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
#define LINE_FLOATS 16     // floats a 64-byte cache line
#define PREFETCH_PIXELS 8  // how far ahead a weight-gradient task asks for its pixels

// Register blocking, sized to the register file of the vectors' instruction set so that the
// accumulators, the vectors they read and a broadcast all stay in registers. A conv_direct tile keeps
// TILE_SUMS vectors of sums: TILE_SUMS / V consecutive output pixels x V vectors of output channels, V from
// 1 to CONV_VECTORS (the launch's `vectors`: 1 when the output channels fill one vector, so a conv with 16 of
// them on AVX-512 still keeps every register busy). A conv_weight_grad task likewise keeps GRAD_SUMS: one tap x
// GRAD_SUMS / V input channels x V vectors of output channels. Channel counts need not be multiples of these:
// the last block is partial.
#if VEC_BYTES == 64  // AVX-512: 32 registers
#define TILE_SUMS 16
#define GRAD_SUMS 16
#else  // AVX2 or SSE (16 registers), NEON (32): 12 sums, 2 vectors read and a broadcast fill 15 of 16
#define TILE_SUMS 12
#define GRAD_SUMS 12
#endif

// A tile's pixels, and a weight-gradient task's input channels, with V vectors of output channels.
__device__ __forceinline__ constexpr int tile_pixels(int V) { return TILE_SUMS / V; }
__device__ __forceinline__ constexpr int grad_inputs(int V) { return GRAD_SUMS / V; }

// The geometry above, for conv_direct.py (which sizes its launches and workspace by it): defined here
// once (CONV_VECTORS, the most V, is constants.py's). geometry (1 + 2 * CONV_VECTORS): the floats a vector,
// then tile_pixels(V) for each V, then grad_inputs(V) for each V. Call with one thread.
extern "C" __global__ void conv_direct_geometry(int* geometry) {
    geometry[0] = LANES;
    for (int v = 1; v <= CONV_VECTORS; ++v) geometry[v] = tile_pixels(v);
    for (int v = 1; v <= CONV_VECTORS; ++v) geometry[CONV_VECTORS + v] = grad_inputs(v);
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

// A task of conv_direct: tile_pixels(vectors) consecutive pixels of y (N * Ho * Wo of them, in their order),
// every output channel. It computes them a tile at a time, `vectors` vectors of output channels a tile (the
// pixels' inputs stay in L1 from one to the next, and the task's position is found once for all of them: its
// divisions cost about as much as a tile's multiply-adds with 16 input channels). Most tasks lie in one row of
// y; one that runs on into the next (rows of 8 pixels and AVX2's tiles of 6) places each pixel on its own.
struct Tile {
    long long first;                        // the first pixel: (n * Ho + oh) * Wo + ow0
    int n, oh, ow0, co0, pixels, channels;  // the tile's part inside y: pixels x channels from (first, co0)
    bool one_row;                           // every pixel in row (n, oh)
};

// Task t's first tile: its output channels from 0.
__device__ __forceinline__ Tile task_at(const ConvShape& s, int vectors, long long t) {
    const int width = tile_pixels(vectors);
    Tile b;
    b.first = t * width;
    const long long row = b.first / s.Wo;
    b.ow0 = (int)(b.first % s.Wo);
    b.oh = (int)(row % s.Ho);
    b.n = (int)(row / s.Ho);
    b.pixels = (int)min_ll(width, (long long)s.N * s.Ho * s.Wo - b.first);
    b.one_row = b.ow0 + b.pixels <= s.Wo;
    b.co0 = 0;
    b.channels = min_int(vectors * LANES, s.Cout);
    return b;
}

// Pixel p (< b.pixels) of tile b: its image, row and column in y.
__device__ __forceinline__ void tile_pixel(const ConvShape& s, const Tile& b, int p, int* n, int* oh, int* ow) {
    *ow = b.ow0 + p, *oh = b.oh, *n = b.n;
    for (; *ow >= s.Wo; *ow -= s.Wo)  // (a tile spans a few rows at most)
        if (++*oh == s.Ho) *oh = 0, ++*n;
}

// The task's tiles: for (Tile b = task_at(...); b.co0 < s.Cout; next_tile(s, vectors, b))
__device__ __forceinline__ void next_tile(const ConvShape& s, int vectors, Tile& b) {
    b.co0 += vectors * LANES;
    b.channels = min_int(vectors * LANES, s.Cout - b.co0);
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

// Task t of those of `vectors` vectors of output channels (and grad_inputs(vectors) input channels).
__device__ __forceinline__ GradTask grad_task_at(const ConvShape& s, int vectors, long long t) {
    const int inputs = grad_inputs(vectors), outputs = vectors * LANES;
    const int cblocks = (s.C + inputs - 1) / inputs, oblocks = (s.Cout + outputs - 1) / outputs;
    GradTask g;
    g.co0 = (int)(t % oblocks) * outputs;
    g.c0 = (int)((t / oblocks) % cblocks) * inputs;
    const int tap = (int)((t / ((long long)oblocks * cblocks)) % (s.kh * s.kw));
    g.chunk = (int)(t / ((long long)oblocks * cblocks * s.kh * s.kw));
    g.i = tap / s.kw;
    g.j = tap % s.kw;
    g.cn = min_int(inputs, s.C - g.c0);
    g.kn = min_int(outputs, s.Cout - g.co0);
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
__device__ void direct_tile_plain(const ConvShape& s, const Tile& b, int accumulate, const T* x, const T* wt, T* y) {
    for (int p = 0; p < b.pixels; ++p) {
        T acc[CONV_VECTORS * LANES] = {};  // the most channels
        int n, oh, ow;
        tile_pixel(s, b, p, &n, &oh, &ow);
        for (int i = 0; i < s.kh; ++i) {
            const int h = input_index(oh, i, s.stride, s.dilation, s.pad_top, s.H);
            if (h < 0) continue;
            for (int j = 0; j < s.kw; ++j) {
                const int w = input_index(ow, j, s.stride, s.dilation, s.pad_left, s.W);
                if (w < 0) continue;
                const T* wk = tap_weights(s, wt, i, j) + b.co0;
                const T* src = x + (((long long)n * s.H + h) * s.W + w) * s.C;
                for (int c = 0; c < s.C; ++c)
                    for (int k = 0; k < b.channels; ++k) acc[k] += src[c] * wk[(long long)c * s.w_row + k];
            }
        }
        T* dst = y + (b.first + p) * s.Cout + b.co0;
        for (int k = 0; k < b.channels; ++k) dst[k] = accumulate ? dst[k] + acc[k] : acc[k];
    }
}

template <class T>
__device__ void weight_grad_task_plain(const ConvShape& s, int vectors, int images_per_chunk, const T* x, const T* dy,
                                       T* partial, long long t) {
    const GradTask g = grad_task_at(s, vectors, t);
    T acc[grad_inputs(1)][CONV_VECTORS * LANES] = {};  // (input channel, output channel): the most of each
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
// (all of them when WHOLE): the tile's sums live in tile_pixels(V) x V registers; each input value is
// broadcast against its tap's and channel's weights. A pixel outside x (padding, dilation, past the
// row's end) reads a row of zeros.
#define ZERO_ROW 4096  // input channels the row of zeros covers; a conv with more takes the plain loop
static const float zero_row[ZERO_ROW] = {};

// acc[p][v] += pixel p's value of each input channel c x the tap's weights of channel c: a tile's inner
// loop. ALONG_ROW: the pixels lie step apart from src[0], which lets GCC address all of them from one
// register (else it advances a pointer a pixel, and the loop is 1.3x slower on AVX-512).
template <int V, bool WHOLE, bool ALONG_ROW, int P = tile_pixels(V)>
__attribute__((always_inline)) static inline void add_tap(vfloat (&acc)[P][V], const float* const (&src)[P],
                                                          long long step, const float* wk, const ConvShape& s,
                                                          const int (&lanes)[V]) {
    for (int c = 0; c < s.C; ++c, wk += s.w_row) {
        // The next tile's pixels follow these along the row: a line of them each channel, asked for now (the
        // hardware's prefetchers follow P streams poorly: a 1x1 conv of 64 channels 1.4-1.6x faster on AVX-512).
        if (ALONG_ROW) __builtin_prefetch(src[0] + P * step + c * LINE_FLOATS);
        vfloat wv[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) wv[v] = load_lanes(wk + v * LANES, WHOLE ? LANES : lanes[v]);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p) {
            const float xp = ALONG_ROW ? src[0][p * step + c] : src[p][c];
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) acc[p][v] += xp * wv[v];
        }
    }
}

// y's tile b = (or += with accumulate) its sums.
template <int V, int P = tile_pixels(V)>
__attribute__((always_inline)) static inline void store_tile(const vfloat (&acc)[P][V], const Tile& b, int accumulate,
                                                             int Cout, float* y, const int (&lanes)[V]) {
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p) {
        if (p >= b.pixels) continue;
        float* dst = y + (b.first + p) * Cout + b.co0;
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) {
            float* d = dst + v * LANES;
            store_lanes(d, accumulate ? load_lanes(d, lanes[v]) + acc[p][v] : acc[p][v], lanes[v]);
        }
    }
}

// A task across rows: every tap, each pixel through its own pointer (a row of zeros where it reads outside x).
template <int V, bool WHOLE, int P = tile_pixels(V)>
__attribute__((always_inline)) static inline void add_taps_each_pixel(vfloat (&acc)[P][V], const ConvShape& s,
                                                                      const Tile& b, const float* x, const float* wt,
                                                                      const int (&lanes)[V]) {
    int n[P], oh[P], ow[P];
    for (int p = 0; p < P; ++p)
        if (p < b.pixels) tile_pixel(s, b, p, &n[p], &oh[p], &ow[p]);
    for (int i = 0; i < s.kh; ++i)
        for (int j = 0; j < s.kw; ++j) {
            const float* src[P];
            for (int p = 0; p < P; ++p) {
                const int h = p < b.pixels ? input_index(oh[p], i, s.stride, s.dilation, s.pad_top, s.H) : -1;
                const int w = h < 0 ? -1 : input_index(ow[p], j, s.stride, s.dilation, s.pad_left, s.W);
                src[p] = w < 0 ? zero_row : x + (((long long)n[p] * s.H + h) * s.W + w) * s.C;
            }
            add_tap<V, WHOLE, false>(acc, src, 0, tap_weights(s, wt, i, j) + b.co0, s, lanes);
        }
}

template <int V, bool WHOLE>
__attribute__((noinline)) static void direct_tile_vector(const ConvShape& s, const Tile& b, int accumulate,
                                                         const float* x, const float* wt, float* y) {
    constexpr int P = tile_pixels(V);
    int lanes[V];
    for (int v = 0; v < V; ++v) lanes[v] = b.channels - v * LANES;
    // Every loop that indexes acc is unrolled (constant bounds and the pragmas): else GCC keeps acc on the
    // stack and stores all of it each step of the inner loop (2x slower).
    vfloat acc[P][V];
#pragma GCC unroll 16
    for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[p][v] = vfloat{};
    if (!b.one_row) {
        add_taps_each_pixel<V, WHOLE>(acc, s, b, x, wt, lanes);
        return store_tile<V>(acc, b, accumulate, s.Cout, y, lanes);
    }
    for (int i = 0; i < s.kh; ++i) {
        const int h = input_index(b.oh, i, s.stride, s.dilation, s.pad_top, s.H);
        if (h < 0) continue;
        const float* x_row = x + ((long long)b.n * s.H + h) * s.W * s.C;
        for (int j = 0; j < s.kw; ++j) {
            const float* wk = tap_weights(s, wt, i, j) + b.co0;
            const float* src[P];
            // Every pixel inside x (its first and last columns are, and no dilation): one pointer serves.
            const int first = b.ow0 * s.stride - s.pad_left + j, last = first + (P - 1) * s.stride;
            if (s.dilation == 1 && b.pixels == P && first >= 0 && last < s.W) {
                src[0] = x_row + (long long)first * s.C;
                add_tap<V, WHOLE, true>(acc, src, (long long)s.stride * s.C, wk, s, lanes);
                continue;
            }
            for (int p = 0; p < P; ++p) {
                const int w = input_index(b.ow0 + p, j, s.stride, s.dilation, s.pad_left, s.W);
                src[p] = w >= 0 && p < b.pixels ? x_row + (long long)w * s.C : zero_row;
            }
            add_tap<V, WHOLE, false>(acc, src, 0, wk, s, lanes);
        }
    }
    store_tile<V>(acc, b, accumulate, s.Cout, y, lanes);
}

// acc[c][v] += x's input channel c x dy's output channels, over `count` pixels that lie x_step apart in x
// and Cout apart in dy: a weight-gradient task's inner loop. WHOLE: every input channel and lane is the
// task's; else offset names the channel each row reads (its last one for the missing ones).
template <int V, bool WHOLE, int I = grad_inputs(V)>
__attribute__((always_inline)) static inline void add_pixels(vfloat (&acc)[I][V], const float* xs, const float* ds,
                                                             int count, long long x_step, const ConvShape& s,
                                                             const int (&offset)[I], const int (&lanes)[V]) {
    for (int k = 0; k < count; ++k, xs += x_step, ds += s.Cout) {
        // 8 pixels ahead: x's pixels lie C floats apart, a 4 KiB page every few of them, and the hardware's
        // prefetchers stop at each page's end (1.1x faster on AVX-512 and AVX2).
        __builtin_prefetch(xs + PREFETCH_PIXELS * x_step);
        __builtin_prefetch(ds + PREFETCH_PIXELS * s.Cout);
        vfloat dv[V];
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) dv[v] = load_lanes(ds + v * LANES, WHOLE ? LANES : lanes[v]);
#pragma GCC unroll 16
        for (int c = 0; c < I; ++c)
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) acc[c][v] += xs[WHOLE ? c : offset[c]] * dv[v];
    }
}

// As weight_grad_task_plain: grad_inputs(V) x V registers, a row per input channel holding its output
// channels. A block of fewer input channels (C = 3) computes the missing ones from its last channel and
// does not store them. The pixels are added in the plain loop's order, in runs: a row of outputs, or, where
// the tap reads x's rows whole and in place (stride 1, the tap at the padding's offset: every tap of a 1x1
// conv), an image's rows, or the chunk's images, as one run.
template <int V>
__attribute__((noinline)) static void weight_grad_task_vector(const ConvShape& s, int images_per_chunk, const float* x,
                                                              const float* dy, float* partial, long long t) {
    constexpr int I = grad_inputs(V);
    const GradTask g = grad_task_at(s, V, t);
    int offset[I], lanes[V];
    vfloat acc[I][V];  // unrolled wherever indexed, to stay in registers
    for (int c = 0; c < I; ++c) offset[c] = c < g.cn ? c : g.cn - 1;
    for (int v = 0; v < V; ++v) lanes[v] = g.kn - v * LANES;
#pragma GCC unroll 16
    for (int c = 0; c < I; ++c)
#pragma GCC unroll 4
        for (int v = 0; v < V; ++v) acc[c][v] = vfloat{};
    const bool whole = g.cn == I && g.kn == V * LANES;
    const long long x_step = (long long)s.stride * s.C;
    const int n0 = g.chunk * images_per_chunk, n_end = min_int(n0 + images_per_chunk, s.N);
    const int rows = g.oh_hi - g.oh_lo, cols = g.ow_hi - g.ow_lo;
    const bool rows_join = s.stride == 1 && s.W == s.Wo && cols == s.Wo;
    const bool images_join = rows_join && s.H == s.Ho && rows == s.Ho;
    const int run = images_join ? (n_end - n0) * rows * cols : rows_join ? rows * cols : cols;
    for (int n = n0; n < n_end; n += images_join ? n_end - n0 : 1)
        for (int oh = g.oh_lo; oh < g.oh_hi; oh += rows_join ? rows : 1) {
            const float* xs = x + (((long long)n * s.H + oh * s.stride - s.pad_top + g.i) * s.W +
                                   g.ow_lo * s.stride - s.pad_left + g.j) * s.C + g.c0;
            const float* ds = dy + (((long long)n * s.Ho + oh) * s.Wo + g.ow_lo) * s.Cout + g.co0;
            if (whole)
                add_pixels<V, true>(acc, xs, ds, run, x_step, s, offset, lanes);
            else
                add_pixels<V, false>(acc, xs, ds, run, x_step, s, offset, lanes);
        }
#pragma GCC unroll 16
    for (int c = 0; c < I; ++c)
        if (c < g.cn)
#pragma GCC unroll 4
            for (int v = 0; v < V; ++v) store_lanes(partial + grad_offset(s, g, c) + v * LANES, acc[c][v], lanes[v]);
}

#pragma GCC pop_options

static inline void direct_tile(const ConvShape& s, int vectors, const Tile& b, int accumulate, const float* x,
                               const float* wt, float* y) {
    static_assert(CONV_VECTORS == 2, "direct_tile instantiates the vector tile for 1 and 2 vectors");
    if (s.C > ZERO_ROW) return direct_tile_plain(s, b, accumulate, x, wt, y);
    const bool whole = b.channels == vectors * LANES;  // every lane a channel: all but a last, partial block
    if (vectors == 1)
        whole ? direct_tile_vector<1, true>(s, b, accumulate, x, wt, y)
              : direct_tile_vector<1, false>(s, b, accumulate, x, wt, y);
    else
        whole ? direct_tile_vector<2, true>(s, b, accumulate, x, wt, y)
              : direct_tile_vector<2, false>(s, b, accumulate, x, wt, y);
}

static inline void weight_grad_task(const ConvShape& s, int vectors, int images_per_chunk, const float* x,
                                    const float* dy, float* partial, long long t) {
    static_assert(CONV_VECTORS == 2, "weight_grad_task instantiates the vector task for 1 and 2 vectors");
    vectors == 1 ? weight_grad_task_vector<1>(s, images_per_chunk, x, dy, partial, t)
                 : weight_grad_task_vector<2>(s, images_per_chunk, x, dy, partial, t);
}
#endif

template <class T>
__device__ __forceinline__ void direct_tile(const ConvShape& s, int vectors, const Tile& b, int accumulate, const T* x,
                                            const T* wt, T* y) {
    direct_tile_plain(s, b, accumulate, x, wt, y);
}

template <class T>
__device__ __forceinline__ void weight_grad_task(const ConvShape& s, int vectors, int images_per_chunk, const T* x,
                                                 const T* dy, T* partial, long long t) {
    weight_grad_task_plain(s, vectors, images_per_chunk, x, dy, partial, t);
}

// y (N, Ho, Wo, Cout) = (or += with accumulate) the convolution of x (N, H, W, C), dilated by dilation,
// with wt (kh, kw, C, Cout), or, flipped (the data gradient), with a conv's own weights wt (C, kh, kw, Cout) read
// with the taps reversed. One thread per task of tile_pixels(vectors) pixels, in tiles of vectors (1 to
// CONV_VECTORS) vectors of LANES channels: ceil(N * Ho * Wo / tile_pixels(vectors)) tasks.
extern "C" __global__ void conv_direct(int N, int H, int W, int C, int kh, int kw, int stride, int dilation,
                                       int pad_top, int pad_left, int Ho, int Wo, int Cout, int vectors,
                                       int accumulate, int flipped, const real_t* x, const real_t* wt, real_t* y) {
    const long long taps = (long long)kh * kw;
    const ConvShape s{N, H, W, C, kh, kw, stride, dilation, pad_top, pad_left, Ho, Wo, Cout,
                      flipped ? Cout : C * (long long)Cout, flipped ? taps * Cout : Cout, flipped != 0};
    vectors = vectors < 1 ? 1 : vectors > CONV_VECTORS ? CONV_VECTORS : vectors;
    const int width = tile_pixels(vectors);
    const long long tasks = ((long long)N * Ho * Wo + width - 1) / width;
    GRID_STRIDE_LOOP(t, tasks)
        for (Tile b = task_at(s, vectors, t); b.co0 < Cout; next_tile(s, vectors, b))
            direct_tile(s, vectors, b, accumulate, x, wt, y);
}

// partial (chunks, kh, kw, C, Cout): chunk q's sum, over its images [q * images_per_chunk, ...) and every
// output pixel, of x[n, oh*stride - pad_top + i, ow*stride - pad_left + j, c] * dy[n, oh, ow, co] (taps
// outside x add nothing). Summed over the chunks it is dL/dw in wt's layout. One thread per task of
// grad_inputs(vectors) input channels x vectors (1 to CONV_VECTORS) vectors of LANES output channels:
// chunks * kh * kw * ceil(C / grad_inputs(vectors)) * ceil(Cout / (vectors * LANES)) of them.
extern "C" __global__ void conv_weight_grad(int N, int H, int W, int C, int kh, int kw, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, int Cout, int vectors, int images_per_chunk,
                                            const real_t* x, const real_t* dy, real_t* partial) {
    const ConvShape s{N, H, W, C, kh, kw, stride, 1, pad_top, pad_left, Ho, Wo, Cout, 0, 0, false};
    vectors = vectors < 1 ? 1 : vectors > CONV_VECTORS ? CONV_VECTORS : vectors;
    const int inputs = grad_inputs(vectors), outputs = vectors * LANES;
    const long long chunks = (N + images_per_chunk - 1) / images_per_chunk;
    const long long tasks = chunks * kh * kw * ((C + inputs - 1) / inputs) * ((Cout + outputs - 1) / outputs);
    GRID_STRIDE_LOOP(t, tasks) weight_grad_task(s, vectors, images_per_chunk, x, dy, partial, t);
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
