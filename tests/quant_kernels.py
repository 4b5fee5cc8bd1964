"""The k-bit store's kernels on their own: tests/quant.cu, built from kernels/quant.cuh, the device
functions the training kernels (kernels/bn.cu) write and read the stores with, so testing these
wrappers against quant.py's NumPy reference tests those. They serve the tests and bench/quant.py
(which imports them from here); training never calls them, and the package does not ship them.

    table = window(b, bits=4, kind="range", v=v)               # (3, C): shift, below, above per channel
    codes = quantize(v, table, bits=4)                          # (size * 4 / 8,) uint8
    xhat, a, mask = dequantize(codes, table, b, gamma, bits=4, shape=v.shape)
"""
from pathlib import Path

import numpy as np

from minibp import backend, kernels, quant
from minibp.quant import check_bits, check_window, clip_of

QUANT_CU = Path(__file__).resolve().with_name("quant.cu")  # beside this file: the package does not ship it


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


def window(b, *, bits, kind="fixed", v=None):
    """The (3, C) window (shift, below, above) of each channel, b's dtype: the fixed window of b (C,), or
    the range window of v (..., C), whose per-channel minimum and maximum it takes."""
    bits = check_bits(bits)
    _check_values("b", b)
    C = b.shape[0] if b.ndim == 1 else -1
    _check_values("b", b, C)
    lo = hi = b  # unread by the fixed window
    if check_window(kind) == "block":
        raise ValueError("these kernels take one window a channel: fixed or range (the block window is bn.cu's)")
    if kind == "range":
        if v is None:
            raise ValueError("the range window is taken from the values: give v")
        _check_values("v", v)
        rows = v.reshape(-1, C)
        lo, hi = rows.min(axis=0), rows.max(axis=0)
    table = backend.xp.empty((3, C), b.dtype)
    kernels.load(QUANT_CU, b.dtype).channel_window(C=C, bits=bits, range=kind == "range", clip=clip_of(kind, bits),
                                                     below_weight=quant.BELOW_WEIGHT, b=b, lo=lo, hi=hi, window=table,
                                                     threads=C)
    return table


def _check_window_table(table, channels, dtype):
    if not backend.is_device_array(table) or table.shape != (3, channels) or table.dtype != dtype:
        raise ValueError(f"window must be a (3, {channels}) {np.dtype(dtype)} array (quant_kernels.window), got "
                         f"{getattr(table, 'dtype', type(table).__name__)} {getattr(table, 'shape', '')}")


def quantize_into(v, table, codes, *, bits):
    """Write the packed codes of v (..., C) through the (3, C) window `table` into codes (size*bits/8,) uint8."""
    bits = check_bits(bits)
    _check_values("v", v)
    size, channels = _check_layout(v.shape, bits)
    _check_window_table(table, channels, v.dtype)
    if codes.dtype != np.uint8 or codes.shape != (size * bits // 8,):
        raise ValueError(f"codes must be uint8 of shape ({size * bits // 8},), got {codes.dtype} {codes.shape}")
    kernels.load(QUANT_CU, v.dtype).quantize(n_bytes=size * bits // 8, C=channels, bits=bits, v=v, window=table,
                                               codes=codes, threads=size // channels)  # a thread a row
    return codes


def quantize(v, table, *, bits):
    """The packed codes (uint8, size*bits/8) of v (..., C) through the (3, C) window `table`."""
    _check_values("v", v)
    codes = backend.xp.empty(int(np.prod(v.shape)) * check_bits(bits) // 8, dtype=np.uint8)
    return quantize_into(v, table, codes, bits=bits)


def dequantize_into(codes, table, b, gamma, *, bits, shape, xhat=None, a=None, mask=None):
    """Write any of xhat~, a~ (b's dtype) and mask (uint8) of shape `shape` from the packed codes."""
    bits = check_bits(bits)
    size, channels = _check_layout(tuple(shape), bits)
    _check_values("b", b, channels)
    _check_values("gamma", gamma, channels)
    if gamma.dtype != b.dtype:
        raise ValueError(f"gamma ({gamma.dtype}) must have b's dtype ({b.dtype})")
    _check_window_table(table, channels, b.dtype)
    if not backend.is_device_array(codes) or codes.dtype != np.uint8 or codes.size != size * bits // 8:
        raise ValueError(f"codes must be a uint8 array of {size * bits // 8} bytes for shape {tuple(shape)} at "
                         f"{bits} bits")
    for name, out, dtype in (("xhat", xhat, b.dtype), ("a", a, b.dtype), ("mask", mask, np.uint8)):
        if out is not None and (out.shape != tuple(shape) or out.dtype != dtype):
            raise ValueError(f"{name} must be {np.dtype(dtype)} of shape {tuple(shape)}, got {out.dtype} {out.shape}")
    kernels.load(QUANT_CU, b.dtype).dequantize(n_bytes=size * bits // 8, C=channels, bits=bits, codes=codes,
                                                 window=table, b=b, gamma=gamma, xhat=xhat, a=a, mask=mask,
                                                 threads=size // channels)
    return xhat, a, mask


def dequantize(codes, table, b, gamma, *, bits, shape):
    """(xhat~, a~, mask) of shape `shape` from packed codes."""
    xp = backend.xp
    outputs = dict(xhat=xp.empty(shape, b.dtype), a=xp.empty(shape, b.dtype), mask=xp.empty(shape, np.uint8))
    return dequantize_into(codes, table, b, gamma, bits=bits, shape=shape, **outputs)
