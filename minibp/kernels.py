"""One loader for the hand-written kernels in kernels/*.cu, on both devices.

A kernel file holds `extern "C" __global__` functions written in plain CUDA C++. The loader
reads their signatures from the source, so every call is checked the same way on both devices
(pointer dtypes, C-contiguity, array module, writability, scalar ranges) before it launches:

    module = kernels.load("sgd.cu")                    # real_t = float
    module.sgd_momentum(n=n, n_decay=d, lr=0.1, momentum=0.9, weight_decay=2e-4,
                        params=p, grads=g, velocity=v, threads=n)   # a grid covering n threads, 256 a block
    module.sgd_momentum(..., grid=(3,), block=(7,))    # or an explicit launch shape

Arguments go by name, each checked against the parameter of that name in the source.

GPU: the source is compiled by NVRTC through cupy.RawModule, once per process.
CPU: the same source is wrapped in a generated C++ file (kernels/cpu_shim.h supplies the CUDA
names) that adds one exported launcher per kernel, compiled by g++ with OpenMP, cached on disk
under $XDG_CACHE_HOME/minibp/kernels keyed by the CPU target (the instruction set it is built for:
the CPU's widest, or MINIBP_CPU_TARGET's) and a hash of the sources, flags and compiler, and
called through ctypes. A build is published whole (os.replace) with its size and SHA-256 in a
`<name>.so.sha256` record beside it; a cached build that does not match its record is rebuilt,
never loaded, and an unwritable cache falls back to a private temporary one.

`real_t` is a macro every kernel file may use for its floating-point type; `load(..., dtype=)`
picks float (float32, the default) or double (float64, for gradient checks).
"""
import atexit
import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from . import backend

# The sources are the top-level kernels/ folder. A wheel ships a copy of it as minibp/kernels_src
# (setup.cfg maps the folder to that package); a checkout or an editable install reads kernels/ itself.
_PACKAGED_KERNELS = Path(__file__).resolve().parent / "kernels_src"
KERNEL_DIR = _PACKAGED_KERNELS if _PACKAGED_KERNELS.is_dir() else Path(__file__).resolve().parent.parent / "kernels"
BLOCK = 256  # threads a block in the default launch shape
launches = 0  # kernels launched by this process (the benchmarks count them a step)

# C type of a kernel parameter -> NumPy dtype. real_t resolves to the module's dtype.
_C_TYPES = {
    "float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
    "unsigned char": np.uint8, "real_t": None,
}
_SIGNATURE = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)', re.S)


class KernelError(RuntimeError):
    """A kernel source that does not compile, or a compiler that is missing."""


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

    def convert(self, kernel_name, value):
        """Check one argument and return what the launcher takes for it."""
        where = f"{kernel_name}() argument {self.name!r}"
        if self.is_pointer:
            if value is None:  # a null pointer: the kernels treat it as "not wanted"
                return None
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
            info = np.iinfo(self.dtype)
            if not info.min <= int(value) <= info.max:
                raise ValueError(f"{where}: {value} does not fit {self.dtype}")
        return self.dtype.type(value)


class Kernel:
    """A callable kernel: kernel(name=value, ..., threads=n) or kernel(name=value, ..., grid=(..), block=(..))."""

    def __init__(self, name, params, launch_fn):
        self.name, self.params, self._launch = name, params, launch_fn

    def __call__(self, *args, threads=None, grid=None, block=None, **arguments):
        names = [p.name for p in self.params]
        if args:
            raise TypeError(f"{self.name}(): pass the kernel's arguments by name ({', '.join(names)})")
        missing, unknown = [n for n in names if n not in arguments], [n for n in arguments if n not in names]
        if missing or unknown:
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
        global launches
        launches += 1
        self._launch(_dim3(grid), _dim3(block), converted)

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
    path = KERNEL_DIR / filename
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
    """The Module of kernels/<filename> for real_t = dtype, compiled on first use."""
    path = _source_path(filename)
    source = path.read_text()
    signatures = parse_signatures(source, dtype)
    if not signatures:
        raise KernelError(f"{path} declares no extern \"C\" __global__ kernel")
    build = _load_gpu if backend.device == "gpu" else _load_cpu
    return Module(path, build(path, source, signatures, _real_name(dtype)))


# ----------------------------------------------------------------------------- GPU: NVRTC

def gpu_compile_options(real_name):
    # --fmad=false: no fused multiply-add contraction, so float kernels round as g++ does on the CPU.
    return ("-std=c++17", "--fmad=false", f"-Dreal_t={real_name}", f"-I{KERNEL_DIR}")


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

        def launch(grid, block, args, f=function):
            # CuPy passes None as 0xffffffff, not NULL (cupy/cupy#9046): a 64-bit zero is a null pointer.
            f(grid, block, tuple(np.uint64(0) if a is None else a for a in args))

        kernels[name] = Kernel(name, params, launch)
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


# ----------------------------------------------------------------------------- CPU: g++ + shim

# The instruction sets a CPU build can target, widest first, by the machine's architecture: the
# /proc/cpuinfo flags each needs and the g++ flags that select it (named levels, never -march=native,
# whose meaning a cache key could not see). conv_direct.cu's vectors take their width from it.
_X86_64_V2 = {"sse4_2", "ssse3", "popcnt"}
_X86_64_V3 = _X86_64_V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave", "abm"}
CPU_TARGETS = {
    "x86_64": {
        "avx512": (_X86_64_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, ["-march=x86-64-v4"]),
        "avx2": (_X86_64_V3, ["-march=x86-64-v3"]),
        "sse4": (_X86_64_V2, ["-march=x86-64-v2"]),
        "x86-64": (set(), ["-march=x86-64"]),
    },
    "aarch64": {"neon": (set(), ["-march=armv8-a"])},  # NEON is part of the base architecture
}
TARGET_VARIABLE = "MINIBP_CPU_TARGET"  # names a narrower target than the CPU's widest, e.g. avx2


def _cpu_flags():
    try:
        return set(re.search(r"^flags\s*:(.*)$", Path("/proc/cpuinfo").read_text(), re.M).group(1).split())
    except (OSError, AttributeError):
        return set()


def _machine_targets():
    return CPU_TARGETS.get(platform.machine().lower().replace("amd64", "x86_64"), {"generic": (set(), [])})


def usable_cpu_targets():
    """The names of the targets this CPU runs, widest first."""
    flags = _cpu_flags()
    return [name for name, (needs, _) in _machine_targets().items() if needs <= flags]


@functools.lru_cache(maxsize=None)
def cpu_target():
    """(name, g++ flags) of the instruction set this process's CPU builds target: the widest the CPU has,
    or the one MINIBP_CPU_TARGET names (a KernelError if this CPU lacks it)."""
    targets, usable = _machine_targets(), usable_cpu_targets()
    requested = os.environ.get(TARGET_VARIABLE, "").strip()
    if not requested:
        return usable[0], targets[usable[0]][1]
    if requested not in targets:
        raise KernelError(f"{TARGET_VARIABLE}={requested} is not a CPU target of this {platform.machine()} "
                          f"machine: its targets are {', '.join(targets)}")
    if requested not in usable:
        missing = sorted(targets[requested][0] - _cpu_flags())
        raise KernelError(f"{TARGET_VARIABLE}={requested}, but this CPU lacks {', '.join(missing)}: "
                          f"it runs {', '.join(usable)}")
    return requested, targets[requested][1]


# How every CPU build does its arithmetic. -fno-math-errno keeps floor inline, -fno-trapping-math lets
# comparisons become selects (nothing here reads FP exception flags); -ffp-contract=off: no FMA
# contraction, as --fmad=false on the GPU, so every kernel rounds like its NumPy reference (conv_direct.cu
# alone fuses, by a pragma); no -ffast-math: kernels must see NaN and Inf.
CPU_ARITHMETIC = ("-std=c++20", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off")


def cpu_compile_command(real_name):
    compiler = os.environ.get("CXX", "g++")
    # -frandom-seed: byte-identical builds, so processes that build the same library at once publish
    # the same bytes and its record matches whichever copy lands last. vect-max-version-for-alias-checks:
    # the batch-norm backward's loop over a row of codes reads six arrays and accumulates into two, which
    # takes 11 run-time alias checks; past g++'s default 10 the loop stays scalar (a 1.6x slower backward).
    return [compiler, *CPU_ARITHMETIC, "-O3", *cpu_target()[1], "--param=vect-max-version-for-alias-checks=16",
            "-fopenmp", "-fPIC",
            "-fno-semantic-interposition", "-frandom-seed=minibp", "-shared", f"-Dreal_t={real_name}",
            f"-I{KERNEL_DIR}"]


def _cpu_wrapper_source(path, signatures):
    """C++ that includes the kernel file and exports minibp_launch_<name>(grid, block, args...)."""
    lines = [f'#include "{path}"', ""]
    for name, params in signatures:
        decl = ", ".join(["unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz"]
                         + [p.c_text for p in params])
        args = ", ".join(["dim3(gx, gy, gz)", "dim3(bx, by, bz)"] + [p.name for p in params])
        lines.append(f'extern "C" void minibp_launch_{name}({decl}) {{ minibp_shim::launch<&{name}>({args}); }}')
    return "\n".join(lines) + "\n"


def _cache_dir():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "minibp" / "kernels"


def _warn(message):
    print(f"minibp: warning: {message}", file=sys.stderr)


def _writable_cache(cache):
    """cache if this process can write there, else a private temporary cache."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=cache).close()  # mkdir succeeds on an existing read-only folder
        return cache
    except OSError as e:
        return _fallback_cache(cache, e.strerror or str(e))


@functools.lru_cache(maxsize=None)  # one fallback, and one warning, per unwritable cache a process
def _fallback_cache(cache, why):
    fallback = Path(tempfile.mkdtemp(prefix="minibp-kernels-"))
    atexit.register(shutil.rmtree, fallback, ignore_errors=True)  # the loaded libraries stay mapped
    _warn(f"cannot write the kernel cache {cache} ({why}); building the kernels in {fallback}")
    return fallback


def _record_path(library):
    return library.with_name(library.name + ".sha256")


def _fingerprint(data):
    return f"{len(data)} {hashlib.sha256(data).hexdigest()}"


def _damage(library):
    """Why a cached build must not be loaded, or None when its size and SHA-256 match its record."""
    try:
        recorded = _record_path(library).read_text().strip()
    except FileNotFoundError:
        return "it has no size/SHA-256 record"
    except OSError as e:
        return f"its record cannot be read: {e.strerror}"
    try:
        data = library.read_bytes()
    except OSError as e:
        return f"it cannot be read: {e.strerror}"
    return None if recorded == _fingerprint(data) else "its size or SHA-256 differs from its record"


def _remove_stale_builds(cache):
    """Remove the build-<pid>-* folders of processes that died while compiling (SIGKILL, power cut)."""
    for folder in cache.glob("build-*-*"):
        pid = folder.name.split("-")[1]
        if pid.isdigit() and pid != str(os.getpid()):
            try:
                os.kill(int(pid), 0)  # signal 0: only asks whether the process exists
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)
            except OSError:  # PermissionError: it exists, as another user
                pass


def _run_compiler(command, cwd):
    """(returncode, stderr) of the compiler, run in its own process group so that an exception here
    (KeyboardInterrupt) kills all of it, cc1plus and ld included, not only the g++ driver."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        _, stderr = process.communicate()
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return process.returncode, stderr


def _compiler_version(compiler):
    if shutil.which(compiler) is None:
        raise KernelError(f"the C++ compiler {compiler!r} was not found: minibp compiles its kernels for the CPU "
                          "with it. Install g++ (Debian/Ubuntu: apt-get install g++) or set CXX to a C++20 compiler.")
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout


def _compile_cpu_library(path, signatures, real_name):
    """The path of a verified build of the kernel file: the cached one, or a new one published to the cache."""
    command = cpu_compile_command(real_name)
    wrapper = _cpu_wrapper_source(path, signatures)
    digest = hashlib.sha256()
    for part in [wrapper, " ".join(command), _compiler_version(command[0])]:
        digest.update(part.encode())
    for dependency in sorted(KERNEL_DIR.glob("*")):  # the .cu itself and every header it may include
        if dependency.suffix in (".cu", ".cuh", ".h"):
            digest.update(dependency.name.encode() + dependency.read_bytes())
    # The target in the name as well as in the digest (its flags are in the command): a cache shared by an
    # AVX-512 machine and an AVX2 one holds a build for each, and each loads its own.
    name = f"{path.stem}-{real_name}-{cpu_target()[0]}-{digest.hexdigest()[:20]}.so"
    library = _cache_dir() / name
    if os.path.exists(library):
        damage = _damage(library)
        if damage is None:
            return library
        _warn(f"the cached kernel build {library} is damaged ({damage}); rebuilding it")
    cache = _writable_cache(_cache_dir())
    library = cache / name
    _remove_stale_builds(cache)
    # The pid in the name lets a later process remove the folder if this one dies mid-build.
    with tempfile.TemporaryDirectory(prefix=f"build-{os.getpid()}-", dir=cache) as tmp:
        build = Path(tmp)
        # Relative names in the build folder: its random path must not end up in the library's bytes.
        cpp = f"{path.stem}_launchers.cpp"
        (build / cpp).write_text(wrapper)
        # A first run compiles every kernel file (minutes on a loaded machine): say so, not a silent wait.
        print(f"minibp: compiling {path.name} ({real_name}) for this CPU ({cpu_target()[0]}), once: later runs "
              f"load it from {cache}", end="", file=sys.stderr, flush=True)
        start = time.perf_counter()
        returncode, stderr = _run_compiler(command + ["-o", "kernel.so", cpp], cwd=build)
        print(f" ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
        if returncode != 0:
            raise KernelError(f"g++ could not compile {path} (real_t={real_name}):\n{stderr}")
        (build / "record").write_text(_fingerprint((build / "kernel.so").read_bytes()) + "\n")
        # Atomic: a concurrent process sees the old state or the whole file. The record lands last, so
        # a library without a matching record (a publish cut short) is rebuilt, never loaded.
        os.replace(build / "kernel.so", library)
        os.replace(build / "record", _record_path(library))
    return library


def _load_cpu(path, source, signatures, real_name):
    # OpenMP threads that spin between kernels fight NumPy's BLAS threads (which spin between GEMMs)
    # for the same cores: measured 13x slower on 2 cores. Sleeping at once costs a few microseconds
    # a launch instead. libgomp reads this when the first kernel library loads it.
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    library = ctypes.CDLL(str(_compile_cpu_library(path, signatures, real_name)))
    c_scalar = {np.float32: ctypes.c_float, np.float64: ctypes.c_double, np.int32: ctypes.c_int32,
                np.int64: ctypes.c_int64, np.uint8: ctypes.c_uint8}
    kernels = {}
    for name, params in signatures:
        function = getattr(library, f"minibp_launch_{name}")
        function.restype = None
        function.argtypes = [ctypes.c_uint] * 6 + [
            ctypes.c_void_p if p.is_pointer else c_scalar[p.dtype.type] for p in params]

        def launch(grid, block, args, f=function):
            f(*grid, *block, *[a.ctypes.data if isinstance(a, np.ndarray) else a for a in args])

        kernels[name] = Kernel(name, params, launch)
    return kernels
