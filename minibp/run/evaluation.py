"""A net's loss, accuracy, top-k accuracy and confusion matrix over a whole split, and the per-class figures
of a confusion matrix: the trainer's validations and python3 -m minibp.evaluate.

    loss, accuracy = evaluate(net, split, mean)          # what a validation logs
    scored = scores(net, split, mean, top_k=5)           # Scores: loss, accuracy, top_k_accuracy, confusion
    scored.per_class()                                   # (classes,) accuracy of each class (NaN: no images)
    figures = class_metrics(scored.confusion)            # ClassMetrics: precision, recall, F1, their macro means

A figure with nothing to divide by is NaN, never 0: a class never predicted has no precision, one without
images no recall, and one with neither no F1. A macro mean is over the classes whose figure is defined
(ClassMetrics.counted says how many), so an undefined precision neither counts as 0 nor stops the mean.
"""
from dataclasses import dataclass

import numpy as np

from ..io import imagenet
from ..io.batches import evaluation_batches


@dataclass
class Scores:
    loss: float             # the mean cross-entropy
    accuracy: float
    confusion: np.ndarray   # (classes, classes) int64: images of true class i (row) predicted as j (column)
    top_k: int = None       # the k of top_k_accuracy (None: not scored)
    top_k_accuracy: float = None  # the share of images whose label is among the k highest logits

    def per_class(self):
        """(classes,) float64: each class's accuracy, the share of its images predicted as it (NaN: none)."""
        return class_metrics(self.confusion).recall


@dataclass
class ClassMetrics:
    """Each class's figures from a confusion matrix ((classes,) float64, NaN where undefined) and their macro
    means (over the classes where defined; NaN where none is)."""
    precision: np.ndarray   # of the images predicted as the class, the share that are (NaN: never predicted)
    recall: np.ndarray      # of the class's images, the share predicted as it: its accuracy (NaN: no images)
    f1: np.ndarray          # 2 TP / (2 TP + FP + FN), their harmonic mean (NaN: neither images nor predictions)
    images: np.ndarray      # (classes,) int64: the class's images (its support)
    predicted: np.ndarray   # (classes,) int64: the images predicted as it

    def macro(self, name):
        """The mean of one figure ("precision", "recall", "f1") over the classes where it is defined."""
        values = getattr(self, name)
        defined = values[~np.isnan(values)]
        return float(defined.mean()) if len(defined) else float("nan")

    def counted(self, name):
        """How many classes macro(name) averages."""
        return int((~np.isnan(getattr(self, name))).sum())


def class_metrics(confusion):
    """The ClassMetrics of a (classes, classes) confusion matrix (rows: the true class, columns: the predicted
    one). Each figure is one division of integer counts, so a hand-computed fraction matches it exactly."""
    confusion = np.asarray(confusion, np.int64)
    hits, images, predicted = np.diag(confusion), confusion.sum(axis=1), confusion.sum(axis=0)
    missed, wrong = images - hits, predicted - hits   # FN, FP

    def share(numerator, denominator):  # NaN where there is nothing to divide by, without a warning
        out = np.full(len(numerator), np.nan)
        np.divide(numerator, denominator, out=out, where=denominator > 0)
        return out
    return ClassMetrics(precision=share(hits, predicted), recall=share(hits, images),
                        f1=share(2 * hits, 2 * hits + wrong + missed), images=images, predicted=predicted)


def top_k_hits(logits, labels, k):
    """(N,) bool: whether each label is among the k highest of its row of logits (N, classes), ties going to the
    lower class as argmax's do, so k = 1 is argmax's hits: a stable descending sort's first k."""
    rows = np.arange(len(labels))
    mine = logits[rows, labels][:, None]
    lower = np.arange(logits.shape[1]) < np.asarray(labels)[:, None]  # (N, classes): the classes ranked first on a tie
    rank = (logits > mine).sum(axis=1) + ((logits == mine) & lower).sum(axis=1)
    return rank < k


def evaluate(net, split, mean, *, group=None, workers=None):
    """(loss, accuracy) of net over a whole split: scores()'s."""
    scored = scores(net, split, mean, group=group, workers=workers)
    return scored.loss, scored.accuracy


def scores(net, split, mean, *, group=None, workers=None, top_k=None):
    """The Scores of net (running BN statistics) over a whole split, from net.predict's logits (top_k: also the
    share of images whose label is among the top_k highest, top_k_hits'; None: not counted). split: an HDF5
    split, normalised by mean, or an imagenet.Folder (center crops of the net's input size, decoded by
    `workers` processes). group (dist.py): rank r evaluates batches r, r + ranks, ...; their sums are summed
    over the ranks (each batch's from one rank: exact) and added up in batch order on every rank, so every
    rank gets one process's figures, bit for bit. A batch is one pass: net.pass_images images."""
    if isinstance(split, imagenet.Folder):
        batches = imagenet.evaluation_batches(split, batch=net.pass_images, size=net.input_shape[0], workers=workers)
    else:
        batches = evaluation_batches(split, batch=net.pass_images, mean=mean)
    sums = []  # (-log-likelihood, correct, correct in the top k) of each batch
    confusion = np.zeros((net.classes, net.classes), np.float64)  # (classes, classes), this rank's batches
    for i, (images, labels) in enumerate(batches):
        if group is not None and i % group.size != group.rank:
            sums.append((0.0, 0.0, 0.0))
            continue
        logits = net.predict(images).astype(np.float64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        predicted = logits.argmax(axis=1)
        top = int(top_k_hits(logits, labels, top_k).sum()) if top_k else 0
        sums.append((-float(log_p[np.arange(len(labels)), labels].sum()), int((predicted == labels).sum()), top))
        np.add.at(confusion, (labels, predicted), 1)
    sums = np.array(sums, np.float64).reshape(-1, 3)  # (batches, 3)
    if group is not None:  # one sum over the ranks for both (counts below 2**53: exact in float64)
        both = np.concatenate([sums.ravel(), confusion.ravel()])
        group.sum(both)
        sums, confusion = both[:sums.size].reshape(sums.shape), both[sums.size:].reshape(confusion.shape)
    total_loss = total_correct = total_top = 0.0
    for loss, correct, top in sums.tolist():
        total_loss += loss
        total_correct += correct
        total_top += top
    if not np.isfinite(total_loss):
        raise FloatingPointError(f"the loss over the {split.name} split is {total_loss}")
    n = len(split.labels)
    return Scores(loss=total_loss / n, accuracy=total_correct / n, confusion=confusion.astype(np.int64),
                  top_k=top_k, top_k_accuracy=total_top / n if top_k else None)
