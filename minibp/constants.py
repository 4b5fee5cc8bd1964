"""The numbers the Python side and the kernels share, each defined once, here.

The NumPy references and layers read them as Python values; every kernel build, by g++ (build.py) or
NVRTC (kernels.py), gets each as a macro (-DNAME=value, defines()), written as an exact hexadecimal
literal of the same value and type, so the two sides cannot drift apart. A build's cache key covers its
command line, so changing a value rebuilds the kernels.
"""
import numpy as np

# The ReLU mask's threshold in the k-bit code: a value v codes as u = v - MASK_THRESHOLD, and its mask
# is u >= 0 (quant.py; kernels/quant.cuh). float32: the kernels' codes are float arithmetic.
MASK_THRESHOLD = np.float32(1e-6)
# gamma is clamped to at least this (docs/method.md, "The unit"; layers/bn.py; kernels/bn.cu). A double,
# cast to the kernel's real_t as NumPy casts it to the array's dtype.
GAMMA_MIN = 1e-8
# Rows (pixels) that share a block window (quant.py; kernels/bn.cu's code_windows).
WINDOW_ROWS = 256
# Channels one CPU thread of a finishing kernel sums over every chunk (layers/launch.py, kernels/bn_walk.cuh's
# for_finish_channels): a 64-byte cache line of float32 partial sums, each read once.
FINISH_PIECE = 16
# The most vectors of output channels a direct-conv tile or weight-gradient task holds (layers/conv_direct.py,
# kernels/conv_direct.cu, which instantiates its vector loops for 1 and 2).
CONV_VECTORS = 2

SHARED = {"MASK_THRESHOLD": MASK_THRESHOLD, "GAMMA_MIN": GAMMA_MIN, "WINDOW_ROWS": WINDOW_ROWS,
          "FINISH_PIECE": FINISH_PIECE, "CONV_VECTORS": CONV_VECTORS}


def literal(value):
    """value as an exact C literal: a hexadecimal float, with the f suffix for a float32; an int in hexadecimal."""
    if isinstance(value, int):
        return hex(value)
    if isinstance(value, np.float32):
        return f"{float(value).hex()}f"
    return float(value).hex()


def defines():
    """The compiler options that define every shared constant for a kernel build."""
    return [f"-D{name}=({literal(value)})" for name, value in SHARED.items()]
