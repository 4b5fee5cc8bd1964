"""The README repeats figures that one place holds: every measured figure in its prose (a number with its unit,
or a +- interval) is in docs/results.md or, for the GPU's, docs/gpu.md, each beside the command that
measures it, so a figure changed there and left here is found."""
import re
import subprocess

import pytest

from runs import ROOT

FIGURE = re.compile(r"(?<![\w.])[+-]?\d[\d,]*(?:\.\d+)?(?: \+- \d+(?:\.\d+)?)?"  # a number, or an interval ...
                    r"(?:%| MiB| GiB| ms| s\b| points\b| pt\b|x\b)")                  # ... and its unit


def prose(markdown):
    """The text outside fenced and indented code blocks and inline code."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    return re.sub(r"`[^`]*`", "", text)


def test_every_figure_the_readme_repeats_is_in_the_results_it_comes_from():
    sources = " ".join(" ".join((ROOT / "docs" / name).read_text().split()) for name in ("results.md", "gpu.md"))
    figures = FIGURE.findall(" ".join(prose((ROOT / "README.md").read_text()).split()))
    assert len(figures) >= 5, figures
    # a difference in points is written "pt" in the results' tables
    missing = [figure for figure in figures if re.sub(r" (points|pt)$", "", figure) not in sources]
    assert not missing, f"README figures found neither in docs/results.md nor in docs/gpu.md: {missing}"


@pytest.mark.slow
def test_the_own_images_section_runs_as_written():
    """docs/examples/own_images.sh runs the README's "Your own images" commands as they stand, in a fresh folder:
    every one of them must succeed (the section's time and accuracies come from it, docs/results.md)."""
    done = subprocess.run(["bash", str(ROOT / "docs" / "examples" / "own_images.sh")], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    commands = [line for line in done.stdout.splitlines() if line.startswith("$ python3 ")]
    assert len(commands) == 9 and "the section ran in" in done.stdout.splitlines()[-1]
    assert "accuracy" in done.stdout and "wrote exported/best.onnx" in done.stdout
