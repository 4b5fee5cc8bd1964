"""Fitting a plan to memory: sizes as people write them, the largest batch under a budget (exact, and quick
for any budget), and the trainer's refusal of a plan larger than the memory available."""
import h5py
import pytest

from minibp import backend, evaluate, models, train
from minibp.io import data
from minibp.net import Net
from minibp.quant import Store
from minibp.run.sizing import MAX_BATCH, MAX_BUDGET, largest_batch, parse_bytes
from nets import tiny_resnet
from runs import base_args, one_line_error


def assert_largest(net, mode, budget, batch):
    assert net.plan(pass_images=batch, bits=mode).allocation_bytes <= budget
    assert net.plan(pass_images=batch + 1, bits=mode).allocation_bytes > budget


@pytest.mark.parametrize("mode", ["exact", "4"])
@pytest.mark.parametrize("budget", [300 * 2**20, 11 * 2**30 + 12345])
def test_largest_batch_fits_and_one_more_does_not(mode, budget):
    net = models.by_name("resnet20")
    batch = largest_batch(net, store=Store(mode), budget=budget)
    assert batch > 1
    assert_largest(net, mode, budget, batch)
    assert largest_batch(net, store=Store(mode), budget=1000) == 0


@pytest.mark.parametrize("budget", ["1000TiB", "1PiB", "12345678901234"])
def test_huge_budgets_take_a_few_plans(plan_calls, budget):
    net = models.by_name("resnet20")
    for mode in ("exact", "2"):
        plan_calls.clear()
        batch = largest_batch(net, store=Store(mode), budget=parse_bytes(budget))
        assert len(plan_calls) <= 40
        assert_largest(net, mode, parse_bytes(budget), batch)


def test_the_batch_is_capped(plan_calls, monkeypatch):
    """A net whose arena stops growing past batch 5 fits any batch: the search stops at the cap."""
    net = models.by_name("resnet20")
    real = Net.plan
    monkeypatch.setattr(Net, "plan", lambda self, **o: real(self, **dict(o, pass_images=min(o["pass_images"], 5))))
    assert largest_batch(net, store=Store("4"), budget=2**40) == MAX_BATCH


def test_four_bits_fit_more_than_exact():
    net = models.by_name("resnet56")
    batches = {m: largest_batch(net, store=Store(m), budget=2**30) for m in ("exact", "8", "4")}
    assert batches["4"] > batches["8"] > batches["exact"]


@pytest.mark.parametrize("budget", [0, -5, float("nan"), 2**50 + 1])
def test_bad_budgets_are_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        largest_batch(models.by_name("resnet20"), store=Store("4"), budget=budget)


def test_parse_bytes():
    assert parse_bytes("11GiB") == 11 * 2**30
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("512") == 512
    assert parse_bytes("1PiB") == MAX_BUDGET


def test_a_plan_larger_than_the_memory_is_refused_with_the_batch_that_fits(tmp_path, data_dir, monkeypatch, capsys):
    monkeypatch.setattr(backend, "available_memory", lambda: 3 * 2**20)
    assert train.main(base_args(tmp_path, batch=64)) == 2
    line = one_line_error(capsys.readouterr().err)
    fits = int(line.split("the largest pass that fits is ")[1].split()[0])
    net = tiny_resnet(classes=4)
    assert net.plan(pass_images=fits, bits="4").allocation_bytes <= 3 * 2**20 < net.plan(pass_images=fits + 1,
                                                                                  bits="4").allocation_bytes
    assert evaluate.main([str(tmp_path / "nothing"), "--batch", "64"]) == 2  # (no run: a clear error too)
    capsys.readouterr()


def test_a_net_too_large_for_any_batch_names_what_is_too_big(tmp_path, data_dir, capsys):
    """A data file claiming 10^9 classes: no pass fits, and 'the largest pass that fits is 0 images' would mislead."""
    with h5py.File(data_dir / "cifar10.h5", "r+") as f:
        f.attrs["classes"] = 10**9
        checksums = {s: {k: f[s].attrs[k] for k in ("images_sha256", "labels_sha256")} for s in ("train", "test")}
        f.attrs["sha256"] = data.root_sha256({k: f.attrs[k] for k in f.attrs}, checksums)  # a file that means it
    assert train.main(base_args(tmp_path)) == 2
    line = one_line_error(capsys.readouterr().err)
    assert "even a pass of 1 image needs" in line \
        and "too large for this machine (input 8x8x3, 1,000,000,000 classes)" in line and "largest pass" not in line
