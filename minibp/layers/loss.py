"""The loss: softmax cross-entropy, mean over a pass's images, beside kernels/loss.cu (a thread a row).

A training loss may smooth its labels (smoothing e: the target is (1 - e) onehot(y) + e / K) and weight its
classes (weights (K,): row i's loss and gradient scaled by weights[y_i], the mean still over the rows, so that
sub-batches and ranks add up to one batch's loss). Both default to off, where the arithmetic is the plain loss's.
"""
import numpy as np

from .. import kernels


def softmax_cross_entropy(logits, labels, *, rows, loss, accumulate=False, smoothing=0.0, weights=None):
    """The mean softmax cross-entropy and accuracy of logits (N, K) against labels (N,) int64: into loss (2, 2)
    float64, loss[0] = (loss, accuracy), loss[1] = them (+= with accumulate: a step's sums over its sub-batches);
    rows (N, 2) is scratch of logits' dtype (each image's loss and whether it was right). smoothing, weights (K,)
    of logits' dtype or None: the module docstring."""
    N, K = logits.shape
    module = kernels.load("loss.cu", logits.dtype)
    module.softmax_xent_rows(N=N, K=K, smoothing=float(smoothing), weights=weights, logits=logits, labels=labels,
                             rows=rows, threads=N)
    module.softmax_xent_mean(N=N, accumulate=accumulate, rows=rows, loss=loss, grid=(1,), block=(1,))


def softmax_cross_entropy_backward(logits, labels, dlogits, *, scale=1.0, smoothing=0.0, weights=None):
    """dlogits (N, K) = scale * dL/dlogits = scale * weights[y] * (softmax(logits) - target) / N."""
    N, K = logits.shape
    kernels.load("loss.cu", logits.dtype).softmax_xent_backward(
        N=N, K=K, scale=scale / N, smoothing=float(smoothing), weights=weights, logits=logits, labels=labels,
        dlogits=dlogits, threads=N)


def _targets(labels, K, smoothing):
    """(N, K) float64: (1 - smoothing) onehot(labels) + smoothing / K."""
    target = np.full((len(labels), K), smoothing / K)
    target[np.arange(len(labels)), labels] += 1 - smoothing
    return target


def softmax_cross_entropy_ref(logits, labels, *, smoothing=0.0, weights=None):
    """(loss, accuracy) in float64 NumPy: the mean over the rows of weights[y] * -sum_k target_k log p_k."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    per_row = -(_targets(labels, logits.shape[1], smoothing) * log_p).sum(axis=1)
    if weights is not None:
        per_row = per_row * np.asarray(weights, np.float64)[labels]
    return float(per_row.mean()), float((logits.argmax(axis=1) == labels).mean())


def softmax_cross_entropy_backward_ref(logits, labels, *, scale=1.0, smoothing=0.0, weights=None):
    """dlogits in float64 NumPy."""
    logits = np.asarray(logits, np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    d = e / e.sum(axis=1, keepdims=True) - _targets(labels, logits.shape[1], smoothing)
    if weights is not None:
        d = d * np.asarray(weights, np.float64)[labels][:, None]
    return d * (scale / len(labels))
