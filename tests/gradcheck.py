"""Centred finite differences in float64."""
import numpy as np


def numerical_gradient(f, x, *, h=1e-5):
    """dF/dx of the scalar f() by centred differences, perturbing the array x in place (host or device)."""
    grad = np.zeros(x.shape)
    flat = x.reshape(-1)
    for i in range(flat.size):
        old = float(flat[i])
        flat[i] = old + h
        plus = f()
        flat[i] = old - h
        minus = f()
        flat[i] = old
        grad.reshape(-1)[i] = (plus - minus) / (2 * h)
    return grad


def relative_error(analytic, numeric):
    """||a - n|| / max(||a||, ||n||), over the whole array."""
    analytic, numeric = np.asarray(analytic, np.float64), np.asarray(numeric, np.float64)
    scale = max(np.linalg.norm(analytic), np.linalg.norm(numeric), 1e-300)
    return np.linalg.norm(analytic - numeric) / scale
