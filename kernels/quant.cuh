// The k-bit activation store, defined once for every kernel that writes or reads one: bn.cu (training)
// and tests/quant.cu (the same functions behind tests/quant_kernels.py). NumPy reference: minibp/quant.py.
//
// Each element's v = xhat + b (b = beta/gamma of its channel) is kept as a code q of K = 2^k bins
// (k = BITS = 2, 4, 8) through its channel's window (shift, below, above): shift bins lie below zero,
// `below` and `above` wide. With u = v - MASK_THRESHOLD (1e-6) and width = below if u < 0, else above:
//     q     = clamp(floor(u*(1/width)) + shift, 0, K-1)        the code (NaN -> 0)
//     vhat  = (q - shift + 0.5)*(q < shift ? below : above)    the bin's midpoint
//     mask  = q >= shift                                       (= v >= 1e-6, the ReLU's sign)
//     xhat~ = vhat - b,   a~ = relu(gamma*vhat)                what the backward pass reads
// Under stochastic rounding (`stochastic`) the levels are the bin edges instead, zero a level on each side
// of it (q = shift above, shift - 1 below): vhat = (q - shift)*above at q >= shift, (q - shift + 1)*below
// under it, and a value rounds at random to one of the two levels around it (quant_code_stochastic).
// shift is a whole number, so zero is a bin edge and the mask is exact (under a range window, for the values
// it was taken from: the rows of the batch it codes). u*(1/width), not u/width: for a window of one width,
// the paper's multiplication by its scale, code for code. The windows:
//   fixed (the paper's): one width 6/K, shift = clamp(K/2 - floor(b*K/6), 1, K-1): v within about b +- 3,
//     values beyond clipped to the end bins. The paper's code clamps shift only at 1; the cap at K-1
//     keeps zero inside the code range, so a channel with very negative b keeps its positive values' mask.
//   range: the batch's own [lo, hi] of v in the channel (from its min and max of x), narrowed to
//     b +- clip (per k: minibp/quant.py's RANGE_CLIP), fewer bins below zero than above (quant.py's
//     BELOW_WEIGHT: why); zero may fall outside the codes when the whole channel has one sign (shift <= 0:
//     every mask 1; shift >= K: every mask 0). The block window is the range window of each 256 rows
//     (WINDOW_ROWS; bn.cu's code_windows), its clip BLOCK_CLIP.
// All float32 arithmetic that CPU, GPU and NumPy round alike (no FMA contraction, no fast math). One
// difference stays: CuPy compiles every kernel with -ftz=true, so the GPU flushes subnormal results to zero;
// quant_floor keeps the one place where that would change a code (seen on an H200: docs/gpu.md).
//
// A row of C channels (C a multiple of 8/k) packs into C*k/8 bytes, 8/k codes a byte, the row's first
// element in the most significant bits. Rows are decoded through the codes as numbers in a scratch row
// of real_t: the loops that then use them read plain floats and vectorise on the CPU.
#pragma once

// MASK_THRESHOLD (float) and GAMMA_MIN come from minibp/constants.py, defined on every build's command line.
#ifndef MASK_THRESHOLD
#error "MASK_THRESHOLD comes from minibp/constants.py: build through minibp.kernels"
#endif

// relu that lets NaN through, so that a diverged net shows in its loss.
__device__ __forceinline__ real_t relu(real_t y) { return y <= 0 ? (real_t)0 : y; }

// clamp to [lo, hi], NaN -> lo. Written with comparisons rather than fminf/fmaxf, which g++
// turns into library calls unless NaN handling is given up.
__device__ __forceinline__ float clampf(float x, float lo, float hi) {
    x = x > lo ? x : lo;
    return x < hi ? x : hi;
}

// ----------------------------------------------------------------------------- a channel's window

// floor(x) of a product x = u * scale (or of u * scale + r with a draw r = 0), negative exactly when u is.
// A subnormal x (a tiny u over a wide window), flushed to -0 on the GPU, would floor to 0, across zero's bin
// edge, flipping the mask; a negative x floors to -1 or below, so that is said outright. Where subnormals
// are kept (the CPU, NumPy) it changes nothing.
__device__ __forceinline__ float quant_floor(float x, bool negative) {
    const float f = floorf(x);
    return negative && f > -1.0f ? -1.0f : f;
}

__device__ __forceinline__ void quant_window_fixed(float b, int bits, float* shift, float* below, float* above) {
    const float K = (float)(1 << bits);
    *shift = clampf(K * 0.5f - floorf(b * (K / 6.0f)), 1.0f, K - 1.0f);
    *below = *above = 6.0f / K;
}

// [lo, hi]: the channel's smallest and largest v, first narrowed to b +- clip (xhat within +-clip; clip
// may be infinite), but never across zero, so that the channel's sign (one sign or both) stays what
// the data says and the mask exact. With u = v - 1e-6 (what the code floors), a channel of one sign
// spreads K-1 widths over [u_lo, u_hi] (K bins whatever the grid's offset from zero); one straddling
// zero puts j of the K bins below zero and K-j above, j for the least weight*below^2 + above^2 (weight:
// quant.py's BELOW_WEIGHT): the cost is convex in j, so the scan from j = 1 stops where it stops falling
// (about K/4 steps, each two divisions, where trying every j made the block window's windows 4% of a step).
// Under stochastic rounding the levels are the bins' edges, one fewer a side than bins: the j bins below
// zero span j - 1 widths, the K - j above it K - j - 1 (so j runs from 2 to K-2), and a channel of one sign
// spreads K-2 widths over its range, since its levels are whole widths from zero, wherever the range starts.
// It takes P channels at once, each scanned on its own (P: a piece of at most FINISH_PIECE channels on the CPU,
// whose loops over it vectorise, so the scans run side by side until the last one stops: 0.04 s of a ResNet-164
// step scanned a channel at a time; common.cuh's OneChannel on the GPU). lo, hi, b: the channels' own; shift,
// below, above: their windows.
template <class Count>
__device__ __forceinline__ void quant_window_range(Count P, const float* lo, const float* hi, const float* b,
                                                   float clip, int bits, float weight, bool stochastic, float* shift,
                                                   float* below, float* above) {
    const float K = (float)(1 << bits);
    const float edges = stochastic ? 1.0f : 0.0f;  // the widths a side spans: its bins less this
    const float j_first = 1.0f + edges;
    float u_lo[FINISH_PIECE], u_hi[FINISH_PIECE], cost[FINISH_PIECE], j_best[FINISH_PIECE];
    int falling[FINISH_PIECE], any = 0;  // a channel's scan still falling, and any channel's
    for (int c = 0; c < P; ++c) {
        // not across zero: lo stays below 1e-6 (the mask's threshold) if it was, hi at or above it if it was
        const float lo_clip = b[c] - clip < 0.0f ? b[c] - clip : 0.0f,
                    hi_clip = b[c] + clip > MASK_THRESHOLD ? b[c] + clip : MASK_THRESHOLD;
        u_lo[c] = (lo[c] > lo_clip ? lo[c] : lo_clip) - MASK_THRESHOLD;
        u_hi[c] = (hi[c] < hi_clip ? hi[c] : hi_clip) - MASK_THRESHOLD;
        const bool one_sign = u_lo[c] >= 0.0f || u_hi[c] < 0.0f;
        const float width = (u_hi[c] - u_lo[c]) / (K - 1.0f - edges), b_j = -u_lo[c] / (j_first - edges),
                    a_j = u_hi[c] / (K - j_first - edges);
        below[c] = one_sign ? width : b_j, above[c] = one_sign ? width : a_j;
        cost[c] = weight * b_j * b_j + a_j * a_j, j_best[c] = j_first;
        falling[c] = !one_sign, any |= falling[c];
    }
    for (float j = j_first + 1.0f; any && j < K - edges; j += 1.0f) {
        any = 0;
        for (int c = 0; c < P; ++c) {
            const float b_j = -u_lo[c] / (j - edges), a_j = u_hi[c] / (K - j - edges),
                        cost_j = weight * b_j * b_j + a_j * a_j;
            falling[c] = falling[c] && cost_j < cost[c];  // (NaN: the first j ends the scan)
            cost[c] = falling[c] ? cost_j : cost[c], j_best[c] = falling[c] ? j : j_best[c];
            below[c] = falling[c] ? b_j : below[c], above[c] = falling[c] ? a_j : above[c];
            any |= falling[c];
        }
    }
    for (int c = 0; c < P; ++c) {
        // a floor keeps |u|/width + K within float32's whole numbers, 2^24 (a constant channel has no spread)
        const float magnitude = -u_lo[c] > u_hi[c] ? -u_lo[c] : u_hi[c], least = magnitude * 9.5367431640625e-7f;
        float width_below = below[c] > least ? below[c] : least, width_above = above[c] > least ? above[c] : least;
        width_below = width_below > 1e-30f ? width_below : 1e-30f;
        width_above = width_above > 1e-30f ? width_above : 1e-30f;
        below[c] = width_below, above[c] = width_above;
        const float scale = 1.0f / width_below;  // one sign: the two widths are one
        const bool one_sign = u_lo[c] >= 0.0f || u_hi[c] < 0.0f;
        shift[c] = !one_sign ? j_best[c]
                   : u_lo[c] >= 0.0f ? -floorf(u_lo[c] * scale)
                                     : K - 1.0f - quant_floor(u_hi[c] * scale, true);
    }
}

// ----------------------------------------------------------------------------- one value

// q as a float (an exact integer), the form the scratch rows hold. The caller passes the scales 1/below and
// 1/above (as floats): a window keeps its two widths (what decoding reads) and no scales, so it stays three
// values a channel; a GPU thread divides per value, the CPU once per channel of a wide row (bn.cu).
__device__ __forceinline__ float quant_code(float v, float shift, float scale_below, float scale_above, int bits) {
    const float u = v - MASK_THRESHOLD;
    return clampf(quant_floor(u * (u < 0.0f ? scale_below : scale_above), u < 0.0f) + shift, 0.0f,
                  (float)((1 << bits) - 1));
}

// ----------------------------------------------------------------------------- stochastic rounding

// A counter-based hash of 32 bits (two multiply-xorshift rounds, Wellons' "lowbias32"): no state, so
// element i's draw is the same on every device, launch shape, rank count and resume.
__device__ __forceinline__ unsigned int quant_mix32(unsigned int h) {
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h;
}

// splitmix64's finaliser: the hash quant_rounding_key chains.
__device__ __forceinline__ unsigned long long quant_splitmix64(unsigned long long x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

// The key of one unit's stochastic rounding in one training forward pass (quant.py's rounding_key): a hash of the
// run's seed (seed_hash = splitmix64(seed), taken once), the draw (which forward pass) and the unit's index. The
// draw is read on the device, so one recorded pass serves every step.
__device__ __forceinline__ long long quant_rounding_key(long long seed_hash, long long draw, int unit) {
    return (long long)quant_splitmix64(quant_splitmix64((unsigned long long)seed_hash ^ (unsigned long long)draw) ^
                                       (unsigned long long)(long long)unit);
}

// The hash of (key, row): mixed once a row, then once a channel (quant_uniform).
__device__ __forceinline__ unsigned int quant_row_hash(long long key, long long row) {
    const unsigned long long k = (unsigned long long)key, r = (unsigned long long)row;
    return quant_mix32(quant_mix32((unsigned int)k ^ (unsigned int)r) ^ (unsigned int)(k >> 32) ^
                       (unsigned int)(r >> 32));
}

// Element (row, c)'s uniform draw in [0, 1): 24 bits of the hash, exact in float32.
__device__ __forceinline__ float quant_uniform(unsigned int row_hash, int c) {
    return (float)(quant_mix32(row_hash ^ (unsigned int)c) >> 8) * 5.9604644775390625e-8f;  // 2^-24
}

// The code of v rounded at random to one of the two levels (bin edges, zero among them on each side) around
// it, with the probabilities that make E[vhat] = u (u = v - 1e-6): the level floor(u/width + r) widths from zero,
// code d + shift with d = floor(u/width + r) above zero and floor(u/width + r) - 1 below (zero's code there is
// shift - 1). d never crosses zero, so the mask stays exact: u/width + r lies in [0, 1 + u/width) above zero and
// below 1 under it (r < 1), so d >= 0 above and d <= -1 below; the clamp to the K codes (a clipped window's
// clip) is the only bias (docs/method.md). NaN -> 0, and the scales, as quant_code.
__device__ __forceinline__ float quant_code_stochastic(float v, float shift, float scale_below, float scale_above,
                                                       int bits, float r) {
    const float u = v - MASK_THRESHOLD;
    const bool negative = u < 0.0f;
    const float d = quant_floor(u * (negative ? scale_below : scale_above) + r, negative && r == 0.0f) -
                    (negative ? 1.0f : 0.0f);
    return clampf(d + shift, 0.0f, (float)((1 << bits) - 1));
}

// The level of code q: its bin's midpoint, or under stochastic rounding its bin's edge nearer zero.
__device__ __forceinline__ float quant_vhat(float q, float shift, float below, float above, bool stochastic) {
    return q < shift ? (q - shift + (stochastic ? 1.0f : 0.5f)) * below
                     : (q - shift + (stochastic ? 0.0f : 0.5f)) * above;
}

__device__ __forceinline__ bool quant_mask(float q, float shift) { return q >= shift; }

__device__ __forceinline__ real_t quant_xhat(float q, float shift, float below, float above, bool stochastic,
                                             real_t b) {
    return (real_t)quant_vhat(q, shift, below, above, stochastic) - b;
}

// a~; zero where the mask is (gamma > 0), and at the level zero above it under stochastic rounding.
__device__ __forceinline__ real_t quant_restore(float q, float shift, float below, float above, bool stochastic,
                                                real_t gamma) {
    return relu(gamma * (real_t)quant_vhat(q, shift, below, above, stochastic));
}

// ----------------------------------------------------------------------------- packed rows

// Where code t of a byte sits: t = 0, the row's first element, in the most significant bits.
template <int BITS>
__device__ __forceinline__ int quant_offset(int t) { return 8 - BITS * (t + 1); }

template <int BITS>
__device__ __forceinline__ int quant_slot(int byte, int t) {
    return (byte >> quant_offset<BITS>(t)) & ((1 << BITS) - 1);
}

// The byte of the 8/BITS codes held as numbers in q[0 .. 8/BITS).
template <int BITS>
__device__ __forceinline__ unsigned char quant_pack_byte(const real_t* q) {
    int byte = 0;
    for (int t = 0; t < 8 / BITS; ++t) byte |= (int)q[t] << quant_offset<BITS>(t);
    return (unsigned char)byte;
}

// q[0 .. C) <- the codes of a packed row, as numbers.
template <int BITS>
__device__ void quant_unpack_row(const unsigned char* codes, real_t* q, int C) {
    constexpr int per_byte = 8 / BITS;
    for (int j = 0; j < C / per_byte; ++j)
        for (int t = 0; t < per_byte; ++t) q[j * per_byte + t] = (real_t)quant_slot<BITS>(codes[j], t);
}
