"""How small can a k-bit store's error be on Gaussian activations? The floor under RQ4's iteration 0.

    python bench/bounds.py            # k = 2 and 4: seconds
    python bench/bounds.py --quick    # fewer samples (the CI check that the script runs)

At initialisation a unit's normalised input xhat is close to a standard normal (no heavy tails yet), so
the error of its k-bit copy is set by how finely 2^k codes can cover a Gaussian. For xhat ~ N(0, 1)
this prints the RMS error |xhat~ - xhat| of
  fixed     the paper's window (2^k bins of 6/2^k, +-3 sigma), minibp's `fixed`;
  uniform   the best uniform quantizer (2^k bins, the width searched, centred);
  lloyd     the best scalar quantizer of any levels (Lloyd-Max, iterated on the samples);
  bound     the rate-distortion bound of a Gaussian at k bits a value, 2^-k: no coder of k bits a value,
            scalar or not, does better on average;
and each one's ratio to fixed. Nothing is written unless --out is given.
"""
import argparse
import sys
from pathlib import Path

import numpy as np


def uniform(x, K, width):
    """x through K bins of `width` centred on zero, decoded to the bins' midpoints."""
    q = np.clip(np.floor(x / width) + K // 2, 0, K - 1)
    return (q - K // 2 + 0.5) * width


def lloyd(x, K, *, iterations=100):
    """Lloyd-Max levels for the samples x: edges halfway between levels, levels the means of their cells."""
    levels = np.quantile(x, (np.arange(K) + 0.5) / K)
    for _ in range(iterations):
        cell = np.searchsorted((levels[1:] + levels[:-1]) / 2, x)
        levels = np.bincount(cell, weights=x, minlength=K) / np.maximum(np.bincount(cell, minlength=K), 1)
    return levels[np.searchsorted((levels[1:] + levels[:-1]) / 2, x)]


def rms(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2_000_000)
    parser.add_argument("--out", help="also write the table here")
    parser.add_argument("--quick", action="store_true", help="20,000 samples")
    args = parser.parse_args(argv)
    x = np.random.default_rng(0).standard_normal(20_000 if args.quick else args.samples)
    lines = [f"RMS error of k-bit copies of N(0, 1) samples ({x.size:,}), and the ratio to the paper's window",
             f"{'k':>2}  {'fixed':>7}  {'uniform':>15}  {'lloyd':>15}  {'bound':>15}"]
    for k in (2, 4):
        K = 1 << k
        fixed = rms(uniform(x, K, 6 / K), x)
        best = min(rms(uniform(x, K, w), x) for w in np.linspace(0.5, 1.5, 101) * 6 / K)
        errors = [best, rms(lloyd(x, K), x), 2.0 ** -k]
        lines.append(f"{k:>2}  {fixed:7.4f}  " + "  ".join(f"{e:7.4f} ({fixed / e:4.2f}x)" for e in errors))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
