"""The planner: stores sized from the unit shapes, and the largest batch under a budget exact and quick."""
import json
import math
import signal
import subprocess
import sys

import pytest

from minibp import models, plan
from minibp.net import Net
from minibp.quant import BITS, Store


@pytest.mark.parametrize("mode", list(BITS))
def test_stores_hold_bits_per_element_of_each_normalised_input(mode):
    """Exact stores keep one float32 per element of every batch-normalised unit input; k-bit stores
    keep k bits of it, so k/32 of the exact bytes. Counted here from the unit shapes alone. (Through the range
    window, whose window per channel lives in the statistics; the block window's own: test_window.py.)"""
    net, batch = models.by_name("resnet20", input_shape=(28, 28, 1)), 7
    elements = sum(batch * math.prod(u.in_shape) for u in net.units if u.batchnorm)
    bits = BITS[mode] or 32
    plan = net.plan(batch=batch, bits=mode, window="range")
    assert plan.bytes_by_category()["activation stores"] == elements * bits // 8


def assert_largest(net, mode, budget, batch):
    assert net.plan(batch=batch, bits=mode).allocation_bytes <= budget
    assert net.plan(batch=batch + 1, bits=mode).allocation_bytes > budget


@pytest.mark.parametrize("mode", ["exact", "4"])
@pytest.mark.parametrize("budget", [300 * 2**20, 11 * 2**30 + 12345])
def test_largest_batch_fits_and_one_more_does_not(mode, budget):
    net = models.by_name("resnet20")
    batch = plan.largest_batch(net, store=Store(mode), budget=budget)
    assert batch > 1
    assert_largest(net, mode, budget, batch)
    assert plan.largest_batch(net, store=Store(mode), budget=1000) == 0


@pytest.fixture
def plan_calls(monkeypatch):
    """Counts Net.plan calls, and stops a search that would run for minutes after a few hundred."""
    calls, real = [], Net.plan

    def counted(self, **options):
        calls.append(options["batch"])
        assert len(calls) <= 300, "the batch search does not stop"
        return real(self, **options)
    monkeypatch.setattr(Net, "plan", counted)
    return calls


@pytest.mark.parametrize("budget", ["1000TiB", "1PiB", "12345678901234"])
def test_huge_budgets_take_a_few_plans(plan_calls, budget):
    net = models.by_name("resnet20")
    for mode in ("exact", "2"):
        plan_calls.clear()
        batch = plan.largest_batch(net, store=Store(mode), budget=plan.parse_bytes(budget))
        assert len(plan_calls) <= 40
        assert_largest(net, mode, plan.parse_bytes(budget), batch)


def test_the_batch_is_capped(plan_calls, monkeypatch):
    """A net whose arena stops growing past batch 5 fits any batch: the search stops at the cap."""
    net = models.by_name("resnet20")
    real = Net.plan
    monkeypatch.setattr(Net, "plan", lambda self, **o: real(self, **dict(o, batch=min(o["batch"], 5))))
    assert plan.largest_batch(net, store=Store("4"), budget=2**40) == plan.MAX_BATCH


def test_cli_answers_huge_budgets_quickly(plan_calls, capsys):
    assert plan.main(["--model", "resnet20", "--budget", "1000TiB"]) == 0
    assert len(plan_calls) <= 100
    assert "largest batch within" in capsys.readouterr().out
    assert plan.main(["--model", "resnet20", "--budget", "1e30"]) == 2
    assert capsys.readouterr().err == "error: budget 1e+30 bytes is beyond any machine (at most 1 PiB)\n"


def test_four_bits_fit_more_than_exact():
    net = models.by_name("resnet56")
    batches = {m: plan.largest_batch(net, store=Store(m), budget=2**30) for m in ("exact", "8", "4")}
    assert batches["4"] > batches["8"] > batches["exact"]


def test_cli_prints_categories_units_budget_and_json(capsys):
    assert plan.main(["--model", "resnet20", "--batch", "32", "--bits", "4", "--units", "--budget", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "activation stores" in out and "unit  input shape" in out and "largest batch within 1.00 GiB" in out
    assert plan.main(["--model", "resnet20", "--batch", "32", "--json", "--budget", "1GB"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["total_bytes"] == sum(result["categories"].values())
    assert set(result["largest_batch"]) == set(BITS)


@pytest.mark.parametrize("argv,match", [(["--budget", "lots"], "a size is"), (["--model", "vgg"], "unknown model"),
                                        (["--batch", "0"], "positive"), (["--budget", "0"], "positive"),
                                        (["--budget=-1GiB"], "positive"), (["--budget", "nan"], "a size is"),
                                        (["--budget", "1.2.3GB"], "a size is"), (["--budget", "1e400"], "finite")])
def test_cli_errors(capsys, argv, match):
    assert plan.main(argv) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1 and err.startswith("error: ")


@pytest.mark.parametrize("budget", [0, -5, float("nan"), 2**50 + 1])
def test_bad_budgets_are_refused(budget):
    with pytest.raises(ValueError, match="budget"):
        plan.largest_batch(models.by_name("resnet20"), store=Store("4"), budget=budget)


def test_parse_bytes():
    assert plan.parse_bytes("11GiB") == 11 * 2**30
    assert plan.parse_bytes("1.5 GB") == 1_500_000_000
    assert plan.parse_bytes("512") == 512
    assert plan.parse_bytes("1PiB") == plan.MAX_BUDGET


def test_device_option_plans_the_other_device_without_it(capsys):
    """The GPU's im2col covers the whole batch, the CPU's a chunk: the workspace differs, the stores not."""
    from minibp import backend
    actual, sizes = backend.device, {}
    for device in ("cpu", "gpu"):
        assert plan.main(["--model", "resnet20", "--batch", "64", "--device", device, "--json"]) == 0
        sizes[device] = json.loads(capsys.readouterr().out)["categories"]
    assert sizes["gpu"]["workspace"] > sizes["cpu"]["workspace"]
    assert sizes["gpu"]["activation stores"] == sizes["cpu"]["activation stores"]
    assert backend.device == actual  # put back as it was


def test_cli_stops_quietly_when_its_reader_does(tmp_path):
    """`python -m minibp.plan ... | head`: the pipe closes before the plan is printed; no traceback."""
    done = subprocess.Popen([sys.executable, "-m", "minibp.plan", "--model", "resnet20", "--units"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done.stdout.close()  # the reader has gone before the first line
    err = done.stderr.read().decode()
    assert done.wait() == 128 + signal.SIGPIPE and err == "", err
