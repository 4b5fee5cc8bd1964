"""Time a k-bit quantize + dequantize of many values: the fused kernels beside the NumPy reference.

    python bench/quant.py                 # 10M values, 4 bits, on the active device
    python bench/quant.py --values 1e6 --bits 8
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

from minibp import backend, quant

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the kernels' harness lives with the tests
import quant_kernels  # noqa: E402


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        backend.synchronize()
        start = time.perf_counter()
        fn()
        backend.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--values", type=float, default=1e7)
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--bits", type=int, default=4, choices=quant.SUPPORTED_BITS)
    parser.add_argument("--window", choices=["fixed", "range"], default="range")  # quant_kernels: a table a channel
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    xp = backend.xp
    rows = int(args.values) // args.channels
    rng = np.random.default_rng(0)
    v_host = rng.standard_normal((rows, args.channels), dtype=np.float32)
    b_host = rng.standard_normal(args.channels, dtype=np.float32)
    gamma_host = np.ones(args.channels, np.float32)
    v, b, gamma = xp.asarray(v_host), xp.asarray(b_host), xp.asarray(gamma_host)
    shape = v.shape
    codes = xp.empty(v.size * args.bits // 8, np.uint8)            # (M*C*k/8,)
    xhat, a = xp.empty(shape, np.float32), xp.empty(shape, np.float32)  # (M, C) each
    mask = xp.empty(shape, np.uint8)                                # (M, C)
    window = quant_kernels.window(b, bits=args.bits, kind=args.window, v=v)  # (3, C)
    window_host = backend.to_host(window)

    def kernels_round_trip():
        quant_kernels.quantize_into(v, window, codes, bits=args.bits)
        quant_kernels.dequantize_into(codes, window, b, gamma, bits=args.bits, shape=shape, xhat=xhat, a=a, mask=mask)

    def reference_round_trip():
        packed = quant.quantize_ref(v_host, window_host, bits=args.bits)
        quant.dequantize_ref(packed, window_host, b_host, gamma_host, bits=args.bits, shape=shape)

    kernels_round_trip()  # compile and warm up
    assert np.array_equal(backend.to_host(codes), quant.quantize_ref(v_host, window_host, bits=args.bits))
    t_kernel = best_of(args.repeats, kernels_round_trip)
    t_ref = best_of(max(1, args.repeats // 2), reference_round_trip)
    print(f"{rows * args.channels:,} values, {args.bits} bits, {args.window} window, device {backend.device}")
    print(f"  kernels   quantize+dequantize: {t_kernel * 1e3:8.1f} ms")
    print(f"  NumPy ref quantize+dequantize: {t_ref * 1e3:8.1f} ms   ({t_ref / t_kernel:.1f}x slower)")


if __name__ == "__main__":
    main()
