"""minibp: memory-efficient backprop with approximate activations (Chakrabarti & Moseley, NeurIPS 2019).

Read in this order: backend (NumPy or CuPy) -> kernels (one loader for CUDA sources on both devices) ->
arena (every buffer planned, one allocation) -> quant (the k-bit store) -> layers -> net (units,
residuals, the approximate-activation schedule) -> optim -> models -> data, checkpoint, memory (a plan
fitted to the memory), scoring (loss and accuracy over a split) -> train.
"""
__version__ = "0.1.0"

import os


def __getattr__(name):
    """minibp.fit (train.fit) and minibp.load (run.trained.load): they load on first use, after the OpenBLAS setting
    below."""
    if name == "fit":
        from .train import fit
        return fit
    if name == "load":
        from .run.trained import load
        return load
    raise AttributeError(f"module 'minibp' has no attribute {name!r}")

# OpenBLAS's idle threads spin for up to 2^28 cycles after each GEMM (its default), taking the cores from
# the OpenMP kernels that run between GEMMs wherever the im2col + BLAS path runs on the CPU (float64, or
# a net compiled with conv="gemm"): a ResNet-20 step took 3-4x longer (bench/threads.py). 2^4
# cycles makes them sleep at once. OpenBLAS reads it when it loads, with NumPy: an import of numpy
# before minibp's keeps OpenBLAS's default (conv="auto", the default, calls no BLAS in float32 on the CPU).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
