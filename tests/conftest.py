"""Shared test fixtures. Tests are device-generic: they build arrays with backend.xp, so the same
suite runs on NumPy (CI) and on CuPy (MINIBP_DEVICE=gpu on a GPU machine). The small nets the tests build
are in nets.py; the data on disk, the trainer's command line and its processes in runs.py.

A module minibp/X.py's own tests are in tests/test_X.py (minibp/layers/: test_layers.py, test_conv.py,
test_bn_layout.py, test_pool_layout.py, test_cudnn.py; checks.py also through the Net in test_api_errors.py),
bench/'s in test_bench.py; files named for a theme (test_reliability.py, test_own_net.py, test_console.py, ...)
hold what crosses modules. Tests marked slow
start processes, build and install the wheel, run a bench script or take seconds: python3 -m pytest -m "not
slow" runs the rest, every module's fast tests, in about a minute."""
import minibp  # noqa: F401  before NumPy, so that OpenBLAS takes minibp's thread setting (minibp/__init__.py)
import signal

import numpy as np
import pytest

from minibp import backend
from minibp.net import Net
from runs import make_dataset, make_tree


def pytest_configure(config):
    # A suite started with SIGINT ignored (a shell's background job) would pass the ignoring on to every process
    # a test starts, and a test's Ctrl-C would then wait for its timeout: the tests send the signals they mean to.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and backend.device != "gpu":
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU: run with MINIBP_DEVICE=gpu on a GPU machine"))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


@pytest.fixture
def data_dir(tmp_path):
    """A folder holding runs.make_dataset's cifar10.h5 (8x8x3 images, 4 classes), where base_args looks."""
    make_dataset(tmp_path / "data")
    return tmp_path / "data"


@pytest.fixture
def tree(tmp_path):
    """A small ImageNet folder tree (runs.make_tree)."""
    return make_tree(tmp_path / "imagenet")


@pytest.fixture
def plan_calls(monkeypatch):
    """Counts Net.plan calls, and stops a search that would run for minutes after a few hundred."""
    calls, real = [], Net.plan

    def counted(self, **options):
        calls.append(options["batch"])
        assert len(calls) <= 300, "the batch search does not stop"
        return real(self, **options)
    monkeypatch.setattr(Net, "plan", counted)
    return calls


def device(array):
    """A host array onto the active device."""
    return backend.xp.asarray(array)


def host(array):
    return backend.to_host(array)
