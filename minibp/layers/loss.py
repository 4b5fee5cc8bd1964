"""The loss: softmax cross-entropy, mean over the batch (through xp: a few reductions on (N, classes))."""
from .. import backend

def softmax_cross_entropy(logits, labels):
    """(loss, accuracy) as device scalars: mean softmax cross-entropy of logits (N, K), labels (N,)."""
    xp = backend.xp
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = xp.log(xp.exp(shifted).sum(axis=1))
    loss = (log_z - shifted[xp.arange(logits.shape[0]), labels]).mean()
    accuracy = (logits.argmax(axis=1) == labels).mean()
    return loss, accuracy


def softmax_cross_entropy_backward(logits, labels, dlogits, *, scale=1.0):
    """dlogits (N, K) = scale * dL/dlogits = scale * (softmax(logits) - onehot(labels)) / N."""
    xp = backend.xp
    n = logits.shape[0]
    xp.subtract(logits, logits.max(axis=1, keepdims=True), out=dlogits)
    xp.exp(dlogits, out=dlogits)
    dlogits /= dlogits.sum(axis=1, keepdims=True)
    dlogits[xp.arange(n), labels] -= 1
    dlogits *= scale / n
