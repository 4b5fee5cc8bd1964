"""A run within its memory budget (--memory, minibp/run/memory.py): the refusals, a mix trained, checkpointed and
resumed to the same mix, exact in every unit where the budget holds it (bit for bit --bits exact), what evaluate
reads of it, and a process whose peak stays under its budget."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from minibp import evaluate, quant, train
from minibp.run import budget, checkpoint, sizing
from minibp.run.sizing import Footprint
from nets import tiny_resnet
from runs import ROOT, base_args, one_line_error, read_metrics

MEASURED = 100 * 2**20  # the process's resident bytes, fixed where a test needs the solve to be its own arithmetic


@pytest.fixture
def fixed_footprint(monkeypatch):
    """The process measured as MEASURED bytes, with no warm-up: the budget's arithmetic is then the test's."""
    def measure(self, warm_up=None):
        self.measured = 0 if self.gpu else MEASURED
        return self
    monkeypatch.setattr(Footprint, "measure", measure)


def halfway_budget(bits_low="2"):
    """A budget halfway between every unit at 2 bits and every unit exact, for base_args' run (resnet11 on 8x8x3
    images, batch 16, 4 classes, 256 training images), at one sub-batch."""
    net = tiny_resnet(classes=4)
    costs = budget.Costs(net, store=quant.Store("4"), per_process=16)
    footprint = Footprint(net, per_process=16, train_images=256)
    footprint.measured = MEASURED
    from minibp.run import calibration
    overhead = footprint.overhead(16, calibration=calibration.calibration_bytes(net))
    unit_bytes, fixed = costs.at(16)
    low, high = int(unit_bytes[:, 0].sum()), int(unit_bytes[:, -1].sum())
    return overhead + fixed + (low + high) // 2


def header_line(out, start):
    return next(line for line in out.splitlines() if line.startswith(start))


@pytest.mark.parametrize("options,message", [
    (dict(memory="1GiB", bits="4"), "--memory chooses each unit's bits: leave --bits out"),
    (dict(memory="1GiB", sub_batches=2), "--memory chooses the sub-batches, the fewest at which the run fits"),
    (dict(max_sub_batches=2), "--max-sub-batches is --memory's"),
    (dict(memory="lots"), "--memory must be auto or a size such as 1.25GiB"),
    (dict(memory="1000B"), r"needs at least [0-9.]+ [KMG]iB: "),
])
def test_refusals_are_one_line(tmp_path, data_dir, capsys, options, message):
    assert train.main(base_args(tmp_path, **options)) == 2
    assert re.search(message, one_line_error(capsys.readouterr().err))
    assert not (tmp_path / "run" / "checkpoint.h5").exists()


def test_a_mix_trains_checkpoints_and_resumes_to_the_same_mix(tmp_path, data_dir, capsys, fixed_footprint):
    b = halfway_budget()
    assert train.main(base_args(tmp_path, memory=f"{b}B", iters=3)) == 0
    first = capsys.readouterr().out
    line = header_line(first, "stores: ")
    assert re.match(r"stores: \d+ units exact, \d+ at [248]", line) and "1 sub-batch of 16" in line, line
    saved = checkpoint.load(tmp_path / "run" / "checkpoint.h5")
    record = saved.memory
    assert record["budget"] == b and record["arena"] + record["overhead"] <= b and record["sub_batches"] == 1
    assert set(record["bits"]) - {"exact"} and "exact" in record["bits"]  # a mix
    assert saved.config["memory"] == f"{b}B" and saved.config["sub_batches"] == 1
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 0
    assert header_line(capsys.readouterr().out, "stores: ") == line
    # evaluate names the mix
    assert evaluate.main([str(tmp_path / "run"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bits"] == record["bits"]


def test_a_resume_refuses_a_record_that_does_not_solve_to_its_mix(tmp_path, data_dir, capsys, fixed_footprint):
    assert train.main(base_args(tmp_path, memory=f"{halfway_budget()}B", iters=3)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    saved = checkpoint.load(path)
    saved.memory["bits"] = ["2"] * len(saved.memory["bits"])  # another mix than its errors and budget give
    net = tiny_resnet(classes=4).compile(pass_images=16, bits="4")
    checkpoint.restore(net, saved)
    checkpoint.save(path, net, iteration=saved.iteration, config=saved.config, data_state=saved.data_state,
                    class_names=saved.class_names, data=saved.data, mean=saved.mean, memory=saved.memory)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "6"]) == 2
    assert "memory record does not solve to its own mix" in one_line_error(capsys.readouterr().err)


def test_a_budget_that_holds_every_unit_exact_is_bits_exact_bit_for_bit(tmp_path, data_dir, capsys):
    assert train.main(base_args(tmp_path, out="memory", memory="64GiB", iters=4)) == 0
    assert "stores: bits exact (" in capsys.readouterr().out
    assert train.main(base_args(tmp_path, out="exact", bits="exact", iters=4)) == 0
    a, b = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("memory", "exact"))
    assert a.state.keys() == b.state.keys()
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)
    losses = [[r["loss"] for r in read_metrics(tmp_path / run) if r["kind"] == "train"] for run in ("memory", "exact")]
    assert losses[0] == losses[1]


def test_more_sub_batches_only_where_allowed(tmp_path, data_dir, capsys, fixed_footprint):
    """A budget that holds 2 bits in every unit at one sub-batch, and exact at 16: the fewest sub-batches by
    default, more where --max-sub-batches allows them and they lower the error; the batch is 16 either way."""
    net = tiny_resnet(classes=4)
    costs = budget.Costs(net, store=quant.Store("4"), per_process=16)
    footprint = Footprint(net, per_process=16, train_images=256)
    footprint.measured = MEASURED
    from minibp.run import calibration
    cal = calibration.calibration_bytes(net)
    b = footprint.overhead(16, calibration=cal) + costs.at(16)[1] + int(costs.at(16)[0][:, 0].sum()) + 1024
    assert train.main(base_args(tmp_path, out="fewest", memory=f"{b}B", iters=2)) == 0
    assert "1 sub-batch of 16" in header_line(capsys.readouterr().out, "stores: ")
    assert train.main(base_args(tmp_path, out="more", memory=f"{b}B", max_sub_batches=16, iters=2)) == 0
    out = capsys.readouterr().out
    S, n = (int(v) for v in re.search(r"(\d+) sub-batches of (\d+)", header_line(out, "stores: ")).groups())
    assert S > 1 and S * n == 16 and f"batch 16 ({S} x {n})" in out


@pytest.mark.slow
def test_a_process_peaks_within_its_budget(tmp_path, data_dir):
    """In a process of its own: the least budget is refused naming it, and that budget (less than every unit at 2 bits
    of one sub-batch) runs with its peak resident memory within it."""
    command = [sys.executable, "-m", "minibp.train"] + base_args(tmp_path, iters=6, batch=64)
    refused = subprocess.run(command + ["--memory", "1000B"], cwd=ROOT, capture_output=True, text=True)
    least = re.search(r"needs at least ([0-9.]+) ([KMG]iB)", refused.stderr)
    assert refused.returncode == 2 and least, refused.stderr
    given = float(least.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[least.group(2)] + 4 * 2**20
    ran = subprocess.run(command + ["--memory", f"{int(given)}B"], cwd=ROOT, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    peak = re.search(r"memory: peak resident memory ([0-9.]+) ([KMG]iB), planned .*, budget ([0-9.]+) ([KMG]iB)",
                     ran.stdout)
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    assert peak, ran.stdout
    assert float(peak.group(1)) * units[peak.group(2)] <= float(peak.group(3)) * units[peak.group(4)]
    assert re.search(r"\d+ sub-batches of \d+", ran.stdout)  # the least budget takes sub-batches
    assert sizing.process_bytes("VmHWM") is not None


class OtherMix:
    """A group of two ranks whose other rank solved another mix."""
    size, rank = 2, 0

    def on_rank_0(self, fn):
        return fn()

    def gather_objects(self, mine):
        return [mine, (mine[0], mine[1] * 2)]


def test_ranks_that_solve_other_mixes_are_refused_in_one_line(tmp_path, data_dir, fixed_footprint):
    from minibp.run import config as run_config, splits, startup
    config = run_config.RunConfig.new(dict(data="cifar10", data_dir=str(data_dir), model="resnet11", batch=16,
                                           memory="64GiB", lr_schedule="0:0.05", iters=2), ranks=2)
    run_data = splits.load(config)
    with pytest.raises(ValueError, match=r"^rank 1 solves --memory 64GiB to another mix than rank 0 \(4 sub-batches "
                                         r"against 2, or other stores\): every rank needs the same minibp, net and "
                                         r"data$") as refused:
        startup.make_step(tiny_resnet(classes=4), config, ranks=2, group=OtherMix(), run_data=run_data)
    assert refused.value.on_every_rank


def test_fit_takes_a_memory_budget(tmp_path, data_dir, fixed_footprint):
    """fit(memory=...) is --memory: the net it returns keeps the solved mix (a store a unit)."""
    b = halfway_budget()
    net = train.fit("resnet11", data=str(data_dir / "cifar10.h5"), out=str(tmp_path / "fit"), memory=f"{b}B",
                    batch=16, iters=2, lr_schedule="0:0.05", val_every=2)
    record = checkpoint.load(tmp_path / "fit" / "checkpoint.h5").memory
    assert budget.unit_bits(net, net.stores) == record["bits"] and net.store is None


def test_a_replayed_step_counts_its_staging_and_a_resume_keeps_the_budgets_account(tmp_path, data_dir, capsys,
                                                                                  fixed_footprint):
    """--graph stages each batch in a host copy: the budget counts it where the run replays, the record keeps it,
    and a resume that would replay a run solved without it is refused in one line."""
    net = tiny_resnet(classes=4)
    assert Footprint(net, per_process=16, train_images=256, replay=True).staging == 16 * (8 * 8 * 3 * 4 + 8)
    assert train.main(base_args(tmp_path, memory="64GiB", iters=2) + ["--graph"]) == 0
    assert checkpoint.load(tmp_path / "run" / "checkpoint.h5").memory["staging"] == 16 * (8 * 8 * 3 * 4 + 8)
    assert train.main(base_args(tmp_path, out="eager", memory="64GiB", iters=2)) == 0
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "eager"), "--resume", "--iters", "3", "--graph"]) == 2
    assert "resume it without --graph" in one_line_error(capsys.readouterr().err)
