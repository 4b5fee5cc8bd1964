"""run/evaluation.py's evaluate against its definition: the mean of -log softmax at the true label, and the share of
argmax hits, over a whole split with a ragged last batch; the confusion matrix, each true class's images by
their prediction; the ranks of a group together give one process's figures bit for bit; a loss that is not
finite is an error that names the split; precision, recall and F1 from a confusion matrix, undefined (NaN)
where there is nothing to divide by; the top-k accuracy against a stable sort of the logits. (The trainer's validations
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
    net.compile(pass_images=4, bits="exact", training=False)  # 11 images: batches of 4, 4 and 3
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
    infinite = SimpleNamespace(pass_images=4, classes=2,
                               predict=lambda images: np.array([[0.0, -np.inf]] * len(images)))
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


def test_class_metrics_of_a_small_matrix_are_the_hand_computed_fractions():
    """Class 2 is never predicted (no precision), class 3 has no images but is predicted once (no recall),
    class 4 has neither (no F1); the macro means are over the classes where each figure is defined."""
    confusion = np.array([[2, 1, 0, 1, 0],   # rows: the true class; columns: the predicted one
                          [1, 3, 0, 0, 0],
                          [0, 2, 0, 0, 0],
                          [0, 0, 0, 0, 0],
                          [0, 0, 0, 0, 0]])
    nan = np.nan
    figures = evaluation.class_metrics(confusion)
    np.testing.assert_array_equal(figures.precision, [2 / 3, 3 / 6, nan, 0 / 1, nan])
    np.testing.assert_array_equal(figures.recall, [2 / 4, 3 / 4, 0 / 2, nan, nan])
    np.testing.assert_array_equal(figures.f1, [4 / 7, 6 / 10, 0 / 2, 0 / 1, nan])  # 2 TP / (2 TP + FP + FN)
    assert figures.images.tolist() == [4, 4, 2, 0, 0] and figures.predicted.tolist() == [3, 6, 0, 1, 0]
    assert figures.macro("precision") == (2 / 3 + 3 / 6 + 0 / 1) / 3 and figures.counted("precision") == 3
    assert figures.macro("recall") == (2 / 4 + 3 / 4 + 0 / 2) / 3 and figures.counted("recall") == 3
    assert figures.macro("f1") == (4 / 7 + 6 / 10 + 0 / 2 + 0 / 1) / 4 and figures.counted("f1") == 4
    assert np.isnan(evaluation.class_metrics(np.zeros((2, 2), np.int64)).macro("precision"))


def test_top_k_hits_are_a_stable_descending_sorts_first_k_and_top_1_is_argmax():
    known = np.array([[1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0], [5.0, 1.0, 1.0, 1.0], [2.0, 2.0, 9.0, 2.0]])
    labels = np.array([3, 2, 1, 0])
    assert [evaluation.top_k_hits(known, labels, k).tolist() for k in (1, 2, 3)] == [
        [False, False, False, False], [True, False, True, True], [True, True, True, True]]
    rng = np.random.default_rng(0)
    logits = rng.integers(0, 4, (300, 6)).astype(np.float64)  # many ties
    labels = rng.integers(0, 6, 300)
    for k in range(1, 6):
        reference = (np.argsort(-logits, axis=1, kind="stable")[:, :k] == labels[:, None]).any(axis=1)
        assert np.array_equal(evaluation.top_k_hits(logits, labels, k), reference)
    assert np.array_equal(evaluation.top_k_hits(logits, labels, 1), logits.argmax(axis=1) == labels)


def test_the_top_k_accuracy_of_a_split_is_the_reference_on_its_logits_and_ranks_sum_it(net):
    split, mean = make_split(n=11), np.float32(0.5)
    images = split.images.astype(np.float32) * np.float32(1 / 255) - mean
    logits = net.predict(backend.xp.asarray(images)).astype(np.float64)
    for k in (1, 2, 3):
        scored = evaluation.scores(net, split, mean, top_k=k)
        reference = (np.argsort(-logits, axis=1, kind="stable")[:, :k] == split.labels[:, None]).any(axis=1)
        assert scored.top_k == k and scored.top_k_accuracy == reference.mean()
    assert evaluation.scores(net, split, mean).top_k_accuracy is None
    records = []
    for rank in range(3):
        evaluation.scores(net, split, mean, top_k=3, group=RecordingGroup(rank, 3, records))
    assert evaluation.scores(net, split, mean, top_k=3, group=RecordingGroup(1, 3, records)).top_k_accuracy == \
        scored.top_k_accuracy
