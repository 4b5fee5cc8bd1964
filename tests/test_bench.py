"""Every script in bench/ runs (tiny settings: seconds), so none rots between the long runs."""
import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_train import make_dataset

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # the benches' own helpers, tested directly below


def run(*argv):
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_quant_bench():
    out = run("bench/quant.py", "--values", "1e5", "--repeats", "2")
    assert "kernels   quantize+dequantize" in out and "NumPy ref" in out


def test_speed_bench():
    out = run("bench/speed.py", "--model", "resnet11", "--batch", "4", "--rounds", "1")
    assert "vs exact" in out and "GFLOP/s" in out


def test_memory_bench():
    out = run("bench/memory.py", "--model", "resnet11", "--batch", "4", "--modes", "exact,4")
    assert "peak - baseline" in out and "worst" in out


def test_accuracy_bench_quick(tmp_path):
    make_dataset(tmp_path / "data", "fashion-mnist", shape=(8, 8, 1))
    out = run("bench/accuracy.py", "--quick", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "runs"),
              "--modes", "exact,4:range,naive", "--seeds", "0,1")
    assert "vs exact" in out and "naive" in out and "4 range" in out and "seed 1" in out
    # run again, the data moved: every run resumes at its end with the same accuracy, and no time a run is
    # claimed for them
    table = out.split("test accuracy (%)")[1].splitlines()[2:5]
    (tmp_path / "data").rename(tmp_path / "moved")
    again = run("bench/accuracy.py", "--quick", "--data-dir", str(tmp_path / "moved"), "--out", str(tmp_path / "runs"),
                "--modes", "exact,4:range,naive", "--seeds", "0,1").split("test accuracy (%)")[1].splitlines()[2:5]
    assert [row.split()[-1] for row in table] != ["-"] * 3 and [row.split()[-1] for row in again] == ["-"] * 3
    assert [row.split()[:-1] for row in again] == [row.split()[:-1] for row in table]


def test_accumulation_bench_quick(tmp_path):
    out = run("bench/accumulation.py", "--quick", "--plot", str(tmp_path / "acc.png"))
    assert "naive mean" in out and (tmp_path / "acc.png").stat().st_size > 1000


def test_gradnoise_bench_quick(tmp_path):
    out = run("bench/gradnoise.py", "--quick", "--plot", str(tmp_path / "gn.png"))
    assert "g_exact|| / SGD noise" in out and (tmp_path / "gn.png").stat().st_size > 1000


def test_gradnoise_systematic_share(tmp_path):
    """The repeated share is 1 for one error on every batch and 1/sqrt(n) for n orthogonal ones of one size;
    the bench prints it for every mode and point."""
    from gradnoise import repeated_share
    rng = np.random.default_rng(0)
    bias = rng.standard_normal(50)
    assert repeated_share([bias] * 7) == pytest.approx(1.0)
    assert repeated_share(np.eye(9) * 3.0) == pytest.approx(1 / 3)
    assert repeated_share([bias, -bias]) == pytest.approx(0.0, abs=1e-12)
    out = run("bench/gradnoise.py", "--quick", "--systematic", "--modes", "4:block,2:fixed", "--plot",
              str(tmp_path / "gn.png"))
    rows = [line.split() for line in out.split("batch repeats")[1].splitlines()]
    shares = [float(row[3]) for row in rows if len(row) == 6 and row[0].isdigit()]
    assert len(shares) == 4 and all(0 < s <= 1 for s in shares)


def test_only_the_default_run_writes_the_committed_result():
    """A bench run with any option off its default (--data-dir aside) writes to a temporary folder."""
    from gradients import out_path
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="4:block")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--plot")
    parser.add_argument("--quick", action="store_true")
    default = "bench/results/x.png"
    assert out_path(None, default=default, parser=parser, args=parser.parse_args([])) == default
    assert out_path(None, default=default, parser=parser, args=parser.parse_args(["--data-dir", "d"])) == default
    for argv in (["--modes", "2:block"], ["--quick"]):
        written = Path(out_path(None, default=default, parser=parser, args=parser.parse_args(argv)))
        assert written.name == "x.png" and (ROOT / "bench") not in written.resolve().parents


def test_quick_runs_write_no_committed_result():
    """--quick without --plot writes its figure to a temporary folder, never over bench/results."""
    results = ROOT / "bench" / "results"
    before = {p: p.read_bytes() for p in results.glob("*.png")}
    for script in ("bench/accumulation.py", "bench/gradnoise.py"):
        out = run(script, "--quick")
        written = out.split("wrote ")[-1].strip()
        assert written and Path(written).exists() and results not in Path(written).resolve().parents
    assert {p: p.read_bytes() for p in results.glob("*.png")} == before


def test_bounds_bench_quick():
    """The floor it prints holds: no quantizer below the rate-distortion bound, Lloyd-Max at or below the
    best uniform one, which is at or below the paper's window."""
    out = run("bench/bounds.py", "--quick")
    for k in (2, 4):
        line = next(l for l in out.splitlines() if l.split()[:1] == [str(k)])
        tokens = line.split()  # k, fixed, then each error followed by its "(ratio)"
        fixed, uniform, lloyd, bound = (float(tokens[i]) for i in (1, 2, 4, 6))
        assert bound == 2.0 ** -k < lloyd <= uniform * 1.001 <= fixed * 1.001, line
