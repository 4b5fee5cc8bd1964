"""The benches' shared command-line options, declared once: the net and batch, the data, the stores a bench
compares (--modes, in gradients.py's words), the seed, and the CPU a figure stands for (--cpu: a narrower
instruction set imitated on a wider machine)."""
import os
import platform
import sys

from minibp import build

# A narrower CPU imitated on a wider one (--cpu avx2 on an AVX-512 machine): minibp's kernels, NumPy's
# OpenBLAS and PyTorch's kernels (ATen, oneDNN, MKL) all limited to that instruction set, so that the
# ratios measured stand for that class of machine. Each library reads its variable when it loads.
NARROWER_CPU = {
    "avx2": {build.TARGET_VARIABLE: "avx2", "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
             "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
}


def limit_cpu(target):
    """Run this process again with every library limited to target (NARROWER_CPU), unless it already is."""
    if target is None:
        return
    if target not in build.usable_cpu_targets():
        sys.exit(f"--cpu {target}: this CPU runs {', '.join(build.usable_cpu_targets())}")
    variables = NARROWER_CPU[target]
    if any(os.environ.get(k) != v for k, v in variables.items()):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable] + sys.argv, {**os.environ, **variables})


def cpu_model():
    """The CPU's name, as figures say which machine measured them."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def net_options(parser, *, model, batch, data=None, data_choices=None, data_dir=False, batch_help="images a step"):
    """--model (model None: the bench builds its own nets), --batch and (data given) --data, with this bench's
    defaults; data_dir: --data-dir too."""
    if model is not None:
        parser.add_argument("--model", default=model,
                            help=f"resnet<9n+2> or another models.py name (default {model})")
    parser.add_argument("--batch", type=int, default=batch, help=f"{batch_help} (default {batch})")
    if data is not None:
        parser.add_argument("--data", default=data, choices=data_choices, help=f"the data set (default {data})")
    if data_dir:
        parser.add_argument("--data-dir", default="data", help="where python3 -m minibp.prepare wrote it (default data)")


def modes_option(parser, default):
    """--modes: the stores to compare, comma-separated, each as gradients.store_options reads it."""
    parser.add_argument("--modes", default=default, help="stores, comma-separated: exact, naive, k bits through the "
                        f"default window (4) or a named one (4:range), rounded at random (2:block:stochastic); "
                        f"default {default}")


def seed_option(parser):
    """--seed: the nets' initial weights and the data's order."""
    parser.add_argument("--seed", type=int, default=0,
                        help="the nets' initial weights and the data's order (default 0)")


def cpu_option(parser):
    parser.add_argument("--cpu", choices=list(NARROWER_CPU), help="imitate a CPU of this narrower instruction set "
                        "(minibp's kernels, NumPy's BLAS and PyTorch's kernels limited to it)")

