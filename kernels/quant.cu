// Pack and unpack the k-bit store (k = 2, 4, 8) of NHWC activations. One fused pass each way.
// The code itself is defined in quant.cuh; the NumPy references are minibp/quant.py's *_ref.
#include "common.cuh"
#include "quant.cuh"

// codes[j] <- the codes of v[j*8/k .. j*8/k + 8/k - 1]; v is (M, C) with C a multiple of 8/k,
// so one byte never straddles two pixels. b is (C,), codes is (M*C*k/8,).
extern "C" __global__ void quantize(long long n_bytes, int C, int bits, const real_t* v, const real_t* b,
                                    unsigned char* codes) {
    const int per_byte = 8 / bits;
    GRID_STRIDE_LOOP(j, n_bytes) {
        const long long e0 = j * per_byte;
        const int c0 = (int)(e0 % C);
        int byte = 0;
        for (int t = 0; t < per_byte; ++t) {
            const float shift = quant_shift((float)b[c0 + t], bits);
            byte = (byte << bits) | quant_code((float)v[e0 + t], shift, bits);
        }
        codes[j] = (unsigned char)byte;
    }
}

// From the codes of (M, C) values: xhat~ = vhat - b, a~ = relu(gamma * vhat), mask = q >= shift.
// Any output may be null (not wanted). One thread per byte of codes, like quantize.
extern "C" __global__ void dequantize(long long n_bytes, int C, int bits, const unsigned char* codes,
                                      const real_t* b, const real_t* gamma, real_t* xhat, real_t* a,
                                      unsigned char* mask) {
    const int per_byte = 8 / bits;
    const int code_mask = (1 << bits) - 1;
    GRID_STRIDE_LOOP(j, n_bytes) {
        const long long e0 = j * per_byte;
        const int c0 = (int)(e0 % C);
        const int byte = codes[j];
        for (int t = 0; t < per_byte; ++t) {
            const int c = c0 + t;
            const float shift = quant_shift((float)b[c], bits);
            const int code = (byte >> (8 - bits * (t + 1))) & code_mask;
            const real_t vhat = (real_t)quant_vhat(code, shift, bits);
            const bool on = code >= shift;  // the ReLU mask
            if (xhat) xhat[e0 + t] = vhat - b[c];
            const real_t y = gamma[c] * vhat;
            if (a) a[e0 + t] = y > 0 ? y : (real_t)0;  // relu(gamma * vhat): zero exactly where the mask is
            if (mask) mask[e0 + t] = (unsigned char)on;
        }
    }
}
