"""Shared test fixtures. Tests are device-generic: they build arrays with backend.xp, so the same
suite runs on NumPy (CI) and on CuPy (MINIBP_DEVICE=gpu on a GPU machine). The small nets the tests build
are in nets.py; the data on disk, the trainer's command line and its processes in runs.py.

tests/ mirrors minibp/: a module minibp/X.py's own tests are in tests/test_X.py, minibp/layers/X.py's in
tests/layers/test_X.py, and so on (io/, run/). A module tested through another's file is named in COVERED_BY below,
with that file; tests/test_architecture.py holds every module to one or the other. bench/'s tests are in
test_bench.py; files named for a theme (test_reliability.py, test_own_net.py, test_console.py, ...) hold what crosses
modules. Tests marked slow start processes, build and install the wheel, run a bench script or take seconds:
python3 -m pytest -m "not slow" runs the rest, every module's fast tests, in about a minute."""
import minibp  # noqa: F401  before NumPy, so that OpenBLAS takes minibp's thread setting (minibp/__init__.py)
import signal

import numpy as np
import pytest

from minibp import backend
from minibp.net import Net
from runs import make_dataset, make_tree


# The modules whose tests live in another module's file (or a theme's), and that file, under tests/.
COVERED_BY = {
    "minibp/__init__.py": "test_own_net.py",           # minibp.fit and minibp.load, as a user calls them
    "minibp/version.py": "test_packaging.py",          # the wheel's version is the package's
    "minibp/data.py": "io/test_data.py",               # the old name of io/data.py, kept for a release
    "minibp/blas.py": "test_program.py",               # gemm, recorded and replayed as every device call
    "minibp/layers/__init__.py": "layers/test_layers.py",
    "minibp/layers/launch.py": "layers/test_bn_layout.py",  # every launch shape gives the same bytes
    "minibp/layers/loss.py": "layers/test_layers.py",
    "minibp/layers/bn.py": "layers/test_bn_layout.py",  # and test_fused.py, test_store_exact.py, test_window.py
    "minibp/layers/conv_direct.py": "layers/test_conv.py",
    "minibp/run/modelspec.py": "test_own_net.py",
    "minibp/run/schedule.py": "run/test_config.py",
    "minibp/run/tuning.py": "test_finetune.py",
    "minibp/run/options.py": "run/test_config.py",     # and test_console.py (the help)
    "minibp/run/splits.py": "test_train.py",          # every run loads its data through it; run/test_memory.py
    "minibp/run/trained.py": "test_own_data.py",       # and test_predict.py
    "minibp/run/startup.py": "test_finetune.py",       # and run/test_memory.py
    "minibp/run/session.py": "test_console.py",        # and test_train.py, test_reliability.py
}


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
        calls.append(options["pass_images"])
        assert len(calls) <= 300, "the batch search does not stop"
        return real(self, **options)
    monkeypatch.setattr(Net, "plan", counted)
    return calls


def device(array):
    """A host array onto the active device."""
    return backend.xp.asarray(array)


def host(array):
    return backend.to_host(array)
