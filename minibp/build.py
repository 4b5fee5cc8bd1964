"""The g++ build cache of the CPU kernels: a kernel file's C++ launchers compiled once, kept on disk.

    build.cached_library(path, wrapper, "float", include_dir)   # the .so of wrapper: built once, then cached
    build.cpu_target()                      # ("avx2", ["-march=x86-64-v3"]): the instruction set built for
    build.usable_cpu_targets()              # ["avx2", "sse4", "x86-64"]: those this CPU runs, widest first

wrapper is C++ that includes the kernel file at path (kernels.py writes it); include_dir holds the
headers it includes. The build is compiled by g++ (or $CXX) with OpenMP for the CPU target (the
instruction set it is built for: the CPU's widest, or the one MINIBP_CPU_TARGET names), cached under
$XDG_CACHE_HOME/minibp/kernels keyed by the target and a SHA-256 of the wrapper, the flags, the compiler
and every source in include_dir. A build is published whole (os.replace) with its size and SHA-256 in a
`<name>.so.sha256` record beside it, written last; a cached build that does not match its record is
rebuilt, never loaded, and an unwritable cache falls back to a private temporary one. An interrupted
compile leaves no compiler running, and the build folders of processes that died are removed.
"""
import atexit
import contextlib
import functools
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

from . import constants
from .integrity import sha256_bytes, write_atomic


class KernelError(RuntimeError):
    """A kernel source that does not compile, or a compiler that is missing."""


# ----------------------------------------------------------------------------- CPU targets and flags

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
    """The g++ command line of a build for real_t = real_name (cached_library adds the include folder)."""
    compiler = os.environ.get("CXX", "g++")
    # -frandom-seed: byte-identical builds, so processes that build the same library at once publish
    # the same bytes and its record matches whichever copy lands last. vect-max-version-for-alias-checks:
    # the batch-norm backward's loop over a row of codes reads six arrays and accumulates into two, which
    # takes 11 run-time alias checks; past g++'s default 10 the loop stays scalar (a 1.6x slower backward).
    return [compiler, *CPU_ARITHMETIC, "-O3", *cpu_target()[1], "--param=vect-max-version-for-alias-checks=16",
            "-fopenmp", "-fPIC",
            "-fno-semantic-interposition", "-frandom-seed=minibp", "-shared", f"-Dreal_t={real_name}",
            *constants.defines()]


# ----------------------------------------------------------------------------- the cache

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
    return f"{len(data)} {sha256_bytes(data)}"


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


def cached_library(path, wrapper, real_name, include_dir):
    """The path of a verified build of wrapper, C++ that includes the kernel file at path, for real_t =
    real_name with include_dir's headers: the cached one, or a new one published to the cache."""
    command = cpu_compile_command(real_name) + [f"-I{include_dir}"]
    parts = [part.encode() for part in (wrapper, " ".join(command), _compiler_version(command[0]))]
    # the kernel file itself (it may live outside include_dir, as the tests' quant.cu does) and every header
    # it may include
    parts.append(Path(path).read_bytes())
    parts += [dependency.name.encode() + dependency.read_bytes() for dependency in sorted(Path(include_dir).glob("*"))
              if dependency.suffix in (".cu", ".cuh", ".h")]
    # The target in the name as well as in the digest (its flags are in the command): a cache shared by an
    # AVX-512 machine and an AVX2 one holds a build for each, and each loads its own.
    name = f"{path.stem}-{real_name}-{cpu_target()[0]}-{sha256_bytes(*parts)[:20]}.so"
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
        record = _fingerprint((build / "kernel.so").read_bytes()) + "\n"
        # Atomic: a concurrent process sees the old state or the whole file. The record lands last, so
        # a library without a matching record (a publish cut short) is rebuilt, never loaded.
        os.replace(build / "kernel.so", library)
        write_atomic(_record_path(library), record)
    return library
