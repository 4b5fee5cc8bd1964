"""Which k-bit activation store: the paper's fixed window against three candidates, on real activations.

    python bench/stores.py             # Fashion-MNIST, ResNet-20, iterations 0, 100, 400 (minutes on a CPU)
    python bench/stores.py --quick     # seconds: random data, ResNet-11, a temporary --out

Every store keeps v = xhat + b (b = beta/gamma) at k bits a value, with zero on a bin edge so that the
ReLU's mask (v >= 1e-6) is exact:
  fixed     the paper's (minibp.quant's *_ref): K = 2^k bins of 6/K, a window of about +-3 around b;
  range, no clip   a window per channel from the batch's min and max of v (side data: min, max as
            float32), unclipped: minibp's range window as it codes at 8 bits (at 4 and 2 it clips);
  sidebuf   the fixed window, the values beyond it kept exactly in a buffer of a fixed capacity (index
            int32 + value float32, counted at capacity); overflow is clipped as in fixed;
  group     a window per group of G consecutive values of the (M, C) tensor, row-major, from its min and
            max (float16 rounded outwards, or float32), zero always inside the window.
An exact-mode net trains with SGD; at each point every BN-ReLU unit's input x, gamma, beta and the true
upstream gradient da of an exact backward pass are captured. Per unit and store: ||xhat~ - xhat||/||xhat||
and the relative errors of dx and dgamma from layers.batchnorm_relu_backward_ref with (xhat~, the store's
mask) against (xhat, the exact mask). A table per k: median and max over units and points, bits per value
with side data, the fraction of values clipped, and mask bits that differ from the exact mask.
"""
import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from minibp import backend, layers, program, quant
from minibp.io import data
from minibp.io.batches import Batches
from minibp.optim import SGD
from options import net_options, seed_option
from gradients import compile_modes, out_path, relative_error

T = np.float64(quant.MASK_THRESHOLD)  # the mask's threshold: codes count bins of v - T
TINY = 1e-12                          # a floor for the bin width of a constant window


def window(lo, hi, K, *, zero_inside):
    """(w, s) float64 of windows over [lo, hi] (arrays): K codes of width w, zero on the edge of code s.
    A window that straddles zero takes the j in 1..K-1 codes below it that minimise w; zero_inside=False
    lets a one-signed window leave zero outside its codes (its mask is then constant)."""
    lo, hi = np.asarray(lo, np.float64) - T, np.asarray(hi, np.float64) - T
    if zero_inside:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    j = np.arange(1, K, dtype=np.float64)
    widths = np.maximum(-np.minimum(lo, 0)[..., None] / j, np.maximum(hi, 0)[..., None] / (K - j))
    w, s = widths.min(axis=-1), widths.argmin(axis=-1) + 1.0
    if not zero_inside:
        wide = np.maximum((hi - lo) / (K - 1), TINY)
        positive, negative = lo >= 0, hi < 0
        s = np.where(positive, -np.floor(lo / wide), np.where(negative, K - 1 - np.floor(hi / wide), s))
        w = np.where(positive | negative, wide, w)
    return np.maximum(w, TINY), s


def encode(v, w, s, K):
    return np.clip(np.floor((np.asarray(v, np.float64) - T) / w) + s, 0, K - 1)


def decode(q, w, s):
    """(vhat, mask): the bin's midpoint (as an offset from T) and q >= s."""
    return (q - s + 0.5) * w + T, q >= s


def fixed(v, b, k):
    """The paper's store: (xhat~, mask, side bits a value, values clipped)."""
    table = quant.window_ref(b, bits=k)
    codes = quant.codes_ref(v, table, bits=k)
    xhat, _, mask = quant.dequantize_ref(quant.pack_ref(codes, bits=k), table, b, np.ones_like(b), bits=k,
                                         shape=v.shape)
    raw = np.floor((v - quant.MASK_THRESHOLD) * (np.float32(1) / table[1])) + table[0]  # before the clamp
    outside = (raw < 0) | (raw > (1 << k) - 1)
    return xhat, mask.astype(bool), 0.0, outside


def ranged(v, b, k):
    w, s = window(v.min(axis=0), v.max(axis=0), 1 << k, zero_inside=False)
    vhat, mask = decode(encode(v, w, s, 1 << k), w, s)
    return (vhat - b).astype(np.float32), mask, 64 / v.shape[0], np.zeros(v.shape, bool)


def sidebuf(v, b, k, *, capacity):
    xhat, mask, _, outside = fixed(v, b, k)
    slots = int(capacity * v.size)
    kept = np.flatnonzero(outside)[:slots]  # memory order: what a kernel appending with a counter may keep
    xhat.flat[kept] = (v.flat[kept] - b[kept % v.shape[1]])
    outside.flat[kept] = False
    return xhat, mask, capacity * 64, outside


def grouped(v, b, k, *, G, side):
    if v.size % G:
        raise ValueError(f"{v.size} values do not split into groups of {G}")
    flat = v.reshape(-1, G)
    lo, hi = flat.min(axis=1), flat.max(axis=1)
    lo_s, hi_s = lo.astype(side), hi.astype(side)  # rounded outwards, so that the window still covers the group
    lo_s = np.where(lo_s > lo, np.nextafter(lo_s, side(-np.inf)), lo_s)
    hi_s = np.where(hi_s < hi, np.nextafter(hi_s, side(np.inf)), hi_s)
    w, s = window(lo_s, hi_s, 1 << k, zero_inside=True)
    vhat, mask = decode(encode(flat, w[:, None], s[:, None], 1 << k), w[:, None], s[:, None])
    xhat = (vhat.reshape(v.shape) - b).astype(np.float32)
    return xhat, mask.reshape(v.shape), 2 * np.dtype(side).itemsize * 8 / G, np.zeros(v.shape, bool)


CANDIDATES = {"fixed": fixed, "range, no clip": ranged,
              **{f"sidebuf {c:.1%}": (lambda v, b, k, c=c: sidebuf(v, b, k, capacity=c)) for c in (0.005, 0.01, 0.02)},
              "group 256 f16": lambda v, b, k: grouped(v, b, k, G=256, side=np.float16),
              "group 256 f32": lambda v, b, k: grouped(v, b, k, G=256, side=np.float32)}


@contextmanager
def capturing(into, net):
    """Append (x, stats, beta, da) on the host for every BN-ReLU backward of net's while inside (exact mode): the
    kernel wrapper that each unit's BatchNormReLU calls (layers/bn.py), replaced there by one that also issues a
    copy of its arrays, so that a pass recorded inside (the net's passes are recorded anew) takes them when it
    runs."""
    original = layers.bn.batchnorm_relu_backward

    def snapshot(*arrays):
        into.append(tuple(backend.to_host(a).copy() for a in arrays))

    def capture(da, stats, beta, dx, **options):
        program.issue("capture", snapshot, options["x_copy"], stats, beta, da)
        original(da, stats, beta, dx, **options)
    layers.bn.batchnorm_relu_backward = capture
    net.record_anew()
    try:
        yield
    finally:
        layers.bn.batchnorm_relu_backward = original
        net.record_anew()


def measure(x, stats, beta, da, *, eps, k):
    """{candidate: (xhat error, dx error, dgamma error, side bits, clipped fraction, mask bits wrong)}."""
    C = x.shape[-1]
    x, da = x.reshape(-1, C), da.reshape(-1, C).astype(np.float64)
    gamma = stats[2]  # clamped
    _, xhat, _, sigma = layers.batchnorm_relu_forward_ref(x, gamma, beta, eps=np.float32(eps))
    b = stats[3]  # beta / gamma, as the net computed it
    v = (xhat + b).astype(np.float32)
    mask = v >= quant.MASK_THRESHOLD
    dx, dgamma, _ = layers.batchnorm_relu_backward_ref(da, xhat.astype(np.float64), mask, gamma, sigma)
    out = {}
    for name, store in CANDIDATES.items():
        xhat_t, mask_t, side, clipped = store(v, b, k)
        dx_t, dgamma_t, _ = layers.batchnorm_relu_backward_ref(da, xhat_t.astype(np.float64), mask_t, gamma, sigma)
        out[name] = (relative_error(xhat_t, xhat), relative_error(dx_t, dx), relative_error(dgamma_t, dgamma),
                     side, clipped.mean(), int(np.count_nonzero(mask_t != mask)))
    return out


def table(k, rows, title):
    lines = [f"k = {k} bits. {title}",
             f"{'candidate':<15} {'bits/value':>10}  {'xhat~ med':>9} {'max':>8}  {'dx med':>8} {'max':>8}  "
             f"{'dgamma med':>10} {'max':>8}  {'clipped':>8} {'mask errs':>9}"]
    for name, r in rows.items():
        r = np.array(r)
        lines.append(f"{name:<15} {k + r[:, 3].mean():10.3f}  {np.median(r[:, 0]):9.5f} {r[:, 0].max():8.5f}  "
                     f"{np.median(r[:, 1]):8.5f} {r[:, 1].max():8.5f}  "
                     f"{np.median(r[:, 2]):10.5f} {r[:, 2].max():8.5f}  "
                     f"{r[:, 4].mean():8.3%} {int(r[:, 5].sum()):9d}")
    med = {name: np.median(np.array(r)[:, 1]) for name, r in rows.items()}
    best = min(med, key=med.get)
    lines.append(f"lowest median dx error: {best}, {med['fixed'] / med[best]:.2f}x below fixed")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    net_options(parser, model="resnet20", batch=128, data="fashion-mnist", data_dir=True)
    parser.add_argument("--points", default="0,100,400", help="iterations of training at which to measure")
    parser.add_argument("--lr", type=float, default=0.1)
    seed_option(parser)
    parser.add_argument("--out", default=None, help="the tables (default bench/results/stores.txt; other settings: a "
                                                    "temporary folder)")
    parser.add_argument("--quick", action="store_true", help="resnet11, batch 8, points 0 and 2, random 8x8 data")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.quick:
        args.model, args.batch, points = "resnet11", 8, [0, 2]
        images = rng.standard_normal((64, 8, 8, 1)).astype(np.float32)
        split = data.Split((images * 40 + 128).clip(0, 255).astype(np.uint8), rng.integers(0, 10, 64), 10, "random")
    else:
        points = [int(p) for p in args.points.split(",")]
        split = data.load_split(data.dataset_path(args.data_dir, args.data), "train")
    mean = split.pixel_mean()
    net = compile_modes(args.model, ("exact",), input_shape=split.images.shape[1:], classes=split.classes,
                        batch=args.batch, seed=args.seed)["exact"]
    optimizer = SGD(net)
    train_batches = Batches(split, batch=args.batch, mean=mean, augment=True, seed=args.seed)
    probe_batches = Batches(split, batch=args.batch, mean=mean, augment=False, seed=args.seed + 1)
    bits = (8, 4, 2)
    rows = {k: {name: [] for name in CANDIDATES} for k in bits}
    iteration, units = 0, 0
    for point in points:
        while iteration < point:
            net.zero_grad()
            net.forward(*train_batches.next())
            net.backward()
            optimizer.step(lr=args.lr)
            iteration += 1
        captured = []
        net.zero_grad()
        with capturing(captured, net):
            net.forward(*probe_batches.next())
            net.backward()
        net.zero_grad()  # the probe's gradients must not reach the next step
        units = len(captured)
        for unit in captured:
            for k in bits:
                for name, r in measure(*unit, eps=net.eps, k=k).items():
                    rows[k][name].append(r)
        print(f"iteration {point}: {units} BN-ReLU units measured", flush=True)
    title = (f"{args.model}, batch {args.batch}, {'random data' if args.quick else args.data}: relative errors, median "
             f"and max over {units} units x points {','.join(map(str, points))}; da from the exact backward")
    text = "\n".join(table(k, rows[k], title) for k in bits)
    print("\n" + text)
    out = out_path(args.out, default="bench/results/stores.txt", parser=parser, args=args)
    Path(out).write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
