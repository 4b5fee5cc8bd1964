"""The planner: totals equal the sum of rows, and the largest batch under a budget is exact."""
import json

import pytest

from minibp import models, plan
from minibp.net import MODE_BITS


@pytest.mark.parametrize("mode", list(MODE_BITS))
def test_totals_equal_the_sum_of_rows(mode):
    net = models.by_name("resnet164")
    p = net.plan(batch=128, mode=mode)
    assert p.total_bytes == sum(spec.nbytes for spec in p.buffers.values()) == sum(p.bytes_by_category().values())
    assert p.allocation_bytes >= p.total_bytes


@pytest.mark.parametrize("mode", ["exact", "4"])
def test_largest_batch_fits_and_one_more_does_not(mode):
    net = models.by_name("resnet20")
    budget = 300 * 2**20
    batch = plan.largest_batch(net, mode=mode, budget=budget)
    assert batch > 1
    assert net.plan(batch=batch, mode=mode).allocation_bytes <= budget
    assert net.plan(batch=batch + 1, mode=mode).allocation_bytes > budget
    assert plan.largest_batch(net, mode=mode, budget=1000) == 0


def test_four_bits_fit_more_than_exact():
    net = models.by_name("resnet56")
    batches = {m: plan.largest_batch(net, mode=m, budget=2**30) for m in ("exact", "8", "4")}
    assert batches["4"] > batches["8"] > batches["exact"]


def test_cli_prints_categories_units_budget_and_json(capsys):
    assert plan.main(["--model", "resnet20", "--batch", "32", "--bits", "4", "--units", "--budget", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "activation stores" in out and "unit  input shape" in out and "largest batch within 1.00 GiB" in out
    assert plan.main(["--model", "resnet20", "--batch", "32", "--json", "--budget", "1GB"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["total_bytes"] == sum(result["categories"].values())
    assert set(result["largest_batch"]) == set(MODE_BITS)


@pytest.mark.parametrize("argv,match", [(["--budget", "lots"], "a size is"), (["--model", "vgg"], "unknown model"),
                                        (["--batch", "0"], "positive")])
def test_cli_errors(capsys, argv, match):
    assert plan.main(argv) == 2
    assert match in capsys.readouterr().err


def test_parse_bytes():
    assert plan.parse_bytes("11GiB") == 11 * 2**30
    assert plan.parse_bytes("1.5 GB") == 1_500_000_000
    assert plan.parse_bytes("512") == 512
