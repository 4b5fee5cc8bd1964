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

// dx[n, h, w, c] = sum of dy over the windows whose maximum (first in scan order) is at (h, w).
// A gather: each input pixel re-finds the argmax of every window that covers it.
extern "C" __global__ void maxpool_backward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, const real_t* x, const real_t* dy,
                                            real_t* dx) {
    GRID_STRIDE_LOOP(i, (long long)N * H * W * C) {
        const int c = (int)(i % C);
        const long long pixel = i / C;
        const int w = (int)(pixel % W), h = (int)((pixel / W) % H), n = (int)(pixel / ((long long)W * H));
        real_t grad = 0;
        // the windows covering row h: oh * stride - pad_top <= h < oh * stride - pad_top + k
        const int oh_lo = first_window(h + pad_top, k, stride), oh_hi = min_int((h + pad_top) / stride, Ho - 1);
        const int ow_lo = first_window(w + pad_left, k, stride), ow_hi = min_int((w + pad_left) / stride, Wo - 1);
        for (int oh = oh_lo; oh <= oh_hi; ++oh) {
            const int h0 = oh * stride - pad_top;
            for (int ow = ow_lo; ow <= ow_hi; ++ow) {
                const int w0 = ow * stride - pad_left;
                int best_h = -1, best_w = -1;  // the window's argmax, first in scan order
                real_t best = 0;
                for (int ki = 0; ki < k; ++ki) {
                    const int hh = h0 + ki;
                    if (hh < 0 || hh >= H) continue;
                    for (int kj = 0; kj < k; ++kj) {
                        const int ww = w0 + kj;
                        if (ww < 0 || ww >= W) continue;
                        const real_t v = x[(((long long)n * H + hh) * W + ww) * C + c];
                        if (best_h < 0 || v > best) { best = v; best_h = hh; best_w = ww; }
                    }
                }
                if (best_h == h && best_w == w) grad += dy[(((long long)n * Ho + oh) * Wo + ow) * C + c];
            }
        }
        dx[i] = grad;
    }
}

// y[..., c] (= or +=, by accumulate) the k x k average of x for c < C; y[..., c >= C] = 0 (or unchanged
// when accumulating). Cy >= C. With k = stride and accumulate = 1 this is the parameter-free shortcut.
extern "C" __global__ void avgpool_forward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                           int pad_left, int Ho, int Wo, int Cy, int accumulate,
                                           const real_t* x, real_t* y) {
    const real_t inv_area = (real_t)1 / (real_t)(k * k);
    GRID_STRIDE_LOOP(i, (long long)N * Ho * Wo * Cy) {
        const int c = (int)(i % Cy);
        const long long pixel = i / Cy;
        const int ow = (int)(pixel % Wo), oh = (int)((pixel / Wo) % Ho), n = (int)(pixel / ((long long)Wo * Ho));
        real_t sum = 0;
        if (c < C) {
            for (int ki = 0; ki < k; ++ki) {
                const int h = oh * stride - pad_top + ki;
                if (h < 0 || h >= H) continue;
                for (int kj = 0; kj < k; ++kj) {
                    const int w = ow * stride - pad_left + kj;
                    if (w >= 0 && w < W) sum += x[(((long long)n * H + h) * W + w) * C + c];
                }
            }
        }
        y[i] = accumulate ? y[i] + sum * inv_area : sum * inv_area;
    }
}

// The adjoint: dx[n, h, w, c] (= or +=) sum over the windows covering (h, w) of dy[..., c] / k^2, c < C.
extern "C" __global__ void avgpool_backward(int N, int H, int W, int C, int k, int stride, int pad_top,
                                            int pad_left, int Ho, int Wo, int Cy, int accumulate,
                                            const real_t* dy, real_t* dx) {
    const real_t inv_area = (real_t)1 / (real_t)(k * k);
    GRID_STRIDE_LOOP(i, (long long)N * H * W * C) {
        const int c = (int)(i % C);
        const long long pixel = i / C;
        const int w = (int)(pixel % W), h = (int)((pixel / W) % H), n = (int)(pixel / ((long long)W * H));
        real_t sum = 0;
        for (int ki = 0; ki < k; ++ki) {
            const int oh_s = h + pad_top - ki;
            if (oh_s < 0 || oh_s % stride || oh_s / stride >= Ho) continue;
            for (int kj = 0; kj < k; ++kj) {
                const int ow_s = w + pad_left - kj;
                if (ow_s < 0 || ow_s % stride || ow_s / stride >= Wo) continue;
                sum += dy[(((long long)n * Ho + oh_s / stride) * Wo + ow_s / stride) * Cy + c];
            }
        }
        dx[i] = accumulate ? dx[i] + sum * inv_area : sum * inv_area;
    }
}
