// The k-bit activation code of METHOD.md, as device functions shared by every kernel that
// writes or reads a store (quant.cu, bn.cu). Reference: minibp/quant.py (quantize_ref, ...).
//
// v = y / gamma = xhat + b is coded with K = 2^k bins over 6 units (about +-3 sigma):
//     shift = clamp(K/2 - floor(b * K/6), 1, K-1)
//     q     = clamp(floor((v - 1e-6) * K/6) + shift, 0, K-1)
//     vhat  = (q - shift + 0.5) * 6/K,   mask = q >= shift  (v >= 1e-6: zero is a bin edge)
// The reference clamps shift only below (at 1); minibp also caps it at K-1 so that zero stays
// inside the code range for every b and the mask is exact even for b < -(K/2-1)*6/K.
// Everything is float32 arithmetic on exact small integers, so CPU and GPU give the same codes.
#pragma once

// clamp to [lo, hi], NaN -> lo. Written with comparisons rather than fminf/fmaxf, which g++
// turns into library calls unless NaN handling is given up.
__device__ __forceinline__ float clampf(float x, float lo, float hi) {
    x = x > lo ? x : lo;
    return x < hi ? x : hi;
}

__device__ __forceinline__ float quant_scale(int bits) { return (float)(1 << bits) / 6.0f; }  // K/6

__device__ __forceinline__ float quant_shift(float b, int bits) {
    const float K = (float)(1 << bits);
    return clampf(K * 0.5f - floorf(b * quant_scale(bits)), 1.0f, K - 1.0f);
}

__device__ __forceinline__ int quant_code(float v, float shift, int bits) {
    const float q = floorf((v - 1e-6f) * quant_scale(bits)) + shift;
    return (int)clampf(q, 0.0f, (float)((1 << bits) - 1));  // NaN -> code 0
}

// Bin midpoint; 6/K is exact in float for K a power of two.
__device__ __forceinline__ float quant_vhat(int code, float shift, int bits) {
    return ((float)code - shift + 0.5f) * (6.0f / (float)(1 << bits));
}

// Codes are packed 8/k to a byte, the first element in the most significant bits.
__device__ __forceinline__ int quant_unpack(const unsigned char* codes, long long e, int bits) {
    const int per_byte = 8 / bits;
    const int slot = (int)(e % per_byte);
    return (codes[e / per_byte] >> (8 - bits * (slot + 1))) & ((1 << bits) - 1);
}
