"""The k-bit store: kernels byte-identical to the NumPy reference, and the properties minibp/quant.py states."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibp import backend, quant
import quant_kernels
from conftest import device, host

BITS = [2, 4, 8]
KINDS = ["fixed", "range"]  # the windows of one table per channel (the block window: test_store_exact.py)


def _edge_values(bits):
    """Values on and next to every bin edge around the window, plus zeros, tiny and huge values."""
    K = 1 << bits
    edges = (np.arange(-K - 2, K + 3, dtype=np.float32) * np.float32(6 / K)) + np.float32(1e-6)
    near = np.concatenate([edges, np.nextafter(edges, np.float32(-np.inf)), np.nextafter(edges, np.float32(np.inf))])
    special = np.array([0, -0.0, 1e-6, np.nextafter(np.float32(1e-6), 1), np.nextafter(np.float32(1e-6), 0),
                        1e-30, -1e-30, 1e6, -1e6, 3e38, -3e38, 3, -3, 2.9999, -2.9999], np.float32)
    return np.concatenate([near, special]).astype(np.float32)


def _random_case(rng, n_pixels, channels, *, scale=2.0):
    v = (rng.standard_normal((n_pixels, channels)) * scale).astype(np.float32)
    b = (rng.standard_normal(channels) * 1.5).astype(np.float32)
    return v, b


def _window(v, b, bits, kind):
    """The (3, C) window the kernel computes (device) and the reference's (host), checked equal."""
    rows = v.reshape(-1, b.size)
    table = quant_kernels.window(device(b), bits=bits, kind=kind, v=device(v))
    ref = quant.window_ref(b, bits=bits, kind=kind, lo=rows.min(axis=0), hi=rows.max(axis=0))
    assert np.array_equal(host(table), ref, equal_nan=True)
    return table, ref


def _codes(v, b, bits, kind="fixed"):
    """(the kernel's codes, the reference's) of v through the window of that kind."""
    table, ref = _window(v, b, bits, kind)
    return host(quant_kernels.quantize(device(v), table, bits=bits)), quant.quantize_ref(v, ref, bits=bits)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_codes_byte_identical_to_reference_on_random_data(rng, bits, kind):
    v, b = _random_case(rng, 4096, 16)
    v[:, 3] += 9  # channels of one sign: the range window puts zero outside the codes
    v[:, 4] -= 9
    v[:, 5] = 2.5  # a constant channel: the range window's floor on the width
    codes, want = _codes(v, b, bits, kind)
    assert codes.dtype == np.uint8 and codes.shape == (v.size * bits // 8,)
    assert np.array_equal(codes, want)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("b_value", [0.0, 1.0, -1.0, 2.9, -2.9, 5.0, -5.0, 1e-30, 1e8, -1e8, 1e30, -1e30])
def test_codes_byte_identical_on_hard_cases(bits, b_value, kind):
    assert np.array_equal(*_codes(*hard_case(bits, b_value, kind), bits, kind))


HARD_B = [0.0, 1.0, -1.0, 2.9, -2.9, 5.0, -5.0, 1e-30, 1e8, -1e8, 1e30, -1e30]


def hard_case(bits, b_value, kind):
    """(v, b): the edge values and the same plus b_value, a row per byte's worth of channels."""
    per_byte = 8 // bits
    values = _edge_values(bits)
    values = np.concatenate([values, values + np.float32(b_value)])
    values = values[: len(values) // per_byte * per_byte]
    channels = per_byte  # one row per value group; every channel gets the same b
    v = np.ascontiguousarray(np.resize(values, (len(values) // channels, channels)))
    b = np.full(channels, b_value, np.float32)
    if kind == "range":
        v = v[np.all(np.abs(v) < 1e37, axis=1)]  # the range window of +-3e38 overflows: the net has diverged
    return v, b


FLUSHED = """
import ctypes, json, sys
import numpy as np
sys.path.insert(0, {tests!r})
import quant_kernels, test_quant
from minibp import quant
flush = ctypes.CDLL({library!r}).flush_subnormals
wrong = []
for kind in test_quant.KINDS:
    for bits in test_quant.BITS:
        for b_value in test_quant.HARD_B:
            v, b = test_quant.hard_case(bits, b_value, kind)
            lo, hi = v.min(axis=0), v.max(axis=0)
            ref = quant.window_ref(b, bits=bits, kind=kind, lo=lo, hi=hi)
            want = quant.quantize_ref(v, ref, bits=bits)      # NumPy, subnormals kept
            flush(1)
            table = quant_kernels.window(b, bits=bits, kind=kind, v=v)
            codes = quant_kernels.quantize(v, ref, bits=bits)  # the kernels, subnormals flushed as on the GPU
            flush(0)
            if not (np.array_equal(table, ref, equal_nan=True) and np.array_equal(codes, want)):
                wrong.append([kind, bits, b_value])
print(json.dumps(wrong))
"""


@pytest.mark.slow
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="sets x86's MXCSR")
def test_codes_stay_byte_identical_when_subnormals_flush_to_zero_as_on_the_gpu(tmp_path):
    """CuPy compiles every kernel with -ftz=true. On an H200 that moved codes of the range window near b = -1e30
    (a tiny negative u over a wide window floored as zero): here the CPU kernels run with x86's flush-to-zero
    and denormals-are-zero on (one thread, so no OpenMP worker keeps the old setting) against NumPy's codes."""
    if backend.device != "cpu":
        pytest.skip("on a GPU the hard cases above run flushed already")
    source = tmp_path / "flush.c"
    source.write_text("#include <xmmintrin.h>\nvoid flush_subnormals(int on) { unsigned m = _mm_getcsr() & ~0x8040u; "
                      "_mm_setcsr(on ? m | 0x8040u : m); }\n")  # FTZ (bit 15) and DAZ (bit 6)
    library = tmp_path / "flush.so"
    subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-O2", str(source), "-o", str(library)], check=True)
    code = FLUSHED.format(tests=str(Path(__file__).resolve().parent), library=str(library))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1", MINIBP_DEVICE="cpu"))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []



@pytest.mark.parametrize("bits", BITS)
def test_the_fixed_window_codes_as_the_papers_scale_does(bits):
    """One width 6/K: u * (1/w) is the paper's u * K/6 bit for bit (6/K is exact), so the reproduction's codes
    did not move when the windows got a width on each side of zero."""
    K = np.float32(1 << bits)
    for b_value in (0.0, 1.0, -2.9, 5.0):
        v = _edge_values(bits)[:, None] + np.float32(b_value)
        b = np.full(1, b_value, np.float32)
        shift = quant.window_ref(b, bits=bits)[0]
        with np.errstate(over="ignore", invalid="ignore"):
            paper = np.floor((v - np.float32(1e-6)) * (K / np.float32(6))) + shift
        paper = np.fmin(np.fmax(paper, np.float32(0)), K - 1).astype(np.uint8)
        assert np.array_equal(quant.codes_ref(v, quant.window_ref(b, bits=bits), bits=bits), paper)

def test_b_from_tiny_and_huge_gamma(rng):
    """b = beta / gamma for gamma at the 1e-8 clamp and for huge gamma."""
    gamma = np.array([1e-8, 1e-8, 1e8, 1e8, 1.0, 1e-8], np.float32)
    beta = np.array([0.5, -0.5, 0.5, -0.5, 0.0, 0.0], np.float32)
    b = (beta / gamma).astype(np.float32)
    v, _ = _random_case(rng, 512, 6)
    v = (v + b).astype(np.float32)
    for bits in BITS:
        if 6 % (8 // bits) == 0:
            for kind in KINDS:
                assert np.array_equal(*_codes(v, b, bits, kind))


@pytest.mark.parametrize("bits", BITS)
def test_every_accepted_channel_count(rng, bits):
    per_byte = 8 // bits
    for channels in range(per_byte, 41, per_byte):
        v, b = _random_case(rng, 8, channels)
        for kind in KINDS:
            assert np.array_equal(*_codes(v, b, bits, kind)), (channels, kind)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_dequantize_identical_to_reference(rng, bits, kind):
    v, b = _random_case(rng, 1024, 8)
    v[:, 2] += 9
    gamma = np.abs(rng.standard_normal(8)).astype(np.float32) + np.float32(0.1)
    table, ref = _window(v, b, bits, kind)
    codes = quant.quantize_ref(v, ref, bits=bits)
    outputs = quant_kernels.dequantize(device(codes), table, device(b), device(gamma), bits=bits, shape=v.shape)
    for name, got, want in zip(("xhat", "a", "mask"), outputs,
                               quant.dequantize_ref(codes, ref, b, gamma, bits=bits, shape=v.shape)):
        assert np.array_equal(host(got), want), name


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bits", BITS)
def test_mask_is_exact_and_error_is_half_a_bin_inside_the_window(rng, bits, kind):
    v, b = _random_case(rng, 4096, 8)
    v[::7] = 0.0
    v[1::11] = np.float32(1e-6)
    v[:, 6] += 9  # one sign: every mask 1 under the range window
    v[:, 7] = -np.abs(v[:, 7]) - np.float32(1e-3)  # every mask 0
    gamma = np.ones(8, np.float32)
    table, ref = _window(v, b, bits, kind)
    codes = quant_kernels.quantize(device(v), table, bits=bits)
    xhat, a, mask = (host(x) for x in quant_kernels.dequantize(codes, table, device(b), device(gamma), bits=bits,
                                                               shape=v.shape))
    # mask = (v >= 1e-6) in float32: the ReLU's sign, with the reference's 1e-6 guard
    assert np.array_equal(mask.astype(bool), v >= np.float32(1e-6))
    assert np.all((a > 0) == mask.astype(bool))  # a~ is zero exactly where the mask is
    vhat = xhat + b
    shift, below, above = ref
    lo, hi = (0 - shift) * below, ((1 << bits) - shift) * above  # the window of each channel
    inside = (v >= lo) & (v < hi - 1e-5)
    unclipped = kind == "range" and quant.RANGE_CLIP[bits] == np.inf
    assert inside.mean() > (0.999 if unclipped else 0.5)  # the unclipped range window clips nothing
    width = np.where(v < np.float32(1e-6), below, above)  # the bins' width on v's side of zero
    assert np.all((np.abs(vhat - v) <= width / 2 + 1e-5)[inside])


@pytest.mark.parametrize("weight", [None, 1.0, 1 / 27])
@pytest.mark.parametrize("bits", BITS)
def test_range_window_splits_its_bins_at_zero_and_covers_the_spread(monkeypatch, bits, weight):
    """One width, the spread over K-1 bins, for a channel of one sign; a channel straddling zero puts
    shift bins below it and K - shift above, each side's range over its own bins, shift the least
    BELOW_WEIGHT * below^2 + above^2 (a quarter of the bins below zero when the channel is symmetric
    and the weight 1/27, half at 1). Every value of the channel codes within the window; the kernel's
    window is the reference's."""
    if weight is not None:
        monkeypatch.setattr(quant, "BELOW_WEIGHT", weight)
    K = 1 << bits
    lo = np.array([-3, -0.5, 1, -9, 0, -7, 2.5, -3], np.float32)
    hi = np.array([3, 11, 4, -2, 6, 1e-6, 2.5, 3], np.float32)
    _window(np.stack([lo, hi]), np.zeros(8, np.float32), bits, "range")  # the kernel's is the reference's
    shift, below, above = quant.window_ref(np.zeros(8, np.float32), bits=bits, kind="range", lo=lo, hi=hi,
                                           clip=np.inf)
    u_lo, u_hi = lo - np.float32(1e-6), hi - np.float32(1e-6)
    one_sign = [2, 3]
    assert np.array_equal(below[one_sign], above[one_sign])
    assert np.all(below[one_sign] <= (hi - lo)[one_sign] / (K - 1) * (1 + 1e-6))
    straddling = [0, 1, 4, 5]
    j = np.arange(1, K, dtype=np.float64)[:, None]
    cost = quant.BELOW_WEIGHT * (-u_lo[straddling] / j) ** 2 + (u_hi[straddling] / (K - j)) ** 2
    assert np.array_equal(shift[straddling], np.argmin(cost, axis=0) + 1)
    if quant.BELOW_WEIGHT in (1.0, 1 / 27):  # symmetric
        assert shift[0] == {1.0: K // 2, 1 / 27: K // 4}[quant.BELOW_WEIGHT]
    assert shift[5] == K - 1  # nothing above zero
    np.testing.assert_allclose(below[[0, 1, 5]], -u_lo[[0, 1, 5]] / shift[[0, 1, 5]], rtol=1e-6)
    np.testing.assert_allclose(above[[0, 1, 4]], u_hi[[0, 1, 4]] / (K - shift[[0, 1, 4]]), rtol=1e-6)
    assert below[-1] > 0 and above[-1] > 0  # a constant channel
    assert np.all(np.floor(u_lo / below) + shift >= -1e-3) and np.all(np.floor(u_hi / above) + shift <= K)


@pytest.mark.parametrize("clip", [0.5, 2.0, 3.0])
@pytest.mark.parametrize("bits", BITS)
def test_a_clipped_range_window_keeps_the_mask_exact(monkeypatch, rng, bits, clip):
    """Narrowed to b +- clip, never across zero: channels whose b +- clip lies on one side of zero while
    their values straddle it keep zero a bin edge inside the codes; the kernel agrees with the reference."""
    monkeypatch.setitem(quant.RANGE_CLIP, bits, clip)
    v, b = _random_case(rng, 2048, 8)
    b[:4] = [5.0, -5.0, 0.3, -0.3]
    v[:, :4] += b[:4]  # v around b: values straddle zero with b +- clip on one side of it
    table, ref = _window(v, b, bits, "range")
    _, below, above = ref
    assert np.all(np.maximum(below, above)[:2] <= (clip + 5) / ((1 << bits) - 2) * 1.0001)  # not the whole spread
    codes = quant_kernels.quantize(device(v), table, bits=bits)
    assert np.array_equal(host(codes), quant.quantize_ref(v, ref, bits=bits))
    _, _, mask = quant_kernels.dequantize(codes, table, device(b), device(np.ones(8, np.float32)), bits=bits,
                                          shape=v.shape)
    assert np.array_equal(host(mask).astype(bool), v >= np.float32(1e-6))


@pytest.mark.parametrize("bits", BITS)
def test_range_windows_of_a_diverged_net_match_the_reference(bits):
    """NaN and infinite b or extremes (a diverged net): the kernel's window equals the reference's."""
    b = np.array([np.nan, np.inf, -np.inf, 1e30, 0.5, -2.0, 5e3, -1e4], np.float32)
    v = np.array([[-1, 0, -3, 1e30, -2, -9, 4990, -1.001e4], [2, 3, 1, 1e30, np.inf, np.nan, 5010, -9990]],
                 np.float32)
    _window(v, b, bits, "range")  # asserts equality, NaN for NaN


def test_mask_stays_exact_for_very_negative_b():
    """minibp caps shift at K-1 so that zero stays a bin edge even when b pushes it out of the window."""
    b = np.full(2, -10.0, np.float32)
    v = np.array([[-12, -10], [-1e-7, 1e-6], [0.5, 3.0], [1e-3, 20.0]], np.float32)
    table, _ = _window(v, b, 4, "fixed")
    _, _, mask = quant_kernels.dequantize(quant_kernels.quantize(device(v), table, bits=4), table, device(b),
                                          device(np.ones(2, np.float32)), bits=4, shape=v.shape)
    assert np.array_equal(host(mask).astype(bool), v >= np.float32(1e-6))


def test_nan_and_inf_codes_match_the_reference():
    v = np.array([[np.nan, np.inf], [-np.inf, 0.0]], np.float32)
    b = np.zeros(2, np.float32)
    for bits in BITS:
        if 2 % (8 // bits) == 0:
            assert np.array_equal(*_codes(v, b, bits))


def test_nibble_order_high_first():
    b = np.zeros(2, np.float32)
    v = np.array([[-100.0, 100.0]], np.float32)  # codes 0 and 15
    assert _codes(v, b, 4)[0].tolist() == [0x0F]
    v = np.array([[100.0, -100.0]], np.float32)
    assert _codes(v, b, 4)[0].tolist() == [0xF0]


def test_into_variants_write_preallocated_buffers(rng):
    v, b = _random_case(rng, 64, 4)
    table, ref = _window(v, b, 4, "range")
    codes = device(np.zeros(v.size // 2, np.uint8))
    assert quant_kernels.quantize_into(device(v), table, codes, bits=4) is codes
    a = device(np.full(v.shape, -1, np.float32))
    xhat, a_out, mask = quant_kernels.dequantize_into(codes, table, device(b), device(np.ones(4, np.float32)), bits=4,
                                              shape=v.shape, a=a)
    assert xhat is None and mask is None and a_out is a
    assert np.array_equal(host(a), quant.dequantize_ref(host(codes), ref, b, np.ones(4, np.float32), bits=4,
                                                        shape=v.shape)[1])


def test_float64_instantiation_matches_float32_codes(rng):
    v, b = _random_case(rng, 64, 4)
    for kind in KINDS:
        c32 = host(quant_kernels.quantize(device(v), _window(v, b, 4, kind)[0], bits=4))
        v64, b64 = v.astype(np.float64), b.astype(np.float64)
        table64 = quant_kernels.window(device(b64), bits=4, kind=kind, v=device(v64))
        c64 = host(quant_kernels.quantize(device(v64), table64, bits=4))
        assert np.array_equal(c32, c64), kind


def _table(channels, dtype=np.float32):
    return quant_kernels.window(device(np.zeros(channels, dtype)), bits=4)


@pytest.mark.parametrize("call,match", [
    (lambda: quant_kernels.quantize(device(np.zeros((3, 3), np.float32)), _table(3), bits=4), "multiples of 2"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 3), np.float32)), _table(3), bits=4), "channel count"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 4), np.float16)), _table(4), bits=4), "float32"),
    (lambda: quant_kernels.quantize(device(np.zeros((4, 4), np.float32))[:, :2], _table(2), bits=4), "C-contiguous"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 4), np.float32)), _table(3), bits=4), r"\(3, 4\)"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 4), np.float32)), _table(4), bits=3), "bits must be one of"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 4), np.float32)), _table(4), bits=True), "bits must be one of"),
    (lambda: quant_kernels.quantize(device(np.zeros((2, 4), np.float32)), _table(4, np.float64), bits=8), "float32"),
    (lambda: quant_kernels.quantize(np.zeros((2, 4), np.float32).tolist(), _table(4), bits=8), "array"),
    (lambda: quant_kernels.dequantize(device(np.zeros(3, np.uint8)), _table(4), device(np.zeros(4, np.float32)),
                                      device(np.ones(4, np.float32)), bits=4, shape=(2, 4)), "4 bytes"),
    (lambda: quant_kernels.window(device(np.zeros(4, np.float32)), bits=4, kind="range"), "give v"),
    (lambda: quant_kernels.window(device(np.zeros(4, np.float32)), bits=4, kind="sigma"), "window must be one of"),
    (lambda: quant_kernels.window(device(np.zeros((2, 4), np.float32)), bits=4), "one value per channel"),
])
def test_bad_input_is_a_value_error_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_mix_of_stores_is_said_in_one_line_and_differs_in_bits_alone():
    """quant.describe, Store.at and per_unit: the words of a memory budget's mix."""
    S = quant.Store
    assert quant.describe([S("exact")] * 3 + [S("8")] * 2 + [S("4")]) == \
        "3 units exact, 2 at 8 bits, 1 at 4 (block window)"
    assert quant.describe([S("4", rounding="stochastic")] * 2 + [S("exact")]) == \
        "1 unit exact, 2 at 4 bits (block window, stochastic rounding)"
    assert quant.describe([S("2")] * 4) == "bits 2 (block window)"
    assert S("4", "range", "stochastic", 3.0).at("exact") == S("exact")
    assert S("4", "range", "stochastic", 3.0).at("8") == S("8", "range", "stochastic", 3.0)
    assert quant.per_unit(S("4"), 3) == (S("4"),) * 3
    with pytest.raises(ValueError, match="differs in bits alone"):
        quant.per_unit([S("4"), S("4", "range")], 2)
