"""A wheel of minibp works on its own: it ships the kernel sources (kernels/ -> minibp/kernels_src) and
the licence, and an install of it into a fresh venv trains a step and runs python3 -m minibp.prepare from
outside the checkout."""
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from minibp.version import VERSION

pytestmark = pytest.mark.slow  # builds the wheel and installs it in a fresh venv
REPO = Path(__file__).resolve().parent.parent

TRAIN_ONE_STEP = """
import json, math
import numpy as np
import minibp
from minibp import kernels
from minibp.net import Net
from minibp.optim import SGD
net = Net(input_shape=(8, 8, 3))
net.conv(8, kernel=3)
net.classifier(3)
net.compile(pass_images=4, bits="4")
opt = SGD(net)
rng = np.random.default_rng(0)
net.zero_grad()
loss, _ = net.forward(rng.standard_normal((4, 8, 8, 3)).astype(np.float32), np.array([0, 1, 2, 0]))
net.backward()
opt.step(lr=0.1)
print(json.dumps({"minibp": minibp.__file__, "kernel_dir": str(kernels.KERNEL_DIR), "loss": loss,
                  "version": minibp.__version__}))
"""


def run(command, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    assert done.returncode == 0, f"{' '.join(map(str, command))} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_wheel_ships_the_kernels_and_trains_outside_the_checkout(tmp_path):
    # Build from a copy of what the wheel is made of: an in-tree build would write build/ and
    # minibp.egg-info into the checkout, and a stale build/lib could slip deleted files into the wheel.
    source = tmp_path / "source"
    for folder in ("minibp", "kernels"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", tmp_path / "dist", source])
    [wheel] = (tmp_path / "dist").glob("minibp-*.whl")
    assert wheel.name.startswith(f"minibp-{VERSION}-")  # setup.cfg reads minibp/version.py, where it is written once
    shipped = set(zipfile.ZipFile(wheel).namelist())
    sources = [p.name for p in (REPO / "kernels").iterdir() if p.suffix in (".cu", ".cuh", ".h")]
    assert sources and {f"minibp/kernels_src/{name}" for name in sources} <= shipped, sorted(shipped)
    assert {"minibp/prepare.py", "minibp/io/data.py", "minibp/run/checkpoint.py"} <= shipped  # the subpackages too
    [licence] = [name for name in shipped if ".dist-info/" in name and name.endswith("LICENSE")]
    assert zipfile.ZipFile(wheel).read(licence) == (REPO / "LICENSE").read_bytes()

    # numpy, h5py and pip come from the environment running the tests: nothing is downloaded. Not
    # --system-site-packages, which shows the base Python's packages (without h5py when the tests run
    # in a venv): a .pth file puts this interpreter's own site-packages on the new venv's path, after
    # the venv's. The checkout's editable minibp may be visible through them too, so the script reports
    # which copy it ran.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv])
    python = venv / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    ours = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    (Path(purelib) / "outer-site-packages.pth").write_text("".join(f"{path}\n" for path in ours))
    run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", wheel])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "MINIBP_DEVICE": "cpu"}
    env.pop("PYTHONPATH", None)
    report = json.loads(run([python, "-c", TRAIN_ONE_STEP], cwd=elsewhere, env=env).splitlines()[-1])
    assert Path(report["minibp"]).is_relative_to(venv), report
    assert Path(report["kernel_dir"]).is_relative_to(venv) and report["kernel_dir"].endswith("kernels_src"), report
    assert 0 < report["loss"] < float("inf"), report
    assert report["version"] == VERSION, report
    # the command the trainer's missing-data message gives runs from the wheel
    assert run([python, "-m", "minibp.prepare", "--help"], cwd=elsewhere, env=env).startswith(
        "usage: python3 -m minibp.prepare")
