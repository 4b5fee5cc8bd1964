"""python -m minibp.plot: curves of runs and the per-unit memory of a plan, and what it says without matplotlib."""
import json
import subprocess
import sys

import pytest

from minibp import plot

pytest.importorskip("matplotlib", reason="the plot extra is not installed")


def _fake_run(path, losses):
    path.mkdir()
    lines = [dict(kind="train", iter=i + 1, loss=l, accuracy=0.5) for i, l in enumerate(losses)]
    lines.append(dict(kind="val", iter=len(losses), loss=losses[-1], accuracy=0.6))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_curves_and_plan_plots(tmp_path):
    _fake_run(tmp_path / "a", [2.0, 1.5, 1.0])
    _fake_run(tmp_path / "b", [2.1, 1.7, 1.3])
    assert plot.main([str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "exact,4", "--out",
                      str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert plot.main(["--plan", "resnet20", "--batch", "16", "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_errors(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no metrics" in capsys.readouterr().err
    assert plot.main(["--out", str(tmp_path / "x.png")]) == 2


def test_without_matplotlib_it_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from minibp import plot; plot.main(['--plan', 'resnet11', '--out', 'x.png'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "pip install 'minibp[plot]'" in done.stderr
