"""python3 -m minibp.plot: curves of runs and the per-unit memory of a plan, and what it says without matplotlib."""
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from minibp import plot
from minibp.run import checkpoint

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


@pytest.mark.parametrize("bad,message", [
    (dict(kind="train", iter=2, accuracy=0.5), "is a train record without 'loss'"),
    (dict(kind="train", iter=2, loss="high", accuracy=0.5), "is a train record whose loss is 'high', not a number"),
    (dict(kind="val", iter=2, loss=1.0, accuracy=None), "is a val record whose accuracy is None, not a number"),
    (dict(kind="val", loss=1.0, accuracy=0.5), "is a val record without 'iter'"),
    (dict(kind="train", iter=2, loss=True, accuracy=0.5), "is a train record whose loss is True, not a number"),
    (dict(iter=2, loss=1.0, accuracy=0.5), "is a record without 'kind'"),
])
def test_a_record_a_curve_cannot_use_is_one_line_naming_its_line(tmp_path, capsys, bad, message):
    """Not a KeyError, nor a curve through a word: the file's line and what is wrong with it, nothing drawn."""
    _fake_run(tmp_path / "a", [2.0, 1.5, 1.0])
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    lines[1:1] = ["", json.dumps(dict(kind="resume", iter=1, changed=[])), json.dumps(bad)]  # line 4, not the last
    (tmp_path / "a" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert plot.main([str(tmp_path / "a"), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path / 'a' / 'metrics.jsonl'}:4 {message}: the metrics file is damaged\n"
    assert not (tmp_path / "c.png").exists()


def test_an_out_without_a_suffix_is_a_png_and_the_path_printed_is_the_file_written(tmp_path, capsys):
    _fake_run(tmp_path / "a", [2.0, 1.5])
    (tmp_path / "plots").mkdir()
    assert plot.main([str(tmp_path / "a"), "--out", str(tmp_path / "plots" / "x")]) == 0
    assert plot.main(["--plan", "resnet11", "--out", str(tmp_path / "plots" / "p.")]) == 0
    written = [tmp_path / "plots" / "x.png", tmp_path / "plots" / "p.png"]
    assert capsys.readouterr().out == "".join(f"wrote {path}\n" for path in written)
    assert sorted((tmp_path / "plots").iterdir()) == sorted(written)
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in written)


@pytest.mark.slow
def test_without_matplotlib_it_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from minibp import plot; plot.main(['--plan', 'resnet11', '--out', 'x.png'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "-m pip install -e" in done.stderr and "[plot]'" in done.stderr


def test_a_failed_validation_has_no_point_and_does_not_stop_the_plot(tmp_path):
    # the trainer logs a validation whose loss is not finite with loss and accuracy null and an "error"
    run = tmp_path / "run"
    run.mkdir()
    records = [dict(kind="train", iter=1, loss=2.0, accuracy=0.1), dict(kind="val", iter=1, loss=1.9, accuracy=0.2),
               dict(kind="val", iter=2, loss=None, accuracy=None, error="the loss over the test split is inf")]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert [r["iter"] for r in plot.curve_records(run / "metrics.jsonl")] == [1, 1]
    assert plot.plot_runs([run], out=tmp_path / "c.png") == tmp_path / "c.png"


def test_a_plot_is_written_whole_and_never_through_a_link(tmp_path, capsys):
    _fake_run(tmp_path / "a", [2.0, 1.5])
    victim = tmp_path / "victim.txt"
    victim.write_text("the victim's own\n")
    (tmp_path / "a" / "curves.png").symlink_to(victim)
    assert plot.main([str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'a' / 'curves.png'} is a symbolic link" in err and err.count("\n") == 1
    assert victim.read_text() == "the victim's own\n"
    (tmp_path / "a" / "curves.png").unlink()
    assert plot.main([str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["curves.png", "metrics.jsonl"]
