"""A net's loss and accuracy over a whole split: the trainer's validations and python3 -m minibp.evaluate."""
import numpy as np

from ..io import data, imagenet


def evaluate(net, split, mean, *, group=None, workers=None):
    """(loss, accuracy) of net (running BN statistics) over a whole split, from net.predict's logits. split:
    an HDF5 split, normalised by mean, or an imagenet.Folder (center crops of the net's input size, decoded
    by `workers` processes). group (dist.py): rank r evaluates batches r, r + ranks, ...; their sums are
    summed over the ranks (each batch's from one rank: exact) and added up in batch order on every rank,
    so every rank gets one process's figures, bit for bit."""
    if isinstance(split, imagenet.Folder):
        batches = imagenet.evaluation_batches(split, batch=net.batch, size=net.input_shape[0], workers=workers)
    else:
        batches = data.evaluation_batches(split, batch=net.batch, mean=mean)
    sums = []  # (-log-likelihood, correct) of each batch
    for i, (images, labels) in enumerate(batches):
        if group is not None and i % group.size != group.rank:
            sums.append((0.0, 0.0))
            continue
        logits = net.predict(images).astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        sums.append((-float(log_p[np.arange(len(labels)), labels].sum()), int((logits.argmax(axis=1) == labels).sum())))
    sums = np.array(sums, np.float64).reshape(-1, 2)  # (batches, 2)
    if group is not None:
        group.sum(sums)
    total_loss = total_correct = 0.0
    for loss, correct in sums.tolist():
        total_loss += loss
        total_correct += correct
    if not np.isfinite(total_loss):
        raise FloatingPointError(f"the loss over the {split.name} split is {total_loss}")
    return total_loss / len(split.labels), total_correct / len(split.labels)
