// The k-bit activation store, defined once for every kernel that writes or reads one: bn.cu (training)
// and quant.cu (the same functions behind minibp/quant.py). NumPy reference: minibp/quant.py.
//
// Each element's v = xhat + b (b = beta/gamma of its channel) is kept as a code q of K = 2^k bins of
// width 6/K (k = BITS = 2, 4, 8):
//     shift = clamp(K/2 - floor(b*K/6), 1, K-1)              per channel
//     q     = clamp(floor((v - 1e-6)*K/6) + shift, 0, K-1)   the code (NaN -> 0)
//     vhat  = (q - shift + 0.5)*6/K                          the bin's midpoint
//     mask  = q >= shift                                     (= v >= 1e-6, the ReLU's sign)
//     xhat~ = vhat - b,   a~ = relu(gamma*vhat)              what the backward pass reads
// The paper's reference code clamps shift only at 1. The cap at K-1 keeps zero a bin edge inside the
// code range, so the mask is exact for every b: without it a channel with b < -(K/2-1)*6/K has zero
// above the top code, and every positive v loses its mask bit.
// It is all float32 arithmetic on small integers and 6/K, which are exact, so CPU and GPU agree bit for bit.
//
// A row of C channels (C a multiple of 8/k) packs into C*k/8 bytes, 8/k codes a byte, the row's first
// element in the most significant bits. Rows are decoded through the codes as numbers in a scratch row
// of real_t: the loops that then use them read plain floats and vectorise on the CPU.
#pragma once

// relu that lets NaN through, so that a diverged net shows in its loss.
__device__ __forceinline__ real_t relu(real_t y) { return y <= 0 ? (real_t)0 : y; }

// clamp to [lo, hi], NaN -> lo. Written with comparisons rather than fminf/fmaxf, which g++
// turns into library calls unless NaN handling is given up.
__device__ __forceinline__ float clampf(float x, float lo, float hi) {
    x = x > lo ? x : lo;
    return x < hi ? x : hi;
}

// ----------------------------------------------------------------------------- one value

__device__ __forceinline__ float quant_shift(float b, int bits) {
    const float K = (float)(1 << bits);
    return clampf(K * 0.5f - floorf(b * (K / 6.0f)), 1.0f, K - 1.0f);
}

// q as a float (an exact integer), the form the scratch rows hold.
__device__ __forceinline__ float quant_code(float v, float shift, int bits) {
    const float K = (float)(1 << bits);
    return clampf(floorf((v - 1e-6f) * (K / 6.0f)) + shift, 0.0f, K - 1.0f);
}

__device__ __forceinline__ float quant_vhat(float q, float shift, int bits) {
    return (q - shift + 0.5f) * (6.0f / (float)(1 << bits));
}

__device__ __forceinline__ bool quant_mask(float q, float shift) { return q >= shift; }

__device__ __forceinline__ real_t quant_xhat(float q, float shift, real_t b, int bits) {
    return (real_t)quant_vhat(q, shift, bits) - b;
}

// a~; zero exactly where the mask is (gamma > 0).
__device__ __forceinline__ real_t quant_restore(float q, float shift, real_t gamma, int bits) {
    return relu(gamma * (real_t)quant_vhat(q, shift, bits));
}

// ----------------------------------------------------------------------------- packed rows

// Where code t of a byte sits: t = 0, the row's first element, in the most significant bits.
template <int BITS>
__device__ __forceinline__ int quant_offset(int t) { return 8 - BITS * (t + 1); }

template <int BITS>
__device__ __forceinline__ int quant_slot(int byte, int t) {
    return (byte >> quant_offset<BITS>(t)) & ((1 << BITS) - 1);
}

// codes[0 .. C*BITS/8) <- the codes held as numbers in q[0 .. C).
template <int BITS>
__device__ void quant_pack_row(const real_t* q, unsigned char* codes, int C) {
    constexpr int per_byte = 8 / BITS;
    for (int j = 0; j < C / per_byte; ++j) {
        int byte = 0;
        for (int t = 0; t < per_byte; ++t) byte |= (int)q[j * per_byte + t] << quant_offset<BITS>(t);
        codes[j] = (unsigned char)byte;
    }
}

// q[0 .. C) <- the codes of a packed row, as numbers.
template <int BITS>
__device__ void quant_unpack_row(const unsigned char* codes, real_t* q, int C) {
    constexpr int per_byte = 8 / BITS;
    for (int j = 0; j < C / per_byte; ++j)
        for (int t = 0; t < per_byte; ++t) q[j * per_byte + t] = (real_t)quant_slot<BITS>(codes[j], t);
}

// The code of element c of a packed row, for loops with no row of scratch to unpack into.
template <int BITS>
__device__ __forceinline__ float quant_code_at(const unsigned char* codes, int c) {
    return (float)quant_slot<BITS>(codes[c / (8 / BITS)], c % (8 / BITS));
}
