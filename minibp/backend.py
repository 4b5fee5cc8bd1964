"""The device split: which array module (`xp`) minibp computes with.

This is the only module that imports CuPy. Everything else writes array code once
against `backend.xp` and asks `backend.device` ("cpu" or "gpu") when it must differ.

    MINIBP_DEVICE=cpu   NumPy, kernels compiled by g++ (see kernels.py)
    MINIBP_DEVICE=gpu   CuPy, kernels compiled by NVRTC; fails loudly without a usable GPU
    unset               gpu when CuPy imports and sees a device, else cpu, silently

A bad MINIBP_DEVICE is a RuntimeError at import; under a command (python3 -m minibp.train, ...), which
imports this module before its main() can catch anything, it is instead the command's one-line error
and exit status 2.
"""
import os
import sys

import numpy

from . import extras


def _cupy_if_usable():
    """Return the cupy module when it imports and a CUDA device answers, else (None, why)."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a broken CUDA install raising anything
        return None, f"CuPy does not import ({type(e).__name__}: {e}); {extras.install_command('gpu')}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return None, f"CuPy imports but finds no usable CUDA device ({type(e).__name__}: {e})"
    if count < 1:
        return None, "CuPy imports but finds no CUDA device"
    return cupy, ""


def _choose():
    requested = os.environ.get("MINIBP_DEVICE", "").strip().lower()
    if requested not in ("", "cpu", "gpu"):
        raise RuntimeError(f"MINIBP_DEVICE must be 'cpu' or 'gpu' (or unset), not {requested!r}")
    if requested == "cpu":
        return numpy, "cpu"
    cupy, why = _cupy_if_usable()
    if cupy is not None:
        return cupy, "gpu"
    if requested == "gpu":
        raise RuntimeError(f"MINIBP_DEVICE=gpu, but {why}. Unset MINIBP_DEVICE or set it to cpu to run on NumPy.")
    return numpy, "cpu"


def _choose_for_command():
    try:
        return _choose()
    except RuntimeError as e:
        command = getattr(sys.modules.get("__main__"), "__spec__", None)
        if command is None or not command.name.startswith("minibp."):
            raise
        print(f"error: {e}", file=sys.stderr)  # the commands' form for a bad option (exit 2)
        raise SystemExit(2) from None


xp, device = _choose_for_command()


def to_host(array):
    """A NumPy copy (or the array itself on the CPU)."""
    return array.get() if device == "gpu" else numpy.asarray(array)


def copy_in(dst, src):
    """dst[...] = src, src a host or device array: a host one copied straight into the device buffer (no temporary
    on the device beside the plan; on the GPU a synchronous copy, done before any later launch reads dst)."""
    if device == "gpu" and isinstance(src, numpy.ndarray):
        dst.set(numpy.ascontiguousarray(src))
    else:
        xp.copyto(dst, src)


def is_device_array(array):
    """True for an array of the active array module (numpy.ndarray on cpu, cupy.ndarray on gpu)."""
    return isinstance(array, xp.ndarray)


def synchronize():
    """Wait for queued device work (a no-op on the CPU); for timings."""
    if device == "gpu":
        xp.cuda.get_current_stream().synchronize()


def available_memory():
    """Bytes a new allocation can take now: free device memory on the GPU, MemAvailable on the CPU
    (None where the system does not say)."""
    if device == "gpu":
        # free on the device, plus what CuPy's pool holds unused (it hands that out first)
        return int(xp.cuda.runtime.memGetInfo()[0]) + int(xp.get_default_memory_pool().free_bytes())
    return host_memory()


def host_memory():
    """Bytes the host can allocate now (MemAvailable), or None where the system does not say."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None
