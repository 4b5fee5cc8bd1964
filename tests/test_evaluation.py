"""run/evaluation.py's evaluate against its definition: the mean of -log softmax at the true label, and the share of
argmax hits, over a whole split with a ragged last batch; the confusion matrix, each true class's images by
their prediction; the ranks of a group together give one process's figures bit for bit; a loss that is not
finite is an error that names the split. (The trainer's validations
and python3 -m minibp.evaluate call it: tests/test_train.py, test_evaluate.py.)"""
from types import SimpleNamespace

import numpy as np
import pytest

from minibp import backend
from minibp.run import evaluation
from nets import small_net


def make_split(n=11, classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(name="test", images=rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8),
                           labels=rng.integers(0, classes, n))


@pytest.fixture(scope="module")
def net():
    net = small_net(classes=5)
    net.compile(batch=4, bits="exact", training=False)  # 11 images: batches of 4, 4 and 3
    return net


def test_evaluate_is_the_mean_log_likelihood_and_accuracy_of_the_split(net):
    split, mean = make_split(), np.float32(0.5)
    loss, accuracy = evaluation.evaluate(net, split, mean)
    images = split.images.astype(np.float32) * np.float32(1 / 255) - mean
    logits = net.predict(backend.xp.asarray(images)).astype(np.float64)  # (11, 5)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(11), split.labels]).mean(), rel=1e-12)
    assert accuracy == np.mean(logits.argmax(axis=1) == split.labels)


class RecordingGroup:
    """Rank `rank` of `size`: first records what each rank would send (sum leaves it as it is), then, given
    every rank's record, sums them in place as an allreduce would."""

    def __init__(self, rank, size, records):
        self.rank, self.size, self.records = rank, size, records

    def sum(self, array):
        if len(self.records) < self.size:
            self.records.append(array.copy())
        else:
            array[...] = sum(self.records[1:], self.records[0])


def test_the_ranks_of_a_group_give_one_process_figures_bit_for_bit(net):
    split, mean = make_split(n=11), np.float32(0.5)
    alone = evaluation.evaluate(net, split, mean)
    records = []
    for rank in range(3):  # 3 batches over 3 ranks, then over 2 (one rank takes two)
        evaluation.evaluate(net, split, mean, group=RecordingGroup(rank, 3, records))
    assert evaluation.evaluate(net, split, mean, group=RecordingGroup(0, 3, records)) == alone
    records = []
    for rank in range(2):
        evaluation.evaluate(net, split, mean, group=RecordingGroup(rank, 2, records))
    assert evaluation.evaluate(net, split, mean, group=RecordingGroup(1, 2, records)) == alone


def test_a_loss_that_is_not_finite_names_the_split():
    split = make_split(n=3)
    infinite = SimpleNamespace(batch=4, classes=2, predict=lambda images: np.array([[0.0, -np.inf]] * len(images)))
    split.labels[:] = 1
    with pytest.raises(FloatingPointError, match="the loss over the test split is"):
        evaluation.evaluate(infinite, split, np.float32(0))


def test_the_confusion_matrix_counts_each_true_class_by_its_prediction_and_ranks_sum_it(net):
    split = make_split(n=11)
    scored = evaluation.scores(net, split, np.float32(0.5))
    images = split.images.astype(np.float32) * np.float32(1 / 255) - np.float32(0.5)
    predicted = net.predict(backend.xp.asarray(images)).argmax(axis=1)
    expected = np.zeros((net.classes, net.classes), np.int64)
    for true, guess in zip(split.labels, predicted):
        expected[true, guess] += 1
    assert np.array_equal(scored.confusion, expected) and scored.confusion.dtype == np.int64
    images = expected.sum(axis=1)
    per_class = scored.per_class()
    assert all(np.isnan(a) if n == 0 else a == expected[c, c] / n for c, (a, n) in enumerate(zip(per_class, images)))
    assert scored.accuracy == np.trace(expected) / 11
    records = []
    for rank in range(3):  # what each rank sends, then what rank 2 gets back
        evaluation.scores(net, split, np.float32(0.5), group=RecordingGroup(rank, 3, records))
    ranked = evaluation.scores(net, split, np.float32(0.5), group=RecordingGroup(2, 3, records))
    assert np.array_equal(ranked.confusion, expected) and ranked.accuracy == scored.accuracy
