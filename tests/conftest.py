"""Shared test fixtures. Tests are device-generic: they build arrays with backend.xp, so the same
suite runs on NumPy (CI) and on CuPy (MINIBP_DEVICE=gpu on a GPU machine)."""
import minibp  # noqa: F401  before NumPy, so that OpenBLAS takes minibp's thread setting (minibp/__init__.py)
import numpy as np
import pytest

from minibp import backend


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and backend.device != "gpu":
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU: run with MINIBP_DEVICE=gpu on a GPU machine"))


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def device(array):
    """A host array onto the active device."""
    return backend.xp.asarray(array)


def host(array):
    return backend.to_host(array)
