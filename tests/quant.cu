// The k-bit store of (M, C) values v, through quant.cuh's functions, the ones the training kernels
// (bn.cu) use: tests/quant_kernels.py's wrappers, for the tests and bench/quant.py.
// window is (3, C): each channel's shift, below and above, as one block of a unit's windows in bn.cu.
// n_bytes = M*C*k/8, the size of the codes. A thread takes one row at a time, in blocks of up to
// BLOCK_C channels whose codes go through a local scratch block as numbers, as bn.cu's go through a
// row of its output: the loops over a block vectorise on the CPU. They round to the nearest level (the bins'
// midpoints); stochastic rounding's store is tested through bn.cu's kernels.
#include "common.cuh"
#include "quant.cuh"

constexpr int BLOCK_C = 64;  // a multiple of 8/k, as C is: blocks are whole bytes

// window (3, C) of each channel: the fixed window of b (range = 0) or the range window of [lo, hi] narrowed
// to b +- clip, its bins split at zero by below_weight (range = 1).
extern "C" __global__ void channel_window(int C, int bits, int range, float clip, float below_weight,
                                          const real_t* b, const real_t* lo, const real_t* hi, real_t* window) {
    GRID_STRIDE_LOOP(c, C) {
        float shift, below, above;
        if (range) {
            const float lo_c = (float)lo[c], hi_c = (float)hi[c], b_c = (float)b[c];
            quant_window_range(OneChannel(), &lo_c, &hi_c, &b_c, clip, bits, below_weight, /*stochastic=*/false,
                               &shift, &below, &above);
        } else {
            quant_window_fixed((float)b[c], bits, &shift, &below, &above);
        }
        window[c] = shift, window[C + c] = below, window[2 * C + c] = above;
    }
}

template <int BITS>
__device__ void quantize_rows(long long rows, int C, const real_t* v, const real_t* window, unsigned char* codes) {
    GRID_STRIDE_LOOP(r, rows) {
        for (int c0 = 0; c0 < C; c0 += BLOCK_C) {
            const int n = C - c0 < BLOCK_C ? C - c0 : BLOCK_C;
            const real_t* v_block = v + r * C + c0;
            real_t q[BLOCK_C];
            for (int c = 0; c < n; ++c)
                q[c] = quant_code((float)v_block[c], (float)window[c0 + c], 1.0f / (float)window[C + c0 + c],
                                  1.0f / (float)window[2 * C + c0 + c], BITS);
            for (int j = 0; j < n / (8 / BITS); ++j)
                codes[(r * C + c0) / (8 / BITS) + j] = quant_pack_byte<BITS>(q + j * (8 / BITS));
        }
    }
}

// codes (n_bytes,) <- the codes of v (M, C).
extern "C" __global__ void quantize(long long n_bytes, int C, int bits, const real_t* v, const real_t* window,
                                    unsigned char* codes) {
    const long long rows = n_bytes * (8 / bits) / C;
    if (bits == 2) quantize_rows<2>(rows, C, v, window, codes);
    if (bits == 4) quantize_rows<4>(rows, C, v, window, codes);
    if (bits == 8) quantize_rows<8>(rows, C, v, window, codes);
}

template <int BITS>
__device__ void dequantize_rows(long long rows, int C, const unsigned char* codes, const real_t* window,
                                const real_t* b, const real_t* gamma, real_t* xhat, real_t* a, unsigned char* mask) {
    GRID_STRIDE_LOOP(r, rows) {
        for (int c0 = 0; c0 < C; c0 += BLOCK_C) {
            const int n = C - c0 < BLOCK_C ? C - c0 : BLOCK_C;
            const long long e0 = r * C + c0;
            real_t q[BLOCK_C];
            quant_unpack_row<BITS>(codes + e0 / (8 / BITS), q, n);
            for (int c = 0; c < n; ++c) {
                const float shift = (float)window[c0 + c], below = (float)window[C + c0 + c],
                            above = (float)window[2 * C + c0 + c];
                if (xhat) xhat[e0 + c] = quant_xhat((float)q[c], shift, below, above, /*stochastic=*/false, b[c0 + c]);
                if (a) a[e0 + c] = quant_restore((float)q[c], shift, below, above, /*stochastic=*/false, gamma[c0 + c]);
                if (mask) mask[e0 + c] = (unsigned char)quant_mask((float)q[c], shift);
            }
        }
    }
}

// xhat~, a~ and mask (each (M, C), any of them null when not wanted) of the codes (n_bytes,) of (M, C) values.
extern "C" __global__ void dequantize(long long n_bytes, int C, int bits, const unsigned char* codes,
                                      const real_t* window, const real_t* b, const real_t* gamma, real_t* xhat,
                                      real_t* a, unsigned char* mask) {
    const long long rows = n_bytes * (8 / bits) / C;
    if (bits == 2) dequantize_rows<2>(rows, C, codes, window, b, gamma, xhat, a, mask);
    if (bits == 4) dequantize_rows<4>(rows, C, codes, window, b, gamma, xhat, a, mask);
    if (bits == 8) dequantize_rows<8>(rows, C, codes, window, b, gamma, xhat, a, mask);
}
