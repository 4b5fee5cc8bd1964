"""bench/stores.py: its smoke run, and the candidate stores' codes (mask exact, error within half a bin)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
T = np.float32(1e-6)


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
