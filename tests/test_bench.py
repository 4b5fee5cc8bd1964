"""Every script in bench/ runs (tiny settings: seconds), so none rots between the long runs; and the benches' own
helpers, tested directly (bench/stores.py's candidate stores: the mask exact, the error within half a bin)."""
import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from runs import ROOT, make_dataset

sys.path.insert(0, str(ROOT / "bench"))  # the benches' own helpers, tested directly below
T = np.float32(1e-6)  # the mask threshold (quant.MASK_THRESHOLD): bench/stores.py codes bins of v - T


def run(*argv):
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_quant_bench():
    out = run("bench/quant.py", "--values", "1e5", "--repeats", "2")
    assert "kernels   quantize+dequantize" in out and "NumPy ref" in out


@pytest.mark.slow
def test_speed_bench():
    out = run("bench/speed.py", "--model", "resnet11", "--batch", "4", "--rounds", "1")
    assert "vs exact" in out and "GFLOP/s" in out


@pytest.mark.slow
def test_memory_bench():
    out = run("bench/memory.py", "--model", "resnet11", "--batch", "4", "--modes", "exact,4")
    assert "peak - baseline" in out and "worst" in out


@pytest.mark.slow
def test_memory_bench_takes_your_own_net_and_refuses_a_bad_spec_in_one_line():
    out = run("bench/memory.py", "--model", "docs/vgg_example.py:build", "--model-arg", "width=8", "--data",
              "fashion-mnist", "--batch", "4", "--modes", "4")
    assert "peak - baseline" in out and "worst" in out
    done = subprocess.run([sys.executable, "bench/memory.py", "--model", "nowhere.py:build"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1, \
        done.stderr


@pytest.mark.slow
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


def test_a_mode_may_name_its_clip_and_the_run_trains_through_it(tmp_path):
    from gradients import label, store_options
    assert store_options("2:block:stochastic:clip=4") == dict(bits="2", window="block", rounding="stochastic", clip=4.0)
    assert label("2:block:stochastic:clip=inf") == "2 block sr clip inf" and "clip" not in store_options("2:range")
    with pytest.raises(ValueError, match="BITS\\[:WINDOW"):
        store_options("2:block:stochastic:4")
    make_dataset(tmp_path / "data", "fashion-mnist", shape=(8, 8, 1))
    out = run("bench/accuracy.py", "--quick", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "runs"),
              "--modes", "2:block:stochastic,2:block:stochastic:clip=4", "--seeds", "0,1",
              "--baseline", "2:block:stochastic")
    assert "vs 2 block sr" in out and out.splitlines()[-1].split()[0:5] == ["2", "block", "sr", "clip", "4"]
    from minibp.run import checkpoint
    saved = checkpoint.load(next((tmp_path / "runs").glob("*clip-4-seed0/checkpoint.h5")))
    assert (saved.config["bits"], saved.config["rounding"], saved.config["clip"]) == ("2", "stochastic", 4.0)


@pytest.mark.slow
def test_accuracy_bench_ledger(tmp_path):
    """A ledger holds each finished run once; a run it holds is read, not trained, even where its folder is
    gone (another machine); --quick never writes one."""
    import json
    make_dataset(tmp_path / "data", "fashion-mnist", shape=(8, 8, 1))
    ledger = tmp_path / "ledger.jsonl"
    tiny = ["bench/accuracy.py", "--data-dir", str(tmp_path / "data"), "--model", "resnet11", "--iters", "4",
            "--batch", "16", "--lr-schedule", "0:0.05", "--modes", "exact,4:range", "--ledger", str(ledger)]
    first = run(*tiny, "--seeds", "0", "--out", str(tmp_path / "a"))
    records = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(r["mode"], r["seed"]) for r in records] == [("exact", 0), ("4:range", 0)]
    assert all(r["iters"] == 4 and r["validations"][-1] == [4, r["accuracy"]] and r["augment"] == "default"
               and r["resolved_augment"] == "crop,flip" for r in records)
    # another machine: no run folders; seed 0 comes from the ledger, seed 1 trains and is added
    second = run(*tiny, "--seeds", "0,1", "--out", str(tmp_path / "b"))
    assert second.count("from " + str(ledger)) == 2 and not (tmp_path / "b" / "fashion-mnist-resnet11-exact-seed0").exists()
    assert len(ledger.read_text().splitlines()) == 4
    row = lambda out, mode: next(l.split()[1] for l in out.split("test accuracy (%)")[1].splitlines() if l.split()[:1] == [mode])
    assert row(second, "exact") == row(first, "exact")
    done = subprocess.run([sys.executable, "bench/accuracy.py", "--quick", "--ledger", str(ledger)], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--quick run writes none" in done.stderr
    ledger.write_text(ledger.read_text() + "{not json\n")
    done = subprocess.run([sys.executable, *tiny, "--seeds", "0", "--out", str(tmp_path / "c")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "line 5 is not a ledger record" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_accumulation_bench_quick(tmp_path):
    out = run("bench/accumulation.py", "--quick", "--plot", str(tmp_path / "acc.png"))
    assert "naive mean" in out and (tmp_path / "acc.png").stat().st_size > 1000


@pytest.mark.slow
def test_gradnoise_bench_quick(tmp_path):
    out = run("bench/gradnoise.py", "--quick", "--plot", str(tmp_path / "gn.png"))
    assert "g_exact|| / SGD noise" in out and (tmp_path / "gn.png").stat().st_size > 1000


@pytest.mark.slow
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


@pytest.mark.slow
def test_quick_runs_write_no_committed_result():
    """--quick without --plot writes its figure to a temporary folder, never over bench/results."""
    results = ROOT / "bench" / "results"
    before = {p: p.read_bytes() for p in results.glob("*.png")}
    for script in ("bench/accumulation.py", "bench/gradnoise.py"):
        out = run(script, "--quick")
        written = out.split("wrote ")[-1].strip()
        assert written and Path(written).exists() and results not in Path(written).resolve().parents
    assert {p: p.read_bytes() for p in results.glob("*.png")} == before


@pytest.mark.slow
def test_bounds_bench_quick():
    """The floor it prints holds: no quantizer below the rate-distortion bound, Lloyd-Max at or below the
    best uniform one, which is at or below the paper's window."""
    out = run("bench/bounds.py", "--quick")
    for k in (2, 4):
        line = next(l for l in out.splitlines() if l.split()[:1] == [str(k)])
        tokens = line.split()  # k, fixed, then each error followed by its "(ratio)"
        fixed, uniform, lloyd, bound = (float(tokens[i]) for i in (1, 2, 4, 6))
        assert bound == 2.0 ** -k < lloyd <= uniform * 1.001 <= fixed * 1.001, line


@pytest.fixture
def stores(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import stores
    return stores


def heavy_tailed(rng, rows=512):
    """(rows, 8) float32 v: straddling channels with outliers to ~11 sigma, one all positive, one all
    negative, one constant, one with values right at the threshold."""
    v = rng.standard_t(3, (rows, 8)) + np.array([0, 1, -2, 2.5, 0, 0, 0, 0])
    v[rng.integers(0, rows, 4), 0] = [11, -9, 7, 10]
    v[:, 4] = 5 + rng.random(rows)
    v[:, 5] = -5 - rng.random(rows)
    v[:, 6] = 0.25
    v[:, 7] = np.where(rng.random(rows) < 0.5, T, np.nextafter(T, np.float32(0)))
    return v.astype(np.float32)


@pytest.mark.parametrize("k", [8, 4, 2])
@pytest.mark.parametrize("zero_inside", [False, True])
def test_window_codes_keep_the_mask_and_decode_within_half_a_bin(stores, rng, k, zero_inside):
    v = heavy_tailed(rng)
    K = 1 << k
    w, s = stores.window(v.min(axis=0), v.max(axis=0), K, zero_inside=zero_inside)
    q = stores.encode(v, w, s, K)
    vhat, mask = stores.decode(q, w, s)
    assert q.min() >= 0 and q.max() <= K - 1 and np.all(q == np.floor(q))
    np.testing.assert_array_equal(mask, v >= T)
    assert np.all(np.abs(vhat - v) <= w / 2 * (1 + 1e-9) + 2e-6)
    straddling = (v.min(axis=0) < T) & (v.max(axis=0) >= T)
    assert np.all((s[straddling] >= 1) & (s[straddling] <= K - 1))  # zero on an edge inside the codes


@pytest.mark.parametrize("k", [8, 4, 2])
def test_every_candidate_keeps_the_mask_and_only_fixed_windows_clip(stores, rng, k):
    v = heavy_tailed(rng)
    b = np.zeros(v.shape[1], np.float32)
    for name, store in stores.CANDIDATES.items():
        xhat, mask, side, clipped = store(v, b, k)
        np.testing.assert_array_equal(mask, v >= T, err_msg=name)
        if name in ("range, no clip", "group 256 f16", "group 256 f32"):
            assert not clipped.any(), name
    _, _, _, clipped = stores.fixed(v, b, k)
    xhat, _, _, _ = stores.sidebuf(v, b, k, capacity=0.5)  # room for every value beyond the window
    assert clipped.any()  # the outliers lie beyond +-3
    np.testing.assert_allclose(xhat[clipped], v[clipped], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_quick_run_writes_its_tables_outside_the_repository(tmp_path):
    done = subprocess.run([sys.executable, "bench/stores.py", "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    written = Path(done.stdout.strip().splitlines()[-1].removeprefix("wrote "))
    assert ROOT not in written.parents
    text = written.read_text()
    for k in (8, 4, 2):
        assert f"k = {k} bits" in text
    rows = [line.split() for line in text.splitlines() if line.startswith(("fixed", "range", "sidebuf", "group"))]
    assert len(rows) == 3 * 7
    assert all(row[-1] == "0" for row in rows)  # no store loses a mask bit


@pytest.mark.slow
def test_the_reader_bench_runs(tmp_path):
    done = subprocess.run([sys.executable, "bench/reader.py", "--images", "12", "--batch", "4", "--size", "32",
                           "--workers", "1", "--tree", str(tmp_path / "tree")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "train, 1 worker" in done.stdout and "images/s" in done.stdout


@pytest.mark.slow
def test_lr_find_bench_quick_prints_its_table_and_writes_nothing():
    results = ROOT / "bench" / "results" / "lr_find.txt"
    before = results.read_bytes() if results.exists() else None
    out = run("bench/lr_find.py", "--quick")
    assert "| shapes (resnet11) | 0 | sgd | 0.03: " in out and "| shapes (resnet11) | 0 | adamw | 0.0003: " in out
    assert "of its optimizer's best grid rate, or better: " in out and "wrote" not in out
    assert (results.read_bytes() if results.exists() else None) == before


@pytest.mark.slow
def test_scaling_bench_runs():
    from test_dist import ENV  # (test_dist skips itself without mpi4py, which the bench's ranks need)
    done = subprocess.run([sys.executable, "bench/scaling.py", "--model", "resnet11", "--batch", "8", "--steps", "1",
                           "--repeats", "1", "--rounds", "1"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "images/s median" in done.stdout and "resnet1001  10,285,722" in done.stdout


def _bench(*argv, env=None):
    return subprocess.run([sys.executable, "bench/versus_pytorch.py", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.mark.slow
def test_versus_pytorch_without_torch_says_how_to_install_it(tmp_path):
    """A torch that does not import (here a stand-in package raising ImportError): exit 2 and the hint."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    done = _bench("--quick", env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("PyTorch is not installed: pip install torch==2.13.0 "
                                                    "(or pip install -e '.[bench]')")


@pytest.mark.slow
def test_versus_pytorch_quick_prints_the_table():
    pytest.importorskip("torch")
    done = _bench("--quick")
    assert done.returncode == 0, done.stdout + done.stderr
    for row in ("PyTorch", "minibp exact", "minibp 4-bit"):
        assert any(line.strip().startswith(row) for line in done.stdout.splitlines()), done.stdout
    assert "vs PyTorch" in done.stdout and "float32 GEMM" in done.stdout


@pytest.mark.slow
def test_step_bench_counts_the_calls_and_replays_bit_for_bit():
    out = run("bench/step.py", "--quick")
    assert "device calls" in out and "Python calls" in out and "host/step" in out
    assert "replayed step against eager: bit for bit" in out


@pytest.mark.slow
def test_step_bench_counts_the_calls_a_gpu_would_record_on_both_paths():
    """--gpu-paths stands in for cuDNN's graphs (the net's ConvPath builds them by pass_images): it ran only on a
    GPU's word until a rename broke it unseen."""
    out = run("bench/step.py", "--gpu-paths", "--models", "resnet11", "--batch", "8")
    assert "resnet11    gemm" in out and "resnet11    cudnn" in out and "cudnn fprop" in out


def test_the_gpu_bench_says_it_needs_a_gpu():
    # MINIBP_DEVICE=cpu makes the CPU the device on any machine, one with a GPU too
    done = subprocess.run([sys.executable, "bench/gpu.py", "--models", "resnet11"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "MINIBP_DEVICE": "cpu"})
    assert done.returncode == 2 and "needs a GPU" in done.stderr


@pytest.mark.slow
def test_the_tf32_bench_emulates_the_rounding():
    out = run("bench/tf32.py")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("exact", "4 "))]
    assert len(rows) == 4 and all(float(row[-1]) > 0 for row in rows)
