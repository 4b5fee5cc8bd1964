"""python -m minibp.plot: curves of runs and the per-unit memory of a plan, and what it says without matplotlib."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from minibp import checkpoint, plot

pytest.importorskip("matplotlib", reason="the plot extra is not installed")


def _fake_run(path, losses):
    path.mkdir()
    lines = [dict(kind="train", iter=i + 1, loss=l, accuracy=0.5) for i, l in enumerate(losses)]
    lines.append(dict(kind="val", iter=len(losses), loss=losses[-1], accuracy=0.6))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_curves_and_plan_plots(tmp_path, capsys):
    _fake_run(tmp_path / "a", [2.0, 1.5, 1.0])
    _fake_run(tmp_path / "b", [2.1, 1.7, 1.3])
    assert plot.main([str(tmp_path / "a"), str(tmp_path / "b"), "--labels", "exact,4", "--out",
                      str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").read_bytes()[:4] == b"\x89PNG"
    assert plot.main(["--plan", "resnet20", "--batch", "16", "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert capsys.readouterr().out == f"wrote {tmp_path / 'c.png'}\nwrote {tmp_path / 'p.png'}\n"


def test_without_out_a_plot_goes_beside_its_run_or_in_the_current_folder(tmp_path, monkeypatch, capsys):
    _fake_run(tmp_path / "a", [2.0, 1.5])
    _fake_run(tmp_path / "b", [2.0, 1.7])
    monkeypatch.chdir(tmp_path)
    assert plot.main(["a"]) == 0 and plot.main(["a", "b"]) == 0 and plot.main(["--plan", "resnet11"]) == 0
    assert capsys.readouterr().out.split("\n") == [f"wrote {name}" for name in (
        "a/curves.png", "curves.png", "plan-resnet11-4.png")] + [""]
    for name in ("a/curves.png", "curves.png", "plan-resnet11-4.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_runs_are_coloured_by_bits_and_styled_by_window_and_the_legend_covers_no_axes(tmp_path, monkeypatch):
    stores = {"exact": ("exact", "block"), "4 fixed": ("4", "fixed"), "4 block": ("4", "block"),
              "2 block": ("2", "block"), "none": None}
    for name in stores:
        _fake_run(tmp_path / name, [2.0, 1.5, 1.0])

    def load(path):  # the checkpoints: a store each, and one run without
        if stores[path.parent.name] is None:
            raise FileNotFoundError(path)
        bits, window = stores[path.parent.name]
        return SimpleNamespace(config=dict(bits=bits, window=window))
    monkeypatch.setattr(checkpoint, "load", load)
    runs = [tmp_path / name for name in stores if name != "none"]
    styles = plot.run_styles(runs)
    assert [(s["color"], s["ls"]) for s in styles] == [("k", "-"), ("C1", ":"), ("C1", "-"), ("C2", "-")]
    # a run of unknown store, or two of one store: a colour per run
    for others in ([tmp_path / "none"], [runs[1]]):
        assert [s["color"] for s in plot.run_styles(runs + others)] == [f"C{i}" for i in range(5)]
    fig = plot.curves_figure(runs)
    fig.canvas.draw()
    [legend] = fig.legends
    box = legend.get_window_extent()
    assert [t.get_text() for t in legend.get_texts()] == list(stores)[:4] + ["training (thin)", "validation (markers)"]
    for ax in fig.axes:
        assert not box.overlaps(ax.get_tightbbox()), "the legend covers an axes"


def test_errors(tmp_path, capsys):
    assert plot.main([str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "no metrics" in capsys.readouterr().err
    assert plot.main(["--out", str(tmp_path / "x.png")]) == 2


@pytest.mark.slow
def test_without_matplotlib_it_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from minibp import plot; plot.main(['--plan', 'resnet11', '--out', 'x.png'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "pip install 'minibp[plot]'" in done.stderr
