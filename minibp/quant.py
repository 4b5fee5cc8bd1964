"""The k-bit activation store: each unit keeps k-bit codes of v = xhat + b instead of its activations.

For NHWC activations viewed as (M, C), b_c = beta_c / gamma_c per channel, K = 2^k bins of width 6/K:

    shift_c = clamp(K/2 - floor(b_c * K/6), 1, K-1)
    q       = clamp(floor((v - 1e-6) * K/6) + shift_c, 0, K-1)    the stored code (NaN -> 0)
    vhat    = (q - shift_c + 0.5) * 6/K                            the bin's midpoint
    mask    = q >= shift_c            (= v >= 1e-6 in float32: the ReLU's mask is exact)
    xhat~   = vhat - b_c,   a~ = relu(gamma_c * vhat)              what the backward pass reads

The paper's reference code clamps shift only at 1; minibp also caps it at K-1, so zero stays a bin
edge inside the code range for every b: without the cap a channel with b_c < -(K/2-1)*6/K has zero
above the top code and loses every positive value's mask bit. Codes are packed 8/k to a byte, the
first element in the most significant bits (at k = 4: element i in the high nibble, i+1 in the low
one); C is a multiple of 8/k, so a byte never straddles two rows.

The *_ref functions state this in plain NumPy float32, for readers and the tests. quantize and
dequantize run kernels/quant.cu, built from kernels/quant.cuh: the device functions the training
kernels (kernels/bn.cu) write and read the stores with, so the tests of these wrappers test those.
"""
import numpy as np

from . import backend, kernels

SUPPORTED_BITS = (2, 4, 8)
# The stores a net can keep, by the name the API, the CLI and checkpoints give them ("bits"): exact keeps
# the float input; naive is the 4-bit store fed forward too (the ablation).
BITS = {"exact": 0, "8": 8, "4": 4, "2": 2, "naive": 4}
MASK_THRESHOLD = np.float32(1e-6)


def parse_bits(bits):
    """'exact' | 8 | 4 | 2 | 'naive' (ints or strings) -> (name, k, naive); k = 0 for exact."""
    name = str(bits)
    if name not in BITS:
        raise ValueError(f"bits must be one of {', '.join(BITS)}, got {bits!r}")
    return name, BITS[name], name == "naive"


def check_bits(bits):
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    return int(bits)


# ----------------------------------------------------------------------------- NumPy reference

def shift_ref(b, *, bits):
    """shift_c (float32) of per-channel b."""
    K = np.float32(1 << bits)
    scale = K / np.float32(6)
    with np.errstate(over="ignore"):
        return np.fmin(np.fmax(K * np.float32(0.5) - np.floor(np.asarray(b, np.float32) * scale), np.float32(1)), K - 1)


def codes_ref(v, b, *, bits):
    """Unpacked codes (uint8, v's shape) of v (..., C) with per-channel b (C,)."""
    K = np.float32(1 << bits)
    with np.errstate(over="ignore", invalid="ignore"):  # +-inf and NaN are coded like the kernel does
        q = np.floor((np.asarray(v, np.float32) - MASK_THRESHOLD) * (K / np.float32(6))) + shift_ref(b, bits=bits)
        return np.fmin(np.fmax(q, np.float32(0)), K - 1).astype(np.uint8)  # fmax: NaN -> 0, as the kernel


def pack_ref(codes, *, bits):
    """Unpacked codes -> bytes, 8/k codes a byte, the first in the most significant bits."""
    per_byte = 8 // bits
    codes = np.asarray(codes, np.uint8).reshape(-1, per_byte)
    packed = np.zeros(codes.shape[0], np.uint8)
    for t in range(per_byte):
        packed |= codes[:, t] << np.uint8(8 - bits * (t + 1))
    return packed


def unpack_ref(packed, *, bits, shape):
    """Bytes -> the unpacked codes (uint8) of shape `shape`."""
    per_byte = 8 // bits
    slots = [(packed >> np.uint8(8 - bits * (t + 1))) & np.uint8((1 << bits) - 1) for t in range(per_byte)]
    return np.stack(slots, axis=1).reshape(shape)


def quantize_ref(v, b, *, bits):
    """The packed codes (uint8, size*bits/8) of v (..., C)."""
    return pack_ref(codes_ref(v, b, bits=bits), bits=bits)


def dequantize_ref(packed, b, gamma, *, bits, shape):
    """(xhat~, a~, mask) of the packed codes, in b's dtype (mask as uint8 0/1)."""
    b = np.asarray(b)
    shift = shift_ref(b, bits=bits)
    q = unpack_ref(np.asarray(packed), bits=bits, shape=shape).astype(np.float32)
    vhat = ((q - shift + np.float32(0.5)) * (np.float32(6) / np.float32(1 << bits))).astype(b.dtype)
    y = np.asarray(gamma, b.dtype) * vhat
    a = np.where(y <= 0, b.dtype.type(0), y)  # relu that lets NaN through, as the kernels'
    return vhat - b, a, (q >= shift).astype(np.uint8)


# ----------------------------------------------------------------------------- kernels

def _check_values(name, values, channels=None):
    if not backend.is_device_array(values):
        raise ValueError(f"{name} must be a {backend.xp.__name__} array, got {type(values).__name__}")
    if values.dtype not in (np.float32, np.float64):
        raise ValueError(f"{name} must be float32 (or float64), got {values.dtype}")
    if not values.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (NHWC, channels last)")
    if channels is not None and values.shape != (channels,):
        raise ValueError(f"{name} must have shape ({channels},), one value per channel; got {values.shape}")


def _check_layout(shape, bits):
    per_byte = 8 // bits
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"activations need a channel axis last (NHWC), got shape {shape}")
    size, channels = int(np.prod(shape)), shape[-1]
    if size % per_byte or channels % per_byte:
        raise ValueError(f"at {bits} bits {per_byte} values share a byte: the element count ({size}) and the "
                         f"channel count ({channels}) must be multiples of {per_byte}")
    return size, channels


def quantize_into(v, b, codes, *, bits):
    """Write the packed codes of v (..., C) into codes (size*bits/8,) uint8."""
    bits = check_bits(bits)
    _check_values("v", v)
    size, channels = _check_layout(v.shape, bits)
    _check_values("b", b, channels)
    if b.dtype != v.dtype:
        raise ValueError(f"b ({b.dtype}) must have v's dtype ({v.dtype})")
    if codes.dtype != np.uint8 or codes.shape != (size * bits // 8,):
        raise ValueError(f"codes must be uint8 of shape ({size * bits // 8},), got {codes.dtype} {codes.shape}")
    kernels.load("quant.cu", v.dtype).quantize(n_bytes=size * bits // 8, C=channels, bits=bits, v=v, b=b, codes=codes,
                                               threads=size // channels)  # a thread a row
    return codes


def quantize(v, b, *, bits):
    """The packed codes (uint8, size*bits/8) of v (..., C), with per-channel b = beta/gamma (C,)."""
    _check_values("v", v)
    codes = backend.xp.empty(int(np.prod(v.shape)) * check_bits(bits) // 8, dtype=np.uint8)
    return quantize_into(v, b, codes, bits=bits)


def dequantize_into(codes, b, gamma, *, bits, shape, xhat=None, a=None, mask=None):
    """Write any of xhat~, a~ (b's dtype) and mask (uint8) of shape `shape` from the packed codes."""
    bits = check_bits(bits)
    size, channels = _check_layout(tuple(shape), bits)
    _check_values("b", b, channels)
    _check_values("gamma", gamma, channels)
    if gamma.dtype != b.dtype:
        raise ValueError(f"gamma ({gamma.dtype}) must have b's dtype ({b.dtype})")
    if not backend.is_device_array(codes) or codes.dtype != np.uint8 or codes.size != size * bits // 8:
        raise ValueError(f"codes must be a uint8 array of {size * bits // 8} bytes for shape {tuple(shape)} at "
                         f"{bits} bits")
    for name, out, dtype in (("xhat", xhat, b.dtype), ("a", a, b.dtype), ("mask", mask, np.uint8)):
        if out is not None and (out.shape != tuple(shape) or out.dtype != dtype):
            raise ValueError(f"{name} must be {np.dtype(dtype)} of shape {tuple(shape)}, got {out.dtype} {out.shape}")
    kernels.load("quant.cu", b.dtype).dequantize(n_bytes=size * bits // 8, C=channels, bits=bits, codes=codes, b=b,
                                                 gamma=gamma, xhat=xhat, a=a, mask=mask, threads=size // channels)
    return xhat, a, mask


def dequantize(codes, b, gamma, *, bits, shape):
    """(xhat~, a~, mask) of shape `shape` from packed codes."""
    xp = backend.xp
    outputs = dict(xhat=xp.empty(shape, b.dtype), a=xp.empty(shape, b.dtype), mask=xp.empty(shape, np.uint8))
    return dequantize_into(codes, b, gamma, bits=bits, shape=shape, **outputs)
