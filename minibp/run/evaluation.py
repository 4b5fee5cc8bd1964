"""A net's loss, accuracy and confusion matrix over a whole split: the trainer's validations and python3 -m
minibp.evaluate.

    loss, accuracy = evaluate(net, split, mean)          # what a validation logs
    scored = scores(net, split, mean)                    # Scores: loss, accuracy, confusion
    scored.per_class()                                   # (classes,) accuracy of each class (NaN: no images)
"""
from dataclasses import dataclass

import numpy as np

from ..io import data, imagenet


@dataclass
class Scores:
    loss: float             # the mean cross-entropy
    accuracy: float
    confusion: np.ndarray   # (classes, classes) int64: images of true class i (row) predicted as j (column)

    def per_class(self):
        """(classes,) float64: each class's accuracy, the share of its images predicted as it (NaN: none)."""
        images = self.confusion.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(images > 0, np.diag(self.confusion) / images, np.nan)


def evaluate(net, split, mean, *, group=None, workers=None):
    """(loss, accuracy) of net over a whole split: scores()'s."""
    scored = scores(net, split, mean, group=group, workers=workers)
    return scored.loss, scored.accuracy


def scores(net, split, mean, *, group=None, workers=None):
    """The Scores of net (running BN statistics) over a whole split, from net.predict's logits. split: an HDF5
    split, normalised by mean, or an imagenet.Folder (center crops of the net's input size, decoded by
    `workers` processes). group (dist.py): rank r evaluates batches r, r + ranks, ...; their sums are summed
    over the ranks (each batch's from one rank: exact) and added up in batch order on every rank, so every
    rank gets one process's figures, bit for bit."""
    if isinstance(split, imagenet.Folder):
        batches = imagenet.evaluation_batches(split, batch=net.batch, size=net.input_shape[0], workers=workers)
    else:
        batches = data.evaluation_batches(split, batch=net.batch, mean=mean)
    sums = []  # (-log-likelihood, correct) of each batch
    confusion = np.zeros((net.classes, net.classes), np.float64)  # (classes, classes), this rank's batches
    for i, (images, labels) in enumerate(batches):
        if group is not None and i % group.size != group.rank:
            sums.append((0.0, 0.0))
            continue
        logits = net.predict(images).astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        predicted = logits.argmax(axis=1)
        sums.append((-float(log_p[np.arange(len(labels)), labels].sum()), int((predicted == labels).sum())))
        np.add.at(confusion, (labels, predicted), 1)
    sums = np.array(sums, np.float64).reshape(-1, 2)  # (batches, 2)
    if group is not None:  # one sum over the ranks for both (counts below 2**53: exact in float64)
        both = np.concatenate([sums.ravel(), confusion.ravel()])
        group.sum(both)
        sums, confusion = both[:sums.size].reshape(sums.shape), both[sums.size:].reshape(confusion.shape)
    total_loss = total_correct = 0.0
    for loss, correct in sums.tolist():
        total_loss += loss
        total_correct += correct
    if not np.isfinite(total_loss):
        raise FloatingPointError(f"the loss over the {split.name} split is {total_loss}")
    n = len(split.labels)
    return Scores(loss=total_loss / n, accuracy=total_correct / n, confusion=confusion.astype(np.int64))
