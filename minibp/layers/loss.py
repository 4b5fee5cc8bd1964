"""The loss: softmax cross-entropy, mean over the batch, beside kernels/loss.cu (a thread a row)."""
import numpy as np

from .. import kernels


def softmax_cross_entropy(logits, labels, *, rows, loss, accumulate=False):
    """The mean softmax cross-entropy and accuracy of logits (N, K) against labels (N,) int64: into loss (2, 2)
    float64, loss[0] = (loss, accuracy), loss[1] = them (+= with accumulate: a step's sums over its sub-batches);
    rows (N, 2) is scratch of logits' dtype (each image's loss and whether it was right)."""
    N, K = logits.shape
    module = kernels.load("loss.cu", logits.dtype)
    module.softmax_xent_rows(N=N, K=K, logits=logits, labels=labels, rows=rows, threads=N)
    module.softmax_xent_mean(N=N, accumulate=accumulate, rows=rows, loss=loss, grid=(1,), block=(1,))


def softmax_cross_entropy_backward(logits, labels, dlogits, *, scale=1.0):
    """dlogits (N, K) = scale * dL/dlogits = scale * (softmax(logits) - onehot(labels)) / N."""
    N, K = logits.shape
    kernels.load("loss.cu", logits.dtype).softmax_xent_backward(N=N, K=K, scale=scale / N, logits=logits,
                                                                labels=labels, dlogits=dlogits, threads=N)


def softmax_cross_entropy_ref(logits, labels):
    """(loss, accuracy) in float64 NumPy."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1))
    rows = np.arange(len(labels))
    return float((log_z - shifted[rows, labels]).mean()), float((logits.argmax(axis=1) == labels).mean())


def softmax_cross_entropy_backward_ref(logits, labels, *, scale=1.0):
    """dlogits in float64 NumPy."""
    logits = np.asarray(logits, np.float64)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    d = e / e.sum(axis=1, keepdims=True)
    d[np.arange(len(labels)), labels] -= 1
    return d * (scale / len(labels))
