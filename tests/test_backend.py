"""The device split: MINIBP_DEVICE is honoured, and asking for a GPU that is not there fails clearly."""
import os
import subprocess
import sys

import pytest

from minibp import backend


def _import_backend(device):
    env = dict(os.environ, MINIBP_DEVICE=device)
    return subprocess.run([sys.executable, "-c", "from minibp import backend; print(backend.device)"],
                          env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_cpu_is_numpy():
    done = _import_backend("cpu")
    assert done.returncode == 0 and done.stdout.strip() == "cpu"


@pytest.mark.slow
@pytest.mark.skipif(backend.device == "gpu", reason="this machine has a GPU")
def test_gpu_without_a_device_fails_with_a_clear_message():
    done = _import_backend("gpu")
    assert done.returncode != 0
    assert "MINIBP_DEVICE=gpu" in done.stderr and "CuPy" in done.stderr


@pytest.mark.slow
def test_unknown_device_is_refused():
    done = _import_backend("tpu")
    assert done.returncode != 0 and "must be 'cpu' or 'gpu'" in done.stderr
    assert "RuntimeError" in done.stderr  # from Python, a library import fails loudly


@pytest.mark.slow
@pytest.mark.parametrize("device", ["tpu", pytest.param("gpu", id="absent-gpu", marks=pytest.mark.skipif(
    backend.device == "gpu", reason="this machine has a GPU"))])  # (an id "gpu" would mark it a GPU test)
def test_the_commands_refuse_a_bad_device_in_one_line(device):
    """The device is chosen when the commands import backend, before their main() runs: still one line."""
    for command in ("train", "evaluate", "plan"):
        done = subprocess.run([sys.executable, "-m", f"minibp.{command}"], env=dict(os.environ, MINIBP_DEVICE=device),
                              capture_output=True, text=True)
        assert done.returncode == 2 and "Traceback" not in done.stderr, (command, done.stderr)
        assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: MINIBP_DEVICE"), done.stderr


def test_to_host_returns_numpy():
    import numpy as np
    assert isinstance(backend.to_host(backend.xp.zeros(3)), np.ndarray)
