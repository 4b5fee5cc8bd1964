// Max and average pooling over NHWC activations, and the reference's parameter-free shortcut
// (average-pool by the stride, zero-pad the channels). NumPy references: minibp/layers.py.
//
// x is (N, H, W, C), y is (N, Ho, Wo, Cy). A k x k window at stride s starts at
// (oh * s - pad_top, ow * s - pad_left); taps outside x are skipped (max) or count as 0 (average,
// which always divides by k*k).
#include "common.cuh"

__device__ __forceinline__ int min_int(int a, int b) { return a < b ? a : b; }

// The first window (index along one axis) that covers padded position p: ceil((p - k + 1) / stride), >= 0.
__device__ __forceinline__ int first_window(int p, int k, int stride) {
    const int a = p - k + 1;
    return a > 0 ? (a + stride - 1) / stride : 0;
}

// One thread per output pixel; the max over the window's valid taps, per channel.
extern "C" __global__ void maxpool_forward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                           int pad_left, int Ho, int Wo, const real_t* x, real_t* y) {
    GRID_STRIDE_LOOP(pixel, (long long)N * Ho * Wo) {
        const int ow = (int)(pixel % Wo), oh = (int)((pixel / Wo) % Ho), n = (int)(pixel / ((long long)Wo * Ho));
        real_t* dst = y + pixel * C;
        bool first = true;
        for (int ki = 0; ki < k; ++ki) {
            const int h = oh * stride - pad_top + ki;
            if (h < 0 || h >= H) continue;
            for (int kj = 0; kj < k; ++kj) {
                const int w = ow * stride - pad_left + kj;
                if (w < 0 || w >= W) continue;
                const real_t* src = x + (((long long)n * H + h) * W + w) * C;
                for (int c = 0; c < C; ++c) dst[c] = (first || src[c] > dst[c]) ? src[c] : dst[c];
                first = false;
            }
        }
    }
}

// The output windows covering input pixel (h, w): rows [*oh_lo, *oh_hi], columns [*ow_lo, *ow_hi].
__device__ __forceinline__ void covering_windows(int h, int w, int k, int stride, int pad_top, int pad_left, int Ho,
                                                 int Wo, int* oh_lo, int* oh_hi, int* ow_lo, int* ow_hi) {
    *oh_lo = first_window(h + pad_top, k, stride);
    *oh_hi = min_int((h + pad_top) / stride, Ho - 1);
    *ow_lo = first_window(w + pad_left, k, stride);
    *ow_hi = min_int((w + pad_left) / stride, Wo - 1);
}

// dx[n, h, w, c] = sum of dy over the windows whose maximum (first in scan order) is at (h, w).
// A gather, one thread per input pixel: it re-finds the argmax of every window that covers it.
extern "C" __global__ void maxpool_backward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, const real_t* x, const real_t* dy,
                                            real_t* dx) {
    GRID_STRIDE_LOOP(pixel, (long long)N * H * W) {
        const int w = (int)(pixel % W), h = (int)((pixel / W) % H), n = (int)(pixel / ((long long)W * H));
        int oh_lo, oh_hi, ow_lo, ow_hi;
        covering_windows(h, w, k, stride, pad_top, pad_left, Ho, Wo, &oh_lo, &oh_hi, &ow_lo, &ow_hi);
        for (int c = 0; c < C; ++c) {
            real_t grad = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh) {
                for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                    const int h0 = oh * stride - pad_top, w0 = ow * stride - pad_left;
                    int best_h = -1, best_w = -1;
                    real_t best = 0;
                    for (int hh = h0 > 0 ? h0 : 0; hh < h0 + k && hh < H; ++hh)
                        for (int ww = w0 > 0 ? w0 : 0; ww < w0 + k && ww < W; ++ww) {
                            const real_t v = x[(((long long)n * H + hh) * W + ww) * C + c];
                            if (best_h < 0 || v > best) { best = v; best_h = hh; best_w = ww; }
                        }
                    if (best_h == h && best_w == w) grad += dy[(((long long)n * Ho + oh) * Wo + ow) * C + c];
                }
            }
            dx[pixel * C + c] = grad;
        }
    }
}

// y[..., c] (= or +=, by accumulate) the k x k average of x for c < C; y[..., c >= C] = 0 (or unchanged
// when accumulating). Cy >= C. With k = stride and accumulate = 1 this is the parameter-free shortcut.
// One thread per output pixel.
extern "C" __global__ void avgpool_forward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                           int pad_left, int Ho, int Wo, int Cy, int accumulate,
                                           const real_t* x, real_t* y) {
    const real_t inv_area = (real_t)1 / (real_t)(k * k);
    GRID_STRIDE_LOOP(pixel, (long long)N * Ho * Wo) {
        const int ow = (int)(pixel % Wo), oh = (int)((pixel / Wo) % Ho), n = (int)(pixel / ((long long)Wo * Ho));
        const int h0 = oh * stride - pad_top, w0 = ow * stride - pad_left;
        real_t* dst = y + pixel * Cy;
        for (int c = 0; c < C; ++c) {
            real_t sum = 0;
            for (int h = h0 > 0 ? h0 : 0; h < h0 + k && h < H; ++h)
                for (int w = w0 > 0 ? w0 : 0; w < w0 + k && w < W; ++w)
                    sum += x[(((long long)n * H + h) * W + w) * C + c];
            dst[c] = accumulate ? dst[c] + sum * inv_area : sum * inv_area;
        }
        if (!accumulate)
            for (int c = C; c < Cy; ++c) dst[c] = 0;
    }
}

// The adjoint: dx[n, h, w, c] (= or +=) sum over the windows covering (h, w) of dy[..., c] / k^2, c < C.
// One thread per input pixel.
extern "C" __global__ void avgpool_backward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, int Cy, int accumulate,
                                            const real_t* dy, real_t* dx) {
    const real_t inv_area = (real_t)1 / (real_t)(k * k);
    GRID_STRIDE_LOOP(pixel, (long long)N * H * W) {
        const int w = (int)(pixel % W), h = (int)((pixel / W) % H), n = (int)(pixel / ((long long)W * H));
        int oh_lo, oh_hi, ow_lo, ow_hi;
        covering_windows(h, w, k, stride, pad_top, pad_left, Ho, Wo, &oh_lo, &oh_hi, &ow_lo, &ow_hi);
        real_t* dst = dx + pixel * C;
        for (int c = 0; c < C; ++c) {
            real_t sum = 0;
            for (int oh = oh_lo; oh <= oh_hi; ++oh)
                for (int ow = ow_lo; ow <= ow_hi; ++ow) sum += dy[(((long long)n * Ho + oh) * Wo + ow) * Cy + c];
            dst[c] = accumulate ? dst[c] + sum * inv_area : sum * inv_area;
        }
    }
}
