"""One loader for the hand-written kernels in kernels/*.cu, on both devices.

A kernel file holds `extern "C" __global__` functions written in plain CUDA C++. The loader
reads their signatures from the source, so every call is checked the same way on both devices
(pointer dtypes, C-contiguity, array module, writability, scalar ranges) before it launches:

    module = kernels.load("sgd.cu")                    # real_t = float
    module.sgd_momentum(n=n, n_decay=d, lr=0.1, momentum=0.9, weight_decay=2e-4,
                        params=p, grads=g, velocity=v, threads=n)   # a grid covering n threads, 256 a block
    module.sgd_momentum(..., grid=(3,), block=(7,))    # or an explicit launch shape

Arguments go by name, each checked against the parameter of that name in the source. A call launches at
once, or, while program.record() records a pass, binds the launch (its checked, converted arguments and
shape) for the program to replay.

GPU: the source is compiled by NVRTC through cupy.RawModule, once per process.
CPU: the same source is wrapped in a generated C++ file (kernels/cpu_shim.h supplies the CUDA
names) that adds one exported launcher per kernel, built by build.py (g++ with OpenMP, for the CPU's
instruction set, cached on disk) and called through ctypes. A cached file that is not minibp's build (another
library under its name, with a record that matches it: the user's own cache, which build.py trusts) is a
KernelError of one line naming it and the fix: delete it, and it is built again.

`real_t` is a macro every kernel file may use for its floating-point type; `load(..., dtype=)`
picks float (float32, the default) or double (float64, for gradient checks).
"""
import ctypes
import functools
import os
import re
from pathlib import Path

import numpy as np

from . import backend, build, constants, program
from .build import KernelError

# The sources are the top-level kernels/ folder. A wheel ships a copy of it as minibp/kernels_src
# (setup.cfg maps the folder to that package); a checkout or an editable install reads kernels/ itself.
_PACKAGED_KERNELS = Path(__file__).resolve().parent / "kernels_src"
KERNEL_DIR = _PACKAGED_KERNELS if _PACKAGED_KERNELS.is_dir() else Path(__file__).resolve().parent.parent / "kernels"
BLOCK = 256  # threads a block in the default launch shape

# C type of a kernel parameter -> NumPy dtype. real_t resolves to the module's dtype.
_C_TYPES = {
    "float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
    "unsigned char": np.uint8, "real_t": None,
}
_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


class Param:
    """One kernel parameter as declared: name, NumPy dtype, pointer or scalar, const or not."""

    def __init__(self, text, real_dtype):
        words = text.replace("*", " * ").replace("__restrict__", " ").split()
        self.name = words[-1]
        self.is_pointer = "*" in words
        self.is_const = "const" in words
        base = " ".join(w for w in words[:-1] if w not in ("const", "*"))
        if base not in _C_TYPES:
            raise KernelError(f"kernel parameter {text.strip()!r}: type {base!r} is not one the loader knows "
                              f"({', '.join(_C_TYPES)})")
        self.dtype = np.dtype(real_dtype if base == "real_t" else _C_TYPES[base])
        self.c_text = text.strip()
        # what the checks of every launch compare with, taken once: a launch is thousands a step, each
        # checking a dozen arguments, and on a GPU the host's time is what the step waits for
        self._scalar = self.dtype.type
        info = np.iinfo(self.dtype) if self.dtype.kind in "iu" else None
        self._range = (int(info.min), int(info.max)) if info is not None else None

    def convert(self, kernel_name, value):
        """Check one argument and return what the launcher takes for it."""
        # the common cases, checked as below but without building a message
        if self.is_pointer:
            if value is None:  # a null pointer: the kernels treat it as "not wanted"
                return None
            if (isinstance(value, backend.xp.ndarray) and value.dtype == self.dtype and value.flags.c_contiguous
                    and (self.is_const or backend.device != "cpu" or value.flags.writeable)):
                return value
        elif type(value) is bool and self._range is not None:  # a flag: the kernels take C ints for them
            return self._scalar(int(value))
        elif type(value) is int and self._range is not None:
            if self._range[0] <= value <= self._range[1]:
                return self._scalar(value)
        elif type(value) is float and self._range is None:
            return self._scalar(value)
        return self._convert_or_explain(kernel_name, value)

    def _convert_or_explain(self, kernel_name, value):
        where = f"{kernel_name}() argument {self.name!r}"
        if self.is_pointer:
            if not backend.is_device_array(value):
                raise ValueError(f"{where}: expected a {backend.xp.__name__} array, got {type(value).__name__}")
            if value.dtype != self.dtype:
                raise ValueError(f"{where}: expected dtype {self.dtype}, got {value.dtype}")
            if not value.flags.c_contiguous:
                raise ValueError(f"{where}: the array must be C-contiguous")
            if backend.device == "cpu" and not self.is_const and not value.flags.writeable:
                raise ValueError(f"{where}: the kernel writes this array, but it is read-only")
            return value
        if isinstance(value, (bool, np.bool_)) and self.dtype.kind in "iu":
            value = int(value)  # a flag: the kernels take C ints for them
        if isinstance(value, (np.ndarray, bool, np.bool_)) or not np.isscalar(value):
            raise ValueError(f"{where}: expected a scalar, got {type(value).__name__}")
        if self.dtype.kind in "iu":
            if not float(value).is_integer():
                raise ValueError(f"{where}: expected an integer, got {value!r}")
            if not self._range[0] <= int(value) <= self._range[1]:
                raise ValueError(f"{where}: {value} does not fit {self.dtype}")
        return self._scalar(value)


class Kernel:
    """A callable kernel: kernel(name=value, ..., threads=n) or kernel(name=value, ..., grid=(..), block=(..))."""

    def __init__(self, name, params, bind):
        self.name, self.params, self._bind = name, params, bind
        self._names = frozenset(p.name for p in params)

    def __call__(self, *args, threads=None, grid=None, block=None, **arguments):
        """Launch, or record the launch (program.py): the arguments checked and converted here, once."""
        if args or arguments.keys() != self._names:
            names = [p.name for p in self.params]
            if args:
                raise TypeError(f"{self.name}(): pass the kernel's arguments by name ({', '.join(names)})")
            missing, unknown = [n for n in names if n not in arguments], [n for n in arguments if n not in names]
            raise ValueError(f"{self.name}() takes {', '.join(names)}" + (f"; missing {', '.join(missing)}" if missing
                             else "") + (f"; no parameter {', '.join(unknown)}" if unknown else ""))
        converted = [p.convert(self.name, arguments[p.name]) for p in self.params]
        if threads is not None:
            if grid is not None or block is not None:
                raise ValueError("give either threads= or grid= and block=, not both")
            threads = int(threads)
            if threads <= 0:
                return  # nothing to do: launching an empty grid is an error on the GPU
            grid, block = (min(-(-threads // BLOCK), 2**31 - 1),), (BLOCK,)
        if grid is None or block is None:
            raise ValueError(f"{self.name}(): give threads= or both grid= and block=")
        self._bind(self.name, _dim3(grid), _dim3(block), converted)

    def __repr__(self):
        return f"<kernel {self.name}({', '.join(p.c_text for p in self.params)})>"


def _dim3(shape):
    shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if not 1 <= len(shape) <= 3 or min(shape) < 1:
        raise ValueError(f"a launch shape needs 1 to 3 positive sizes, got {shape}")
    return shape + (1,) * (3 - len(shape))


class Module:
    """The kernels of one .cu file, instantiated for one real_t; kernels are attributes."""

    def __init__(self, path, kernels):
        self.path, self.kernels = path, kernels

    def __getattr__(self, name):
        try:
            return self.__dict__["kernels"][name]
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('path')} has no kernel {name!r}") from None


def parse_signatures(source, real_dtype):
    """[(kernel name, [Param, ...])] of every extern "C" __global__ function in a source."""
    return [(name, [Param(p, real_dtype) for p in params.split(",") if p.strip()])
            for name, params in _SIGNATURE.findall(source)]


def _source_path(filename):
    """kernels/<filename>, or filename itself when it is a path (a kernel file kept elsewhere, as the tests'
    tests/quant.cu: it includes kernels/ headers all the same)."""
    path = filename if isinstance(filename, Path) else KERNEL_DIR / filename
    if not path.is_file():
        raise FileNotFoundError(f"no kernel source {path} (minibp reads kernels/ beside the package in a checkout, "
                                "or minibp/kernels_src in an installed wheel)")
    return path


def _real_name(dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"kernels are instantiated for float32 or float64, not {dtype}")
    return "float" if dtype == np.float32 else "double"


@functools.lru_cache(maxsize=None)
def load(filename, dtype=np.float32):
    """The Module of kernels/<filename> (or of a Path) for real_t = dtype, compiled on first use."""
    path = _source_path(filename)
    source = path.read_text()
    signatures = parse_signatures(source, dtype)
    if not signatures:
        raise KernelError(f"{path} declares no extern \"C\" __global__ kernel")
    loader = _load_gpu if backend.device == "gpu" else _load_cpu
    return Module(path, loader(path, source, signatures, _real_name(dtype)))


# ----------------------------------------------------------------------------- GPU: NVRTC

def gpu_compile_options(real_name):
    # --fmad=false: no fused multiply-add contraction, so float kernels round as g++ does on the CPU.
    # -default-device: a generic lambda in a kernel (bn.cu hands its walkers one) is device code, as nvcc makes it.
    return ("-std=c++17", "--fmad=false", "-default-device", f"-Dreal_t={real_name}", *constants.defines(),
            f"-I{KERNEL_DIR}")


def _load_gpu(path, source, signatures, real_name):
    cupy = backend.xp
    try:
        module = cupy.RawModule(code=source, options=gpu_compile_options(real_name))
        module.compile()
    except cupy.cuda.compiler.CompileException as e:
        raise KernelError(f"NVRTC could not compile {path}:\n{e}") from None
    kernels = {}
    for name, params in signatures:
        function = module.get_function(name)

        def bind(name, grid, block, args, f=function):
            # CuPy passes None as 0xffffffff, not NULL (cupy/cupy#9046): a 64-bit zero is a null pointer.
            program.issue(name, f, grid, block, tuple(np.uint64(0) if a is None else a for a in args))

        kernels[name] = Kernel(name, params, bind)
    return kernels


def compile_cubin(filename, *, dtype=np.float32, arch="sm_90"):
    """Compile kernels/<filename> to a CUBIN with NVRTC and the GPU path's options; needs no GPU.

    Used by the tests to prove every kernel builds for the GPU machines on a machine without one.
    """
    from cupy.cuda import nvrtc  # the low-level API compiles without a device, RawModule does not
    path = _source_path(filename)
    program = nvrtc.createProgram(path.read_text(), path.name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(gpu_compile_options(_real_name(dtype))) + [f"-arch={arch}"])
        except nvrtc.NVRTCError as e:
            raise KernelError(f"NVRTC could not compile {path} for {arch}: {e}\n"
                              f"{nvrtc.getProgramLog(program)}") from None
        return nvrtc.getCUBIN(program)
    finally:
        nvrtc.destroyProgram(program)


# ----------------------------------------------------------------------------- CPU: launchers built by build.py

def _cpu_wrapper_source(path, signatures):
    """C++ that includes the kernel file and exports minibp_launch_<name>(grid, block, args...), and beside each an
    empty minibp_empty_<name> of the same signature (empty_twins)."""
    lines = [f'#include "{path}"', ""]
    for name, params in signatures:
        decl = ", ".join(["unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz"]
                         + [p.c_text for p in params])
        args = ", ".join(["dim3(gx, gy, gz)", "dim3(bx, by, bz)"] + [p.name for p in params])
        lines.append(f'extern "C" void minibp_launch_{name}({decl}) {{ minibp_shim::launch<&{name}>({args}); }}')
        lines.append(f'extern "C" void minibp_empty_{name}({decl}) {{}}')
    return "\n".join(lines) + "\n"


# {id of a CPU launcher: its empty twin, the same signature and no work}: bench/step.py swaps them into a recorded
# step to time the host's share of it (the calls, their arguments, the loop) apart from the kernels' work. (By id:
# ctypes functions do not hash; the loaded modules keep them alive.)
empty_twins = {}


def _load_cpu(path, source, signatures, real_name):
    # OpenMP threads that spin between kernels fight NumPy's BLAS threads (which spin between GEMMs)
    # for the same cores: measured 13x slower on 2 cores. Sleeping at once costs a few microseconds
    # a launch instead. libgomp reads this when the first kernel library loads it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    built = build.cached_library(path, _cpu_wrapper_source(path, signatures), real_name, KERNEL_DIR)
    try:
        library = ctypes.CDLL(str(built))
        launchers = {name: (getattr(library, f"minibp_launch_{name}"), getattr(library, f"minibp_empty_{name}"))
                     for name, _ in signatures}
    except (OSError, AttributeError) as e:  # the user's cache holds another library by its name (and record)
        why = str(e).rsplit(": ", 1)[-1]  # (less the path ctypes names: /proc/self/fd/N)
        why = f"it has no {why}" if isinstance(e, AttributeError) else why
        raise KernelError(f"{os.path.realpath(built)} is not minibp's build of {path.name} ({why}): delete it, and "
                          "minibp builds it again") from None
    c_scalar = {np.float32: ctypes.c_float, np.float64: ctypes.c_double, np.int32: ctypes.c_int32,
                np.int64: ctypes.c_int64, np.uint8: ctypes.c_uint8}
    kernels = {}
    for name, params in signatures:
        function, empty = launchers[name]
        for f in (function, empty):
            f.restype = None
            f.argtypes = [ctypes.c_uint] * 6 + [ctypes.c_void_p if p.is_pointer else c_scalar[p.dtype.type]
                                                for p in params]
        empty_twins[id(function)] = empty

        def bind(name, grid, block, args, f=function):
            arrays = [a for a in args if isinstance(a, np.ndarray)]
            program.issue(name, f, *grid, *block, *[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args],
                          keep=arrays)

        kernels[name] = Kernel(name, params, bind)
    return kernels
