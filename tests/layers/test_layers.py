"""Every layer alone: kernels against their NumPy references (exactly where the arithmetic is the same),
and float64 centred-difference gradient checks of each backward pass."""
import numpy as np
import pytest

from minibp import backend, checks, kernels, layers
from conftest import device, host
from gradcheck import numerical_gradient, relative_error

CONV_CASES = [  # (H, W, Cin, Cout, kernel, stride, padding)
    (5, 5, 3, 4, 3, 1, "same"), (6, 6, 2, 3, 3, 2, "same"), (7, 5, 2, 3, 3, 2, "valid"),
    (5, 5, 3, 4, 1, 1, "same"), (6, 6, 3, 2, 1, 2, "same"), (6, 6, 2, 2, 5, 1, "same"), (4, 4, 2, 2, 2, 2, "same"),
]


def _rand(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_im2col_and_col2im_equal_their_references_exactly(rng, case, dtype):
    H, W, cin, cout, k, s, padding = case
    conv = layers.Conv2D((H, W, cin), cout, kernel=k, stride=s, padding=padding)
    x = _rand(rng, (2, H, W, cin), dtype)
    rows, cols = 2 * conv.Ho * conv.Wo, k * k * cin
    col = device(np.zeros((rows, cols), dtype))
    module = kernels.load("conv.cu", dtype)
    geometry = dict(N=2, H=H, W=W, C=cin, kh=k, kw=k, stride=s, pad_top=conv.pad_top, pad_left=conv.pad_left,
                    Ho=conv.Ho, Wo=conv.Wo)
    module.im2col(**geometry, x=device(x), col=col, threads=rows * k * k)
    assert np.array_equal(host(col), layers.im2col_ref(x, k, k, s, conv.pad_top, conv.pad_left, conv.Ho, conv.Wo))
    dcol = _rand(rng, (rows, cols), dtype)
    for accumulate in (False, True):
        dx = _rand(rng, x.shape, dtype)
        want = layers.col2im_ref(dcol, x.shape, k, k, s, conv.pad_top, conv.pad_left, conv.Ho, conv.Wo)
        if accumulate:
            want = dx + want  # (dx: a host array)
        dx_device = device(dx)
        module.col2im(**geometry, accumulate=accumulate, col=device(dcol), dx=dx_device, threads=2 * H * W)
        np.testing.assert_allclose(host(dx_device), want, rtol=1e-6 if dtype == np.float32 else 1e-14,
                                   atol=1e-6 if dtype == np.float32 else 1e-14)
        if not accumulate:
            assert np.array_equal(host(dx_device), want)


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_gradients_match_finite_differences(rng, case):
    H, W, cin, cout, k, s, padding = case
    conv = layers.Conv2D((H, W, cin), cout, kernel=k, stride=s, padding=padding, bias=True)
    x, w, bias = (device(_rand(rng, sh)) for sh in [(2, H, W, cin), conv.weight_shape, (cout,)])
    y = device(np.zeros((2,) + conv.out_shape))
    col = device(np.zeros(int(np.prod(conv.workspace_shape(2, accumulate_dx=True))) or 1))
    probe = device(_rand(rng, (2,) + conv.out_shape))  # L = sum(y * probe)

    def loss():
        conv.forward(x, w, bias, y, col=col)
        return float((y * probe).sum())

    loss()
    want = layers.im2col_ref(host(x), k, k, s, conv.pad_top, conv.pad_left, conv.Ho, conv.Wo) @ host(w).reshape(
        cout, -1).T + host(bias)
    np.testing.assert_allclose(host(y).reshape(-1, cout), want, rtol=1e-12, atol=1e-12)
    dw, db, dx = device(np.zeros(conv.weight_shape)), device(np.zeros(cout)), device(np.zeros(x.shape))
    conv.backward(x, w, probe, dw=dw, dbias=db, dx=dx, col=col)
    for name, analytic, array in (("w", dw, w), ("bias", db, bias), ("x", dx, x)):
        assert relative_error(host(analytic), numerical_gradient(loss, array)) < 1e-8, name
    # accumulate_dx adds the data gradient into what dx holds
    dx2 = device(np.ones(x.shape))
    conv.backward(x, w, probe, dw=dw, dbias=db, dx=dx2, accumulate_dx=True, col=col)
    np.testing.assert_allclose(host(dx2), host(dx) + 1, rtol=1e-12, atol=1e-12)


def _bn_case(rng, shape, dtype=np.float64):
    C = shape[-1]
    x = _rand(rng, shape, dtype) * 2 + 0.5
    gamma = (np.abs(_rand(rng, C)) + 0.5).astype(dtype)
    beta = _rand(rng, C, dtype) * 0.5
    return x, gamma, beta


def _bn_forward(x, gamma, beta, stats, a, eps=1e-5, **store):
    rows = x.size // x.shape[-1]
    partial = device(np.zeros(2 * layers.reduction_chunks(rows) * x.shape[-1], x.dtype))
    part = layers.batchnorm_statistics(x, partial=partial)
    layers.batchnorm_finish(gamma, beta, stats, eps=eps, part=part, rows=rows, bits=store.get("bits", 0),
                            windows=store.get("windows"))
    layers.batchnorm_relu_forward(x, stats, beta, a, **store)
    return partial


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batchnorm_relu_forward_matches_reference(rng, dtype):
    x, gamma, beta = _bn_case(rng, (4, 5, 3, 6), dtype)
    stats, a = device(np.zeros((layers.STATS_ROWS, 6), dtype)), device(np.zeros(x.shape, dtype))
    copy = device(np.zeros(x.shape, dtype))
    _bn_forward(device(x), device(gamma), device(beta), stats, a, bits=0, x_copy=copy)
    a_ref, _, mean, sigma = layers.batchnorm_relu_forward_ref(x.astype(np.float64), gamma, beta, eps=1e-5)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(host(a), a_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(host(stats)[:2], [mean, sigma], rtol=tol, atol=tol)
    assert np.array_equal(host(copy), x)  # the exact store is x itself


def test_batchnorm_relu_gradients_match_finite_differences(rng):
    x, gamma, beta = (device(v) for v in _bn_case(rng, (3, 4, 4, 4)))
    stats, a, dx = device(np.zeros((layers.STATS_ROWS, 4))), device(np.zeros(x.shape)), device(np.zeros(x.shape))
    probe = device(_rand(rng, x.shape))
    copy = device(np.zeros(x.shape))

    def loss():
        _bn_forward(x, gamma, beta, stats, a, bits=0, x_copy=copy)
        return float((a * probe).sum())

    loss()
    assert float(backend.xp.abs(a[a > 0]).min()) > 1e-3  # away from the ReLU kink
    dgamma, dbeta = device(np.zeros(4)), device(np.zeros(4))
    partial = device(np.zeros(2 * layers.reduction_chunks(48) * 4))
    sums = device(np.zeros((2, 4)))
    layers.batchnorm_relu_backward(probe, stats, beta, dx, bits=0, x_copy=copy, dgamma=dgamma, dbeta=dbeta,
                                   partial=partial, sums=sums)
    for name, analytic, array in (("gamma", dgamma, gamma), ("beta", dbeta, beta), ("x", dx, x)):
        assert relative_error(host(analytic), numerical_gradient(loss, array)) < 1e-7, name
    # the reference backward agrees too
    _, xhat, _, sigma = layers.batchnorm_relu_forward_ref(host(x), host(gamma), host(beta), eps=1e-5)
    ref_dx, ref_dgamma, ref_dbeta = layers.batchnorm_relu_backward_ref(host(probe), xhat, host(a) > 0, host(gamma),
                                                                       sigma)
    np.testing.assert_allclose(host(dx), ref_dx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(host(dgamma), ref_dgamma, rtol=1e-10)


def test_batchnorm_relu_backward_adds_the_residual_gradient(rng):
    x, gamma, beta = (device(v) for v in _bn_case(rng, (2, 3, 3, 4)))
    stats, a, copy = device(np.zeros((layers.STATS_ROWS, 4))), device(np.zeros(x.shape)), device(np.zeros(x.shape))
    partial = _bn_forward(x, gamma, beta, stats, a, bits=0, x_copy=copy)
    da, residual = device(_rand(rng, x.shape)), device(_rand(rng, x.shape))
    outputs = []
    for extra in (None, residual):
        dx, dg, db = device(np.zeros(x.shape)), device(np.zeros(4)), device(np.zeros(4))
        layers.batchnorm_relu_backward(da, stats, beta, dx, bits=0, x_copy=copy, dgamma=dg, dbeta=db,
                                       partial=partial, sums=device(np.zeros((2, 4))), residual_grad=extra)
        outputs.append(host(dx))
    np.testing.assert_allclose(outputs[1], outputs[0] + host(residual), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_batchnorm_store_codes_equal_quantize_of_v(rng, bits):
    """The fused forward writes the codes quant.quantize_ref would write for v = xhat + b."""
    from minibp import quant
    x, gamma, beta = _bn_case(rng, (4, 4, 4, 8), np.float32)
    stats, a = device(np.zeros((layers.STATS_ROWS, 8), np.float32)), device(np.zeros(x.shape, np.float32))
    codes, windows = device(np.zeros(x.size * bits // 8, np.uint8)), device(np.zeros((1, 3, 8), np.float32))
    _bn_forward(device(x), device(gamma), device(beta), stats, a, bits=bits, codes=codes, windows=windows)
    s, window = host(stats), host(windows)[0]
    v = ((x - s[0]) / s[1] + s[3]).astype(np.float32)
    assert np.array_equal(window, quant.window_ref(s[3], bits=bits))
    assert np.array_equal(host(codes), quant.quantize_ref(v, window, bits=bits))
    # and the backward restores a~ exactly as quant.dequantize_ref does
    restored = device(np.zeros(x.shape, np.float32))
    layers.batchnorm_relu_restore(stats, device(beta), restored, bits=bits, codes=codes, windows=windows)
    assert np.array_equal(host(restored), quant.dequantize_ref(host(codes), window, s[3], s[2], bits=bits,
                                                                          shape=x.shape)[1])


POOL_CASES = [(layers.MaxPool, dict(kernel=3, stride=2, padding="same"), (7, 6, 3)),
              (layers.MaxPool, dict(kernel=3, stride=2, padding="same"), (8, 8, 2)),
              (layers.MaxPool, dict(kernel=2, stride=1, padding="valid"), (5, 5, 2)),
              (layers.AvgPool, dict(kernel=2, stride=2), (6, 4, 3)),
              (layers.AvgPool, dict(kernel=3, stride=1), (5, 5, 2))]


@pytest.mark.parametrize("cls,options,shape", POOL_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pooling_kernels_equal_references(rng, cls, options, shape, dtype):
    pool = cls(shape, **options)
    x = _rand(rng, (2,) + shape, dtype)
    y = device(np.zeros((2,) + pool.out_shape, dtype))
    pool.forward(device(x), y)
    kind = "max" if cls is layers.MaxPool else "avg"
    want = layers.pool_ref(x, pool.size, pool.stride, pool.pad_top, pool.pad_left, pool.Ho, pool.Wo, kind=kind)
    if kind == "max":
        assert np.array_equal(host(y), want)
    else:
        np.testing.assert_allclose(host(y), want, rtol=1e-6 if dtype == np.float32 else 1e-15)
    dy = _rand(rng, y.shape, dtype)
    dx = device(np.zeros(x.shape, dtype))
    pool.backward(device(x), device(dy), dx)
    if kind == "max":
        assert np.array_equal(host(dx), layers.maxpool_backward_ref(x, dy, pool.size, pool.stride, pool.pad_top,
                                                                    pool.pad_left))
    else:  # each output's gradient spread evenly over its (valid, unpadded) window
        k, s = pool.size, pool.stride
        want_dx = np.zeros_like(x)
        for i in range(pool.Ho):
            for j in range(pool.Wo):
                want_dx[:, i * s:i * s + k, j * s:j * s + k] += dy[:, i:i + 1, j:j + 1] / (k * k)
        np.testing.assert_allclose(host(dx), want_dx, rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-7)


@pytest.mark.parametrize("cls,options,shape", POOL_CASES + [(layers.GlobalAvgPool, {}, (3, 4, 2))])
def test_pooling_gradients_match_finite_differences(rng, cls, options, shape):
    pool = cls(shape, **options)
    x = device(_rand(rng, (2,) + shape))
    y = device(np.zeros((2,) + pool.out_shape))
    probe = device(_rand(rng, y.shape))

    def loss():
        pool.forward(x, y)
        return float((y * probe).sum())

    dx = device(np.zeros(x.shape))
    pool.backward(x, probe, dx)
    assert relative_error(host(dx), numerical_gradient(loss, x)) < 1e-8


def test_maxpool_ties_go_to_the_first_maximum():
    pool = layers.MaxPool((2, 2, 1), kernel=2, stride=2, padding="valid")
    x = device(np.ones((1, 2, 2, 1)))
    dx = device(np.zeros((1, 2, 2, 1)))
    pool.backward(x, device(np.full((1, 1, 1, 1), 5.0)), dx)
    assert host(dx).ravel().tolist() == [5, 0, 0, 0]


@pytest.mark.parametrize("in_shape,out_shape", [((4, 4, 2), (2, 2, 4)), ((4, 4, 3), (4, 4, 3)), ((6, 6, 2), (3, 3, 2))])
def test_parameter_free_shortcut(rng, in_shape, out_shape):
    shortcut = layers.ParameterFreeShortcut(in_shape, out_shape)
    r = device(_rand(rng, (2,) + in_shape))
    base = _rand(rng, (2,) + out_shape)
    x = device(base.copy())
    probe = device(_rand(rng, x.shape))
    shortcut.add(r, x)
    s = in_shape[0] // out_shape[0]
    pooled = layers.pool_ref(host(r), s, s, 0, 0, out_shape[0], out_shape[1], kind="avg")
    want = base.copy()
    want[..., : in_shape[2]] += pooled
    np.testing.assert_allclose(host(x), want, rtol=1e-12)

    def loss():
        out = device(base.copy())
        shortcut.add(r, out)
        return float((out * probe).sum())

    dr = device(np.zeros(r.shape))
    shortcut.backward(probe, dr)
    assert relative_error(host(dr), numerical_gradient(loss, r)) < 1e-8


def test_parameter_free_shortcut_refuses_shapes_it_cannot_map():
    with pytest.raises(ValueError, match="projection"):
        layers.ParameterFreeShortcut((4, 4, 8), (2, 2, 4))
    with pytest.raises(ValueError, match="projection"):
        layers.ParameterFreeShortcut((5, 5, 2), (2, 2, 2))


def _softmax_cross_entropy(logits, labels):
    """(loss, accuracy) through the kernels."""
    loss, rows = device(np.zeros((2, 2))), device(np.zeros((len(labels), 2), logits.dtype))
    layers.softmax_cross_entropy(logits, labels, rows=rows, loss=loss)
    return tuple(float(v) for v in host(loss)[0])


def test_softmax_cross_entropy_gradient_and_values(rng):
    logits = device(_rand(rng, (5, 4)) * 3)
    labels = device(np.array([0, 3, 1, 1, 2]))
    loss = lambda: _softmax_cross_entropy(logits, labels)[0]  # noqa: E731
    dlogits = device(np.zeros((5, 4)))
    layers.softmax_cross_entropy_backward(logits, labels, dlogits, scale=2.0)
    assert relative_error(host(dlogits), 2 * numerical_gradient(loss, logits)) < 1e-8
    np.testing.assert_allclose(host(dlogits), layers.softmax_cross_entropy_backward_ref(host(logits), host(labels),
                                                                                       scale=2.0), rtol=1e-12)
    assert np.allclose(_softmax_cross_entropy(logits, labels), layers.softmax_cross_entropy_ref(host(logits),
                                                                                                host(labels)))


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy_smoothed_and_weighted(rng, smoothing, weighted):
    """A training loss's label smoothing and class weights: the kernels' loss and gradient equal their float64
    NumPy references, and the gradient is the loss's (a numerical derivative)."""
    logits = device(_rand(rng, (6, 4)) * 3)
    labels = device(np.array([0, 3, 1, 1, 2, 3]))
    weights = device(np.array([0.5, 2.0, 1.0, 0.25])) if weighted else None
    options = dict(smoothing=smoothing, weights=weights)
    ref_options = dict(smoothing=smoothing, weights=None if weights is None else host(weights))

    def loss():
        total, rows = device(np.zeros((2, 2))), device(np.zeros((6, 2)))
        layers.softmax_cross_entropy(logits, labels, rows=rows, loss=total, **options)
        return float(host(total)[0, 0])
    dlogits = device(np.zeros((6, 4)))
    layers.softmax_cross_entropy_backward(logits, labels, dlogits, scale=2.0, **options)
    assert relative_error(host(dlogits), 2 * numerical_gradient(loss, logits)) < 1e-8
    np.testing.assert_allclose(host(dlogits), layers.softmax_cross_entropy_backward_ref(
        host(logits), host(labels), scale=2.0, **ref_options), rtol=1e-12, atol=1e-15)
    assert loss() == pytest.approx(layers.softmax_cross_entropy_ref(host(logits), host(labels), **ref_options)[0],
                                   rel=1e-12)


def test_softmax_cross_entropy_weights_of_one_change_nothing(rng):
    """Weights of 1 (and smoothing 0) give the plain loss's bits: the options cost a run without them nothing."""
    logits = device(_rand(rng, (5, 3)).astype(np.float32))
    labels = device(np.array([0, 2, 1, 1, 0]))
    results = []
    for weights in (None, device(np.ones(3, np.float32))):
        total, rows, d = (device(np.zeros((2, 2))), device(np.zeros((5, 2), np.float32)),
                          device(np.zeros((5, 3), np.float32)))
        layers.softmax_cross_entropy(logits, labels, rows=rows, loss=total, weights=weights)
        layers.softmax_cross_entropy_backward(logits, labels, d, weights=weights)
        results.append((host(total).copy(), host(d).copy()))
    assert all(np.array_equal(a, b) for a, b in zip(*results))


def test_softmax_cross_entropy_sums_its_passes_and_takes_the_first_maximum():
    """loss[1] takes the first pass's (loss, accuracy), whatever it held, and adds the others': a step's sums over
    its sub-batches; a tie, or a NaN, counts as NumPy's argmax counts it (the first maximum, the first NaN)."""
    logits = device(np.array([[1, 3, 3], [2, 2, 0], [0, np.nan, 5]], np.float32))
    labels = device(np.array([2, 0, 2]))
    loss, rows = device(np.full((2, 2), 7.0)), device(np.zeros((3, 2), np.float32))
    for accumulate in (False, True):
        layers.softmax_cross_entropy(logits, labels, rows=rows, loss=loss, accumulate=accumulate)
    assert host(rows)[:, 1].tolist() == [0, 1, 0]
    assert host(loss)[0, 1] == 1 / 3 and host(loss)[1, 1] == 2 / 3 and np.isnan(host(loss)[0, 0])


def test_labels_are_checked():
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        checks.check_labels(np.array([0, 4]), 2, 4)
    with pytest.raises(ValueError, match="integers"):
        checks.check_labels(np.array([0.0, 1.0]), 2, 4)
    with pytest.raises(ValueError, match="shape"):
        checks.check_labels(np.array([0, 1, 2]), 2, 4)


def test_conv_refuses_bad_configuration():
    with pytest.raises(ValueError, match="padding"):
        layers.Conv2D((4, 4, 2), 2, padding="full")
    with pytest.raises(ValueError, match="does not fit"):
        layers.Conv2D((2, 2, 2), 2, kernel=3, padding="valid")
    with pytest.raises(ValueError, match="positive"):
        layers.Conv2D((4, 4, 2), 0)
