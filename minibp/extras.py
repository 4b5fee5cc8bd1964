"""The optional extras (setup.cfg's extras_require) and the one command that installs one, where minibp runs from:

    install_command("images")    # "/work/minibp/.venv/bin/python3 -m pip install -e '/work/minibp[images]'"
    missing("images", "reading image files needs Pillow")     # the refusal's text, that command in it

In a checkout (setup.sh's venv installs minibp editable, from its folder) the command installs the extra from
that folder; for minibp installed from a wheel, from the package index. It names this process's Python, so it
installs into the environment that refused, whichever is active in the shell.
"""
import shlex
import sys
from pathlib import Path

EXTRAS = ("images", "imagenet", "export", "plot", "dist", "gpu", "gpu-dist", "cudnn")  # setup.cfg lists their packages


def _checkout():
    """The checkout minibp runs from (its folder holds setup.cfg naming minibp), or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    try:
        config = (root / "setup.cfg").read_text(encoding="utf-8")
    except OSError:
        return None
    return root if "\nname = minibp\n" in config else None


def install_command(extra):
    """The command that installs `extra` into this process's Python environment."""
    if extra not in EXTRAS:
        raise ValueError(f"minibp has no extra {extra!r}: {', '.join(EXTRAS)}")
    root = _checkout()
    target = f"-e {shlex.quote(f'{root}[{extra}]')}" if root else shlex.quote(f"minibp[{extra}]")
    return f"{shlex.quote(sys.executable)} -m pip install {target}"


def missing(extra, what):
    """A refusal's text for `what` needs an extra that is not installed: what, then the command that installs it."""
    return f"{what}: install it with {install_command(extra)}"
