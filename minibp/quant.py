"""The k-bit activation store: each unit keeps k-bit codes of v = xhat + b instead of its activations.

For NHWC activations viewed as (M, C), b_c = beta_c / gamma_c per channel and K = 2^k bins, each channel
c has a window (shift_c, below_c, above_c): shift_c, a whole number, is the number of bins below zero,
and below_c and above_c the widths of the bins below and above it. With u = v - 1e-6 and width the width
on u's side of zero (below_c if u < 0, else above_c):

    q       = clamp(floor(u * (1/width)) + shift_c, 0, K-1)           the stored code (NaN -> 0)
    vhat    = (q - shift_c + 0.5) * (below_c if q < shift_c else above_c)      the bin's midpoint
    mask    = q >= shift_c            (= v >= 1e-6 in float32: the ReLU's mask is exact)
    xhat~   = vhat - b_c,   a~ = relu(gamma_c * vhat)                  what the backward pass reads

Stochastic rounding (codes_ref's uniform draws) reads the bins' edges as the levels instead, zero one on each
side of it (code shift above zero, shift - 1 below), and rounds each value at random to one of the two levels
around it, so that E[vhat] = v - 1e-6 within the window; its range and block windows span one width fewer a
side (window_ref).

Zero is a bin edge (shift is whole), so the mask is exact: for every v under the fixed window, and for
the values a range or block window was taken from (which are the values a unit codes). (u * (1/width),
not u / width: for a window of one width that is the paper's multiplication by its scale, code for code.)
WINDOWS names the three:

  fixed   the paper's: one width 6/K, shift_c = clamp(K/2 - floor(b_c * K/6), 1, K-1), so v is coded
          within about b +- 3 (xhat within +-3 sigma) and clipped beyond. The paper's code clamps shift
          only at 1; minibp also caps it at K-1, so zero stays a bin edge inside the code range for
          every b (without the cap a channel with b_c < -(K/2-1)*6/K loses every positive value's mask).
  range   the batch's own range [lo_c, hi_c] of v (from the minimum and maximum of x that the
          statistics pass also finds), narrowed to b_c +- RANGE_CLIP[k] but never across zero (so
          the channel keeps its sign pattern and the mask stays exact): u = v - 1e-6 spans [u_lo, u_hi]. A
          channel straddling zero puts j of the K bins below it: below = -u_lo/j, above = u_hi/(K-j),
          j in [1, K-1] for the least cost BELOW_WEIGHT * below^2 + above^2 (the coding errors'
          variances, those below zero weighted less: BELOW_WEIGHT says why). The cost is convex in j:
          j is the first from 1 up whose next one does not cost less. A channel of one sign gets
          one width (u_hi - u_lo)/(K-1) and a shift outside [1, K-1] (shift <= 0: every mask 1, shift
          >= K: every mask 0). Each width is floored at 2^-20 of the largest |u| (and 1e-30), which keeps
          |u| / width + K within float32's whole numbers (2^24).
  block   the range window for each WINDOW_ROWS consecutive rows (pixels) of a channel, from those
          rows' own least and largest v: a unit keeps (windows_per_channel(M), 3, C) windows, row r coded
          through window r // WINDOW_ROWS (row_windows_ref).

Codes are packed 8/k to a byte, the first element in the most significant bits (at k = 4: element i
in the high nibble, i+1 in the low one); C is a multiple of 8/k, so a byte never straddles two rows.

The *_ref functions state this in plain NumPy float32, for readers and the tests. The training kernels
(kernels/bn.cu) write and read the stores through the device functions of kernels/quant.cuh;
tests/quant_kernels.py runs the same functions on their own, for the tests and bench/quant.py.
"""
from dataclasses import dataclass

import numpy as np

from . import constants
from .constants import MASK_THRESHOLD

SUPPORTED_BITS = (2, 4, 8)
# The stores a net can keep, by the name the API, the CLI and checkpoints give them ("bits"): exact keeps
# the float input; naive is the 4-bit store fed forward too (the ablation).
BITS = {"exact": 0, "8": 8, "4": 4, "2": 2, "naive": 4}
# The windows a k-bit store can code through (the API's and CLI's `window`).
WINDOWS = ("fixed", "range", "block")
DEFAULT_WINDOW = "block"
# How a k-bit store rounds a value to a code (the API's and CLI's `rounding`): nearest, to the midpoint of
# its own bin; stochastic, at random to one of the two levels around it, the levels being the bins' edges
# with zero one on each side of it, so that the store is unbiased but for the clip and the mask stays exact
# (codes_ref, docs/method.md).
ROUNDINGS = ("nearest", "stochastic")
DEFAULT_ROUNDING = "nearest"
# The range and the block window's clip per k, in standard deviations (xhat): chosen by bench/gradnoise.py
# (docs/results.md, RQ4). A block window's range needs none at 4 bits, where the batch's does.
RANGE_CLIP = {8: np.inf, 4: 4.5, 2: 3.0}
BLOCK_CLIP = {8: np.inf, 4: np.inf, 2: 3.0}
# How much a range or block window weighs the coding error of values below zero against those above, when it
# splits its bins at zero. Values above zero are read twice by the backward pass, as a~ (the next layer's
# weight gradient) and as xhat~ (batch norm's); those below zero only as xhat~, through xhat~ * mean(dy * xhat~).
# 1/27 puts a quarter of the bins below zero in a channel symmetric about it, which bench/gradnoise.py measured
# best at 4 bits (against an eighth, three eighths and half) and better than an even split at 8 and 2 (docs/results.md,
# RQ4; bench/results/below_weight.txt); a channel with little below zero puts fewer there.
BELOW_WEIGHT = 1 / 27
# Rows (pixels) that share a block window: its windows are (windows_per_channel(rows), 3, C), 96 bits a channel per
# window, 0.375 bits a value on top of the k. (constants.py's, which the kernels read too.)
WINDOW_ROWS = constants.WINDOW_ROWS


def parse_bits(bits):
    """'exact' | 8 | 4 | 2 | 'naive' (ints or strings) -> (name, k, naive); k = 0 for exact."""
    name = str(bits)
    if name not in BITS:
        raise ValueError(f"bits must be one of {', '.join(BITS)}, got {bits!r}")
    return name, BITS[name], name == "naive"


def check_rounding(rounding):
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    return rounding


def check_window(window):
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}, got {window!r}")
    return window


@dataclass(frozen=True)
class Store:
    """What each batch-norm unit keeps for its backward pass, decided once from the words the API, the CLI
    and checkpoints use, Store(bits, window, rounding, clip), and read by everything after:

        bits      "exact" (x itself), "8", "4", "2" (k-bit codes), "naive" (4-bit codes fed forward too)
        window    the window the codes go through; exact codes nothing and naive is the paper's, so
                  both are "fixed" whatever was asked
        rounding  "nearest" or "stochastic" (k-bit stores only: exact has nothing to round, naive feeds
                  its codes forward)
        clip      the range or block window's clip in standard deviations (inf: none); None, the default,
                  is the one chosen for its window and bits (RANGE_CLIP, BLOCK_CLIP): an experiment's knob
    """
    bits: str = "4"
    window: str = DEFAULT_WINDOW
    rounding: str = DEFAULT_ROUNDING
    clip: float = None

    def __post_init__(self):
        name, k, naive = parse_bits(self.bits)
        check_window(self.window)
        if check_rounding(self.rounding) == "stochastic" and (k == 0 or naive):
            raise ValueError(f"stochastic rounding codes a k-bit store: bits {name} has none to round (exact) or "
                             "feeds its codes forward (naive)")
        object.__setattr__(self, "bits", name)  # 4 and "4" are one store
        object.__setattr__(self, "window", self.window if self.has_window else "fixed")
        if self.clip is not None:
            if isinstance(self.clip, bool) or not isinstance(self.clip, (int, float)) or not self.clip > 0:
                raise ValueError(f"clip is a positive number of standard deviations (inf: none), got {self.clip!r}")
            if not self.has_window:
                raise ValueError(f"a clip is a k-bit window's: bits {name} codes through none of its choosing")
            if self.window == "fixed":
                raise ValueError(f"a clip is the range and block windows': bits {name} through the fixed window "
                                 "has the paper's +-3 sigma")
            object.__setattr__(self, "clip", float(self.clip))

    k = property(lambda self: BITS[self.bits])                         # bits a value: 0 for exact
    naive = property(lambda self: self.bits == "naive")
    has_window = property(lambda self: self.k > 0 and not self.naive)  # its codes go through the chosen window
    block = property(lambda self: self.window == "block")              # keeps (windows, 3, C) windows of its own
    stochastic = property(lambda self: self.rounding == "stochastic")

    @property
    def window_clip(self):
        """The clip its range or block window codes with, in standard deviations: the one given, else the one
        chosen for the window and bits (clip_of); None for a store without such a window."""
        if not self.has_window or self.window == "fixed":
            return None
        return clip_of(self.window, self.k) if self.clip is None else self.clip

    def __str__(self):
        """The store in the words of every message: "bits 4 (block window)", "bits exact"."""
        if not self.has_window:
            return f"bits {self.bits}"
        clip = "" if self.clip is None else f", clip {self.clip:g} sigma"
        return f"bits {self.bits} ({self.window} window{', stochastic rounding' if self.stochastic else ''}{clip})"


    def at(self, bits):
        """This store at other bits, the window, rounding and clip kept where those bits have them: a memory
        budget's choice for one unit (exact keeps nothing to round or clip)."""
        k = BITS[parse_bits(bits)[0]]
        return Store(str(bits), self.window, self.rounding if k else DEFAULT_ROUNDING, self.clip if k else None)


def per_unit(store, count):
    """(Store,) * count, one a unit: `store` for every unit, or the sequence of count Stores given (a memory
    budget's mix, one a unit, whatever the units without batch norm are given: they keep no codes)."""
    if isinstance(store, Store):
        return (store,) * count
    stores = tuple(store) if isinstance(store, (list, tuple)) else None
    if stores is None or len(stores) != count or not all(isinstance(s, Store) for s in stores):
        raise TypeError(f"store must be a minibp.quant.Store, or a list of {count} of them (one a unit), got "
                        f"{type(store).__name__}" + (f" of {len(stores)}" if stores is not None else ""))
    if len({(s.window, s.rounding, s.clip) for s in stores if s.has_window}) > 1:
        raise ValueError("a mix of stores differs in bits alone: its k-bit units share one window, rounding and clip")
    return stores


def describe(stores):
    """The stores of the units that keep one, in the words of every message: "bits 4 (block window)" when they
    are one store, else the mix, "412 units exact, 300 at 8 bits, 289 at 4 (block window)": the first count names
    the units, the first k the bits, and the k-bit units' window (one for all of them) closes the line."""
    if len(set(stores)) <= 1:
        return str(stores[0]) if stores else "no stores"
    counts = [(bits, sum(s.bits == bits for s in stores)) for bits in BITS]
    parts = [f"{n} {bits if bits in ('exact', 'naive') else 'at ' + bits}" for bits, n in counts if n]
    parts[0] = parts[0].replace(" ", " unit " if parts[0].startswith("1 ") else " units ", 1)
    first_k = next((i for i, p in enumerate(parts) if " at " in p), None)
    if first_k is not None:
        parts[first_k] += " bits"
    coded = next((s for s in stores if s.has_window), None)
    return ", ".join(parts) + ("" if coded is None else " " + str(coded).split(" ", 2)[2])


def clip_of(window, bits):
    """The range or block window's clip at k = bits, in standard deviations."""
    return (BLOCK_CLIP if window == "block" else RANGE_CLIP)[bits]


def windows_per_channel(rows):
    """The block window's windows a channel over `rows` rows, WINDOW_ROWS rows each: the last may span fewer."""
    return -(-rows // WINDOW_ROWS)


def check_bits(bits):
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    return int(bits)


# ----------------------------------------------------------------------------- NumPy reference

def window_ref(b, *, bits, kind="fixed", lo=None, hi=None, clip=None, stochastic=False):
    """The (3, C) float32 window (shift, below, above) of each channel: the fixed window of b, or the
    range window of the channel's smallest and largest v, lo and hi (C,), narrowed to b +- clip
    (default RANGE_CLIP[bits]); the block window: lo and hi (windows, C), each window's rows', give (3, windows, C)
    (default clip BLOCK_CLIP[bits]). stochastic: the range and block windows of levels on the bins' edges
    (codes_ref), which span one width fewer a side: j bins below zero span j - 1 widths (j from 2 to K-2),
    and a channel of one sign spreads K-2 widths over its range."""
    K = np.float32(1 << bits)
    f32 = np.float32
    b = np.asarray(b, f32)
    if kind == "fixed":
        with np.errstate(over="ignore"):
            shift = np.fmin(np.fmax(K * f32(0.5) - np.floor(b * (K / f32(6))), f32(1)), K - 1)
        return np.stack([shift, np.full_like(b, f32(6) / K), np.full_like(b, f32(6) / K)])
    clip = f32(clip_of(kind, bits) if clip is None else clip)
    with np.errstate(all="ignore"):  # NaN and Inf windows of a diverged net go through as the kernel's do
        # selects written as the kernel's, so that a NaN b (a diverged net) gives the kernel's window too
        lo_clip = np.where(b - clip < 0, b - clip, f32(0))
        hi_clip = np.where(b + clip > MASK_THRESHOLD, b + clip, MASK_THRESHOLD)  # not across zero
        lo = np.where(np.asarray(lo, f32) > lo_clip, lo, lo_clip).astype(f32)
        hi = np.where(np.asarray(hi, f32) < hi_clip, hi, hi_clip).astype(f32)
        u_lo, u_hi = lo - MASK_THRESHOLD, hi - MASK_THRESHOLD
        one_sign = (u_lo >= 0) | (u_hi < 0)
        weight, edges = f32(BELOW_WEIGHT), f32(1 if stochastic else 0)  # the widths a side spans: its bins less edges
        first = f32(1) + edges
        j_best, below_j, above_j = np.full_like(u_lo, first), -u_lo / (first - edges), u_hi / (K - first - edges)
        cost, falling = weight * below_j * below_j + above_j * above_j, np.ones(u_lo.shape, bool)
        for j in np.arange(first + 1, K - edges, dtype=f32):  # while the cost falls (the kernel's scan, all at once)
            b_j, a_j = -u_lo / (j - edges), u_hi / (K - j - edges)
            cost_j = weight * b_j * b_j + a_j * a_j
            falling &= cost_j < cost
            cost, j_best = np.where(falling, cost_j, cost), np.where(falling, j, j_best)
            below_j, above_j = np.where(falling, b_j, below_j), np.where(falling, a_j, above_j)
        width = (u_hi - u_lo) / (K - 1 - edges)  # one sign
        below = np.where(one_sign, width, below_j)
        above = np.where(one_sign, width, above_j)
        least = np.where(-u_lo > u_hi, -u_lo, u_hi) * f32(2.0 ** -20)
        below, above = (np.where(side > least, side, least) for side in (below, above))
        below, above = (np.where(side > f32(1e-30), side, f32(1e-30)).astype(f32) for side in (below, above))
        shift = np.where(~one_sign, j_best, np.where(u_lo >= 0, -np.floor(u_lo * (f32(1) / below)),
                                                K - 1 - np.floor(u_hi * (f32(1) / below))))
    return np.stack([shift, below, above]).astype(f32)


def codes_ref(v, window, *, bits, uniform=None):
    """Unpacked codes (uint8, v's shape) of v (..., C) through the (3, C) window: each value in its bin
    (its nearest midpoint on its side of zero), or, given uniform draws r in [0, 1) of v's shape
    (uniform_ref: stochastic rounding, its window window_ref(stochastic=True)), rounded at random to one of
    the two levels around it, the bins' edges, zero a level on each side of it: the level floor(u/width + r)
    widths from zero, so that E[vhat] = u, coded d + shift with d = floor(u/width + r) above zero and
    floor(u/width + r) - 1 below it (zero's code there is shift - 1), so that d never crosses zero."""
    shift, below, above = np.asarray(window, np.float32)
    f32 = np.float32
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # +-inf, NaN: coded as the kernel does
        u = np.asarray(v, f32) - MASK_THRESHOLD
        scaled = u * (f32(1) / np.where(u < 0, below, above))
        if uniform is None:
            q = np.floor(scaled) + shift
        else:
            q = np.floor(scaled + np.asarray(uniform, f32)) - np.where(u < 0, f32(1), f32(0)) + shift
        return np.fmin(np.fmax(q, f32(0)), f32((1 << bits) - 1)).astype(np.uint8)  # NaN -> 0


def _mix32(h):
    """quant.cuh's quant_mix32 on uint32 arrays (products wrap at 2^32, as the kernels' do)."""
    h = np.asarray(h, np.uint32)
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x7FEB352D)
        h = h ^ (h >> np.uint32(15))
        h = h * np.uint32(0x846CA68B)
        return h ^ (h >> np.uint32(16))


def uniform_ref(key, rows, C):
    """The (rows, C) float32 draws in [0, 1) of stochastic rounding under key (rounding_key): a
    counter-based hash of (key, row) and then of the channel, its top 24 bits."""
    k, r = np.uint64(key % 2**64), np.arange(rows, dtype=np.uint64)
    low = lambda x: (x & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    row_hash = _mix32(_mix32(low(k) ^ low(r)) ^ low(k >> np.uint64(32)) ^ low(r >> np.uint64(32)))
    h = _mix32(row_hash[:, None] ^ np.arange(C, dtype=np.uint32)[None, :])
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return x ^ (x >> 31)


def _signed(key):
    return key - 2**64 if key >= 2**63 else key  # as the kernels' long long


def seed_hash(seed):
    """The run's seed hashed once, as rounding_key begins (the kernels take it so: bn.cu's rounding_keys)."""
    return _signed(_splitmix64(int(seed) % 2**64))


def rounding_key(seed, draw, unit):
    """The int64 key of one unit's stochastic rounding in one training forward pass: a hash of the run's
    seed, the draw (which forward pass: train.py counts iteration * sub-batches + sub-batch) and the
    unit's index. No generator state: a resumed run, P ranks and --split P draw alike. (quant.cuh's
    quant_rounding_key, from seed_hash(seed).)"""
    return _signed(_splitmix64(_splitmix64(seed_hash(seed) % 2**64 ^ int(draw) % 2**64) ^ int(unit) % 2**64))


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


def row_windows_ref(windows, rows):
    """The (3, rows, C) windows of each row from the block window's (windows, 3, C): row r codes through
    window r // WINDOW_ROWS. codes_ref and dequantize_ref take them for (rows, C) values."""
    return np.moveaxis(np.asarray(windows)[np.arange(rows) // WINDOW_ROWS], 1, 0)


def quantize_ref(v, window, *, bits, uniform=None):
    """The packed codes (uint8, size*bits/8) of v (..., C); stochastic with uniform draws (codes_ref)."""
    return pack_ref(codes_ref(v, window, bits=bits, uniform=uniform), bits=bits)


def dequantize_ref(packed, window, b, gamma, *, bits, shape, stochastic=False):
    """(xhat~, a~, mask) of the packed codes, in b's dtype (mask as uint8 0/1): each code's level is its bin's
    midpoint, or (stochastic) its bin's edge nearer zero, (q - shift + 1) * below under zero and
    (q - shift) * above at and over it."""
    b = np.asarray(b)
    f32 = np.float32
    shift, below, above = np.asarray(window, f32)
    q = unpack_ref(np.asarray(packed), bits=bits, shape=shape).astype(f32)
    offsets = (f32(1), f32(0)) if stochastic else (f32(0.5), f32(0.5))  # below zero, at and above it
    vhat = np.where(q < shift, (q - shift + offsets[0]) * below, (q - shift + offsets[1]) * above).astype(b.dtype)
    y = np.asarray(gamma, b.dtype) * vhat
    a = np.where(y <= 0, b.dtype.type(0), y)  # relu that lets NaN through, as the kernels'
    return vhat - b, a, (q >= shift).astype(np.uint8)
