"""extras.py: one command installs an extra, the one that works where minibp runs from (a checkout's venv, as
setup.sh makes it, or a wheel), and every refusal for a missing extra in the package says it that way."""
import re
import sys
from pathlib import Path

import pytest

from minibp import extras

PACKAGE = Path(extras.__file__).parent


def test_a_checkout_installs_an_extra_from_its_own_folder_into_this_python():
    root = PACKAGE.parent
    assert extras.install_command("images") == f"{sys.executable} -m pip install -e '{root}[images]'"
    assert extras.missing("plot", "minibp.plot needs matplotlib") == \
        f"minibp.plot needs matplotlib: install it with {sys.executable} -m pip install -e '{root}[plot]'"
    with pytest.raises(ValueError, match="minibp has no extra 'pillow'"):
        extras.install_command("pillow")


def test_a_wheel_installs_an_extra_from_the_index(monkeypatch):
    monkeypatch.setattr(extras, "_checkout", lambda: None)
    assert extras.install_command("export") == f"{sys.executable} -m pip install 'minibp[export]'"


def test_every_extra_is_setup_cfgs_and_every_refusal_says_the_command_one_way():
    config = (PACKAGE.parent / "setup.cfg").read_text()
    declared = re.findall(r"^([\w-]+) =$", config.split("[options.extras_require]")[1].split("\n[")[0], re.M)
    assert set(extras.EXTRAS) == set(declared) - {"test", "bench"}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"pip install [-'\"]", text) or path.name == "extras.py", \
            f"{path} writes an install command of its own: use extras.missing"
