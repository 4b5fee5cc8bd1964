// NHWC convolution by im2col / col2im, with the GEMM itself through xp.matmul (BLAS / cuBLAS): the
// reference path of Conv2D (minibp/layers/conv.py), and the GPU's. NumPy references: layers/conv.py (im2col_ref,
// col2im_ref). The CPU's float32 fast path, direct kernels with no col matrix, is kernels/conv_direct.cu.
// x is (N, H, W, C); col is (N*Ho*Wo, kh*kw*C) with C fastest, matching weights (kh, kw, C, Cout)
// reshaped to (kh*kw*C, Cout). pad_top/pad_left place the window; rows or columns outside x read 0.
#include "common.cuh"

// One thread per (output pixel, kernel tap): copies C contiguous channels.
extern "C" __global__ void im2col(int N, int H, int W, int C, int kh, int kw, int stride, int pad_top,
                                  int pad_left, int Ho, int Wo, const real_t* x, real_t* col) {
    const long long taps = (long long)kh * kw;
    GRID_STRIDE_LOOP(i, (long long)N * Ho * Wo * taps) {
        const long long pixel = i / taps;
        const int tap = (int)(i % taps);
        const int ow = (int)(pixel % Wo), oh = (int)((pixel / Wo) % Ho), n = (int)(pixel / ((long long)Wo * Ho));
        const int h = oh * stride - pad_top + tap / kw, w = ow * stride - pad_left + tap % kw;
        real_t* dst = col + i * C;
        if (h < 0 || h >= H || w < 0 || w >= W) {
            for (int c = 0; c < C; ++c) dst[c] = 0;
        } else {
            const real_t* src = x + (((long long)n * H + h) * W + w) * C;
            for (int c = 0; c < C; ++c) dst[c] = src[c];
        }
    }
}

// The adjoint of im2col: dx[n, h, w, :] (= or +=, by accumulate) the sum of the col entries that read
// x[n, h, w, :].
// A gather (one thread per input pixel) rather than a scatter, so no atomics and a fixed order.
extern "C" __global__ void col2im(int N, int H, int W, int C, int kh, int kw, int stride, int pad_top,
                                  int pad_left, int Ho, int Wo, int accumulate, const real_t* col, real_t* dx) {
    GRID_STRIDE_LOOP(pixel, (long long)N * H * W) {
        const int w = (int)(pixel % W), h = (int)((pixel / W) % H), n = (int)(pixel / ((long long)W * H));
        real_t* dst = dx + pixel * C;
        if (!accumulate)
            for (int c = 0; c < C; ++c) dst[c] = 0;
        for (int ki = 0; ki < kh; ++ki) {
            const int oh_s = h + pad_top - ki;
            if (oh_s < 0 || oh_s % stride) continue;
            const int oh = oh_s / stride;
            if (oh >= Ho) continue;
            for (int kj = 0; kj < kw; ++kj) {
                const int ow_s = w + pad_left - kj;
                if (ow_s < 0 || ow_s % stride) continue;
                const int ow = ow_s / stride;
                if (ow >= Wo) continue;
                const real_t* src = col + ((((long long)n * Ho + oh) * Wo + ow) * kh * kw + ki * kw + kj) * C;
                for (int c = 0; c < C; ++c) dst[c] += src[c];
            }
        }
    }
}

// dbias (C,) = (+= with accumulate) the sum over the rows of dy (rows, C), added in order: one thread per channel.
// (0 + sum, not sum: what a zeroed gradient and accumulate give, a negative zero included.)
extern "C" __global__ void bias_grad(long long rows, int C, int accumulate, const real_t* dy, real_t* dbias) {
    GRID_STRIDE_LOOP(c, C) {
        real_t sum = 0;
        for (long long r = 0; r < rows; ++r) sum += dy[r * C + c];
        dbias[c] = (accumulate ? dbias[c] : (real_t)0) + sum;
    }
}
