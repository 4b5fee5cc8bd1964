"""The planner, python3 -m minibp.plan: stores sized from the unit shapes; the categories, units and largest batch
under a budget it prints, quickly for any budget, for the CIFAR and the ImageNet ResNets; its errors. (The
largest-batch search itself: tests/run/test_sizing.py.)"""
import json
import math

import numpy as np
import pytest

from minibp import models, plan
from minibp.run.sizing import Footprint
from minibp.quant import BITS
from runs import ROOT


@pytest.mark.parametrize("mode", list(BITS))
def test_stores_hold_bits_per_element_of_each_normalised_input(mode):
    """Exact stores keep one float32 per element of every batch-normalised unit input; k-bit stores
    keep k bits of it, so k/32 of the exact bytes. Counted here from the unit shapes alone. (Through the range
    window, whose window per channel lives in the statistics; the block window's own: test_window.py.)"""
    net, batch = models.by_name("resnet20", input_shape=(28, 28, 1)), 7
    elements = sum(batch * math.prod(u.in_shape) for u in net.units if u.batchnorm)
    bits = BITS[mode] or 32
    plan = net.plan(pass_images=batch, bits=mode, window="range")
    assert plan.bytes_by_category()["activation stores"] == elements * bits // 8


def test_cli_answers_huge_budgets_quickly(plan_calls, capsys):
    assert plan.main(["--model", "resnet20", "--budget", "1000TiB"]) == 0
    assert len(plan_calls) <= 100
    assert "largest batch within" in capsys.readouterr().out
    assert plan.main(["--model", "resnet20", "--budget", "1e30"]) == 2
    assert capsys.readouterr().err == "error: budget 1e+30 bytes is beyond any machine (at most 1 PiB)\n"


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


def test_the_plan_command_gives_the_imagenet_resnets(capsys):
    assert plan.main(["--model", "resnet152", "--data", "imagenet", "--batch", "256", "--bits", "4"]) == 0
    out = capsys.readouterr().out
    assert "resnet152 on imagenet (152 units, 60,185,128 parameters), batch 256, bits 4" in out
    assert plan.main(["--data", "imagenet", "--batch", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == "resnet152"  # the default model on imagenet
    assert plan.main(["--model", "resnet164", "--data", "imagenet"]) == 2
    assert "not an ImageNet ResNet" in capsys.readouterr().err


def test_the_planner_takes_the_trainers_model_specs_and_a_data_file(tmp_path, capsys):
    from minibp.io import data
    rng = np.random.default_rng(0)
    pair = (rng.integers(0, 256, (4, 12, 12, 1), dtype=np.uint8), np.array([0, 1, 2, 0]))
    path = data.write(tmp_path / "mine.h5", train=pair, test=pair, classes=3, name="mine")
    vgg = str(ROOT / "docs" / "vgg_example.py")
    assert plan.main(["--model", f"{vgg}:build", "--model-arg", "width=8", "--data-file", str(path),
                      "--batch", "16"]) == 0
    assert capsys.readouterr().out.startswith("vgg_example.py:build(width=8) on mine (")
    assert plan.main(["--model", str(tmp_path / "none.py") + ":build"]) == 2
    assert "no file" in capsys.readouterr().err


def test_memory_solves_a_budget_and_lists_each_units_store(capsys, monkeypatch):
    """--memory: the sub-batches and a store a unit, the bytes within the budget, each unit's store in --units and
    --json; with --bits or --budget, or below the least budget, refused in one line. (The process measured as 100
    MiB: the test's own process, after others, holds what a planner's would not.)"""
    def measure(self, warm_up=None):
        self.measured = 0 if self.gpu else 100 * 2**20
        return self
    monkeypatch.setattr(Footprint, "measure", measure)
    assert plan.main(["--model", "resnet20", "--memory", "16GiB", "--units", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["memory"]["sub_batches"] == 1 and set(result["bits"]) == {"exact"}
    assert all(row["store"] == "exact" for row in result["unit_stores"])
    assert plan.main(["--model", "resnet1001", "--memory", "1.25GiB", "--units"]) == 0
    out = capsys.readouterr().out
    assert "stores: " in out and " at 4 bits" in out and "at 2 (block window)" in out
    solved = [line.split() for line in out.splitlines() if line[:4].strip().isdigit()]
    assert {row[-3] for row in solved} == {"4", "2"}  # a mix, unit by unit
    for argv, message in [(["--bits", "4"], "--memory chooses each unit's bits"),
                          (["--budget", "1GiB"], "--budget gives the largest batch of each store"),
                          ([], "needs at least")]:
        memory = ["--memory", "1MiB"] if message == "needs at least" else ["--memory", "1GiB"]
        assert plan.main(["--model", "resnet20"] + memory + argv) == 2
        assert capsys.readouterr().err.startswith(f"error: {message}")
