"""The README repeats figures that one place holds: every measured figure in its prose (a number with its unit,
or a +- interval) is in docs/results.md or, for the GPU's, docs/gpu.md, each beside the command that
measures it, so a figure changed there and left here is found."""
import re

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
