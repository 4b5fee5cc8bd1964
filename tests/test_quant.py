"""The k-bit store: kernels byte-identical to the NumPy reference, and the properties minibp/quant.py states."""
import numpy as np
import pytest

from minibp import quant
from conftest import device, host

BITS = [2, 4, 8]


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


@pytest.mark.parametrize("bits", BITS)
def test_codes_byte_identical_to_reference_on_random_data(rng, bits):
    v, b = _random_case(rng, 4096, 16)
    codes = quant.quantize(device(v), device(b), bits=bits)
    assert codes.dtype == np.uint8 and codes.shape == (v.size * bits // 8,)
    assert np.array_equal(host(codes), quant.quantize_ref(v, b, bits=bits))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("b_value", [0.0, 1.0, -1.0, 2.9, -2.9, 5.0, -5.0, 1e-30, 1e8, -1e8, 1e30, -1e30])
def test_codes_byte_identical_on_hard_cases(bits, b_value):
    per_byte = 8 // bits
    values = _edge_values(bits)
    values = np.concatenate([values, values + np.float32(b_value)])
    values = values[: len(values) // per_byte * per_byte]
    channels = per_byte  # one row per value group; every channel gets the same b
    v = np.ascontiguousarray(np.resize(values, (len(values) // channels, channels)))
    b = np.full(channels, b_value, np.float32)
    assert np.array_equal(host(quant.quantize(device(v), device(b), bits=bits)), quant.quantize_ref(v, b, bits=bits))


def test_b_from_tiny_and_huge_gamma(rng):
    """b = beta / gamma for gamma at the 1e-8 clamp and for huge gamma."""
    gamma = np.array([1e-8, 1e-8, 1e8, 1e8, 1.0, 1e-8], np.float32)
    beta = np.array([0.5, -0.5, 0.5, -0.5, 0.0, 0.0], np.float32)
    b = (beta / gamma).astype(np.float32)
    v, _ = _random_case(rng, 512, 6)
    v = (v + b).astype(np.float32)
    for bits in BITS:
        if 6 % (8 // bits) == 0:
            assert np.array_equal(host(quant.quantize(device(v), device(b), bits=bits)),
                                  quant.quantize_ref(v, b, bits=bits))


@pytest.mark.parametrize("bits", BITS)
def test_every_accepted_channel_count(rng, bits):
    per_byte = 8 // bits
    for channels in range(per_byte, 41, per_byte):
        v, b = _random_case(rng, 8, channels)
        assert np.array_equal(host(quant.quantize(device(v), device(b), bits=bits)),
                              quant.quantize_ref(v, b, bits=bits)), channels


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_identical_to_reference(rng, bits):
    v, b = _random_case(rng, 1024, 8)
    gamma = np.abs(rng.standard_normal(8)).astype(np.float32) + np.float32(0.1)
    codes = quant.quantize_ref(v, b, bits=bits)
    outputs = quant.dequantize(device(codes), device(b), device(gamma), bits=bits, shape=v.shape)
    for name, got, want in zip(("xhat", "a", "mask"), outputs,
                               quant.dequantize_ref(codes, b, gamma, bits=bits, shape=v.shape)):
        assert np.array_equal(host(got), want), name


@pytest.mark.parametrize("bits", BITS)
def test_mask_is_exact_and_error_is_half_a_bin_inside_the_window(rng, bits):
    K = 1 << bits
    v, b = _random_case(rng, 4096, 8)
    v[::7] = 0.0
    v[1::11] = np.float32(1e-6)
    gamma = np.ones(8, np.float32)
    xhat, a, mask = (host(x) for x in quant.dequantize(quant.quantize(device(v), device(b), bits=bits),
                                                      device(b), device(gamma), bits=bits, shape=v.shape))
    # mask = (v >= 1e-6) in float32: the ReLU's sign, with the reference's 1e-6 guard
    assert np.array_equal(mask.astype(bool), v >= np.float32(1e-6))
    assert np.all((a > 0) == mask.astype(bool))  # a~ is zero exactly where the mask is
    vhat = xhat + b
    shift = quant.shift_ref(b, bits=bits)
    lo, hi = (0 - shift) * 6 / K, (K - shift) * 6 / K  # the window of each channel
    inside = (v >= lo) & (v < hi - 1e-5)
    assert inside.mean() > 0.5
    assert np.all(np.abs(vhat - v)[inside] <= 3 / K + 1e-5)


def test_mask_stays_exact_for_very_negative_b():
    """minibp caps shift at K-1 so that zero stays a bin edge even when b pushes it out of the window."""
    b = np.full(2, -10.0, np.float32)
    v = np.array([[-12, -10], [-1e-7, 1e-6], [0.5, 3.0], [1e-3, 20.0]], np.float32)
    _, _, mask = quant.dequantize(quant.quantize(device(v), device(b), bits=4), device(b),
                                  device(np.ones(2, np.float32)), bits=4, shape=v.shape)
    assert np.array_equal(host(mask).astype(bool), v >= np.float32(1e-6))


def test_nan_and_inf_codes_match_the_reference():
    v = np.array([[np.nan, np.inf], [-np.inf, 0.0]], np.float32)
    b = np.zeros(2, np.float32)
    for bits in BITS:
        if 2 % (8 // bits) == 0:
            assert np.array_equal(host(quant.quantize(device(v), device(b), bits=bits)),
                                  quant.quantize_ref(v, b, bits=bits))


def test_nibble_order_high_first():
    b = np.zeros(2, np.float32)
    v = np.array([[-100.0, 100.0]], np.float32)  # codes 0 and 15
    assert host(quant.quantize(device(v), device(b), bits=4)).tolist() == [0x0F]
    v = np.array([[100.0, -100.0]], np.float32)
    assert host(quant.quantize(device(v), device(b), bits=4)).tolist() == [0xF0]


def test_into_variants_write_preallocated_buffers(rng):
    v, b = _random_case(rng, 64, 4)
    codes = device(np.zeros(v.size // 2, np.uint8))
    assert quant.quantize_into(device(v), device(b), codes, bits=4) is codes
    a = device(np.full(v.shape, -1, np.float32))
    xhat, a_out, mask = quant.dequantize_into(codes, device(b), device(np.ones(4, np.float32)), bits=4,
                                              shape=v.shape, a=a)
    assert xhat is None and mask is None and a_out is a
    assert np.array_equal(host(a), quant.dequantize_ref(host(codes), b, np.ones(4, np.float32), bits=4,
                                                        shape=v.shape)[1])


def test_float64_instantiation_matches_float32_codes(rng):
    v, b = _random_case(rng, 64, 4)
    c32 = host(quant.quantize(device(v), device(b), bits=4))
    c64 = host(quant.quantize(device(v.astype(np.float64)), device(b.astype(np.float64)), bits=4))
    assert np.array_equal(c32, c64)


@pytest.mark.parametrize("call,match", [
    (lambda: quant.quantize(device(np.zeros((3, 3), np.float32)), device(np.zeros(3, np.float32)), bits=4),
     "multiples of 2"),
    (lambda: quant.quantize(device(np.zeros((2, 3), np.float32)), device(np.zeros(3, np.float32)), bits=4),
     "channel count"),
    (lambda: quant.quantize(device(np.zeros((2, 4), np.float16)), device(np.zeros(4, np.float16)), bits=4),
     "float32"),
    (lambda: quant.quantize(device(np.zeros((4, 4), np.float32))[:, :2], device(np.zeros(2, np.float32)), bits=4),
     "C-contiguous"),
    (lambda: quant.quantize(device(np.zeros((2, 4), np.float32)), device(np.zeros(3, np.float32)), bits=4),
     r"shape \(4,\)"),
    (lambda: quant.quantize(device(np.zeros((2, 4), np.float32)), device(np.zeros(4, np.float32)), bits=3),
     "bits must be one of"),
    (lambda: quant.quantize(device(np.zeros((2, 4), np.float32)), device(np.zeros(4, np.float32)), bits=True),
     "bits must be one of"),
    (lambda: quant.quantize(device(np.zeros((2, 4), np.float32)), device(np.zeros(4, np.float64)), bits=8),
     "dtype"),
    (lambda: quant.quantize(np.zeros((2, 4), np.float32).tolist(), device(np.zeros(4, np.float32)), bits=8),
     "array"),
    (lambda: quant.dequantize(device(np.zeros(3, np.uint8)), device(np.zeros(4, np.float32)),
                              device(np.ones(4, np.float32)), bits=4, shape=(2, 4)), "4 bytes"),
])
def test_bad_input_is_a_value_error_naming_the_problem(call, match):
    with pytest.raises(ValueError, match=match):
        call()
