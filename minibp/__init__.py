"""minibp: memory-efficient backprop with approximate activations (Chakrabarti & Moseley, NeurIPS 2019).

Read in this order (docs/architecture.md, "Reading path"; tests/test_architecture.py holds it to the imports): each
module imports only those before it.
The engine, here: version -> extras (the optional extras' install lines) -> backend (NumPy or CuPy) -> constants
(numbers shared with the kernels) -> integrity (checksums, atomic writes) -> build (the CPU builds) -> program (every
device call, recorded and replayed) -> kernels (one loader for CUDA sources on both devices) -> blas (the matrix
product; cuBLAS bound by minibp) -> arena (every buffer planned, one allocation) -> quant (the k-bit store) -> params
(the parameter table) -> checks -> layers -> units -> chain -> optim -> net (the approximate-activation schedule) ->
models (the paper's ResNets) -> step (one training step) -> dist (several processes).
The readers, io/: workers -> images (image files, a folder of them) -> data (the HDF5 data sets) -> batches
(shuffled, augmented batches) -> imagenet (the streaming JPEG reader).
A run's libraries, run/: modelspec (a ResNet's name or your own net) -> schedule -> sizing (a plan fitted to the
memory) -> tuning -> options (the trainer's options, declared) -> config (RunConfig, checked whole) -> splits ->
folder (lock and metrics log) -> checkpoint -> budget -> calibration -> memory (--memory) -> evaluation (loss and
accuracy over a split) -> trained (minibp.load) -> startup (a run's start) -> session (a run's loop).
The command lines, python3 -m minibp.X: cli (what they share) -> prepare, plot, plan, evaluate, predict, export,
lr_find, train (and minibp.fit).
"""
import os

from . import cli
from .version import VERSION as __version__

# python3 -m minibp.X: Ctrl-C and SIGTERM are one line and a status from here on, the command's imports included
if (cli.command() or "").startswith("minibp."):
    cli.starting(cli.command())


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
