"""Ordinary backprop of a minibp Net in plain NumPy: every activation kept, every layer from the
*_ref functions in minibp.layers. The tests compare the engine's exact mode against it."""
import numpy as np

from minibp import backend, layers
from minibp.params import key


def _conv(conv, x, w, bias):
    col = layers.im2col_ref(x, conv.kh, conv.kw, conv.stride, conv.pad_top, conv.pad_left, conv.Ho, conv.Wo)
    y = col @ w.reshape(conv.cout, -1).T
    if bias is not None:
        y = y + bias
    return y.reshape(x.shape[0], conv.Ho, conv.Wo, conv.cout), col


def _conv_backward(conv, x_shape, col, w, dy):
    dy2 = dy.reshape(-1, conv.cout)
    dw = (dy2.T @ col).reshape(w.shape)
    dcol = dy2 @ w.reshape(conv.cout, -1)
    dx = layers.col2im_ref(dcol, x_shape, conv.kh, conv.kw, conv.stride, conv.pad_top, conv.pad_left, conv.Ho,
                           conv.Wo)
    return dx, dw, dy2.sum(axis=0)


def _pool(pool, a):
    if isinstance(pool, layers.GlobalAvgPool):
        return a.mean(axis=(1, 2), keepdims=True)
    kind = "max" if isinstance(pool, layers.MaxPool) else "avg"
    return layers.pool_ref(a, pool.size, pool.stride, pool.pad_top, pool.pad_left, pool.Ho, pool.Wo, kind=kind)


def _pool_backward(pool, a, dy):
    if isinstance(pool, layers.GlobalAvgPool):
        return np.broadcast_to(dy / (a.shape[1] * a.shape[2]), a.shape).copy()
    if isinstance(pool, layers.MaxPool):
        return layers.maxpool_backward_ref(a, dy, pool.size, pool.stride, pool.pad_top, pool.pad_left)
    return _avgpool_backward(pool.size, pool.stride, a.shape, dy)


def _avgpool_backward(k, stride, x_shape, dy):
    dx = np.zeros(x_shape, dy.dtype)
    C = x_shape[3]
    for i in range(k):
        for j in range(k):
            dx[:, i::stride, j::stride][:, : dy.shape[1], : dy.shape[2]] += dy[..., :C] / (k * k)
    return dx


def _shortcut(shortcut, r):
    s, (Ho, Wo, Co) = shortcut.stride, (shortcut.pool.Ho, shortcut.pool.Wo, shortcut.pool.Cy)
    pooled = layers.pool_ref(r, s, s, 0, 0, Ho, Wo, kind="avg")
    out = np.zeros(pooled.shape[:3] + (Co,), r.dtype)
    out[..., : r.shape[3]] = pooled
    return out


def forward_backward(net, images, labels):
    """(loss, {param name: gradient}, dL/dimages) of ordinary backprop with batch statistics."""
    p = {k: backend.to_host(v).astype(np.float64) for k, v in net.param_views.items()}
    x = images.astype(np.float64)
    n = x.shape[0]
    caches, residual = [], None
    for u in net.units:
        if u.shortcut is not None:
            x = x + _shortcut(u.shortcut, residual)
        elif u.adds_projection:
            x = x + residual
        if u.saves_input:
            residual = x
        cache = {"x": x}
        if u.batchnorm:
            a, xhat, _, sigma = layers.batchnorm_relu_forward_ref(x, p[key(u.index, "gamma")], p[key(u.index, "beta")], eps=net.eps)
            cache.update(xhat=xhat, sigma=sigma, mask=(a > 0))
        else:
            a = x
        cache["a"] = a
        conv_in = _pool(u.pool, a) if u.pool is not None else a
        cache["conv_in"] = conv_in
        x, cache["col"] = _conv(u.conv, conv_in, p[key(u.index, "w")], p.get(key(u.index, "bias")))
        if u.projection is not None:
            residual, cache["projection_col"] = _conv(u.projection, conv_in, p[key(u.index, "projection")], None)
        caches.append(cache)
    logits = x.reshape(n, -1)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1))
    loss = float((log_z - shifted[np.arange(n), labels]).mean())
    dlogits = np.exp(shifted - log_z[:, None])
    dlogits[np.arange(n), labels] -= 1
    dy = (dlogits / n).reshape(x.shape)

    grads, dresidual = {}, None
    for u, cache in zip(reversed(net.units), reversed(caches)):
        dconv_in, grads[key(u.index, "w")], dbias = _conv_backward(u.conv, cache["conv_in"].shape, cache["col"],
                                                             p[key(u.index, "w")], dy)
        if u.conv.has_bias:
            grads[key(u.index, "bias")] = dbias
        if u.projection is not None:
            dproj_in, grads[key(u.index, "projection")], _ = _conv_backward(
                u.projection, cache["conv_in"].shape, cache["projection_col"], p[key(u.index, "projection")], dresidual)
            dconv_in = dconv_in + dproj_in
        da = _pool_backward(u.pool, cache["a"], dconv_in) if u.pool is not None else dconv_in
        if u.batchnorm:
            dx, grads[key(u.index, "gamma")], grads[key(u.index, "beta")] = layers.batchnorm_relu_backward_ref(
                da, cache["xhat"], cache["mask"], p[key(u.index, "gamma")], cache["sigma"])
        else:
            dx = da
        if u.saves_input:
            dx = dx + dresidual
        if u.shortcut is not None:
            s = u.shortcut
            dresidual = _avgpool_backward(s.stride, s.stride, (n,) + s.in_shape, dx)
        elif u.adds_projection:
            dresidual = dx
        dy = dx
    return loss, grads, dy
