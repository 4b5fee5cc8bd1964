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
rebuilt, never loaded. An interrupted compile leaves no compiler running, and the build folders of
processes that died are removed.

The cache is code the user runs, and the record beside a library proves no more than that it is whole:
whoever can write the cache can write both. So minibp loads from it only what the user alone could have put
there. The folders it makes (minibp/ and minibp/kernels/) are 0700 and its files 0600 (libraries 0700),
whatever the umask; a folder of those that is a symbolic link, another user's (root included: a cache that
another user made first under a shared XDG_CACHE_HOME) or writable by group or others is never read, and the
kernels are built in a private temporary folder instead, with a one-line warning that names the folder and
its fix (training goes on, at the cost of a compile each run). A cached library that is a link, another
user's or writable by others is rebuilt, like a damaged one. An unwritable cache falls back the same way.
"""
import atexit
import contextlib
import errno
import functools
import os
import platform
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import constants
from .integrity import descriptor_path, sha256_bytes


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

# The cache holds code this process runs, so minibp loads from it only what the user alone could have put
# there. Its own folders (.../minibp, .../minibp/kernels) are opened one by one without following a link, and
# each must be the user's and writable by no one else; every name below is reached through the open folder
# (/proc/self/fd/N), and dlopen through the open library, so a name swapped after its check is never the
# one loaded. XDG_CACHE_HOME (or ~/.cache) itself is the user's choice, and may be a link.

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a planted FIFO cannot hang us
_PINNED = {}  # (st_dev, st_ino) -> the descriptor kept open for each library handed out, one per file


class _Untrusted(Exception):
    """A cache folder no code is loaded from: args = (what is wrong with it, how to fix it)."""


def cache_dir():
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "minibp" / "kernels"


def _warn(message):
    print(f"minibp: warning: {message}", file=sys.stderr)


def _not_private(st):
    """Why the file or folder of stat st is not the user's alone; None when it is."""
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _make_folders(path):
    """mkdir -p path, each folder it makes 0700 whatever the umask (os.makedirs: 0777 under umask 000)."""
    for folder in [*reversed(path.parents), path]:
        if not os.path.lexists(folder):
            with contextlib.suppress(FileExistsError):  # made meanwhile by another process: checked when opened
                os.mkdir(folder, 0o700)
                os.chmod(folder, 0o700)


def _open_private_folder(parent_fd, name, shown):
    """The descriptor of the folder name in parent_fd (made 0700 if missing); _Untrusted unless it is the
    user's alone. shown: its path, for messages."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
        made = True
    except FileExistsError:
        made = False
    try:
        fd = os.open(name, _FOLDER, dir_fd=parent_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):  # (O_DIRECTORY makes a link ENOTDIR)
            raise
        what = "a symbolic link" if stat.S_ISLNK(os.lstat(name, dir_fd=parent_fd).st_mode) else "not a folder"
        raise _Untrusted(f"{shown} is {what}", f"remove it (rm {shown})") from None
    st = os.fstat(fd)
    if made and st.st_uid == os.geteuid():
        os.fchmod(fd, 0o700)
        st = os.fstat(fd)
    why = _not_private(st)
    if why is not None:
        os.close(fd)
        fix = (f"chmod 700 {shown}" if st.st_uid == os.geteuid()
               else f"set XDG_CACHE_HOME to a folder of your own, or remove {shown}")
        raise _Untrusted(f"{shown} {why}", fix)
    return fd


def _open_cache(cache):
    """The descriptor of the cache folder, made where missing; _Untrusted when one of minibp's own folders
    is not the user's alone, OSError when they cannot be made."""
    home = cache.parent.parent
    _make_folders(home)
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for level in (cache.parent, cache):
            child = _open_private_folder(fd, level.name, level)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@functools.lru_cache(maxsize=None)  # one private folder, and one warning, per cause a process
def _fallback_cache(before, after=""):
    """A private temporary folder to build in, said in the warning `before` + its path + `after`."""
    fallback = Path(tempfile.mkdtemp(prefix="minibp-kernels-"))  # 0700, whatever the umask
    atexit.register(shutil.rmtree, fallback, ignore_errors=True)  # the loaded libraries stay mapped
    _warn(f"{before}{fallback}{after}")
    return fallback


def _fall_back(cache, error):
    """(path, descriptor) of a private temporary folder to build in, for the cache that error rules out."""
    if isinstance(error, _Untrusted):
        fallback = _fallback_cache(f"the kernel cache {error.args[0]}, so minibp loads no code from it: building "
                                   "the kernels in a private temporary folder ", f" instead (fix: {error.args[1]})")
    else:
        fallback = _fallback_cache(f"cannot write the kernel cache {cache} ({error.strerror or error}); building the "
                                   "kernels in ")
    return fallback, os.open(fallback, _FOLDER)


def _usable_cache(cache):
    """(path, descriptor) of the cache; of a private temporary folder when the cache cannot be made or is not
    the user's alone."""
    try:
        return cache, _open_cache(cache)
    except (_Untrusted, OSError) as e:
        return _fall_back(cache, e)


def _writable_cache(cache, fd):
    """(path, descriptor) of the folder to build in: the cache open as fd if this process can write there,
    else a private temporary folder (fd is then closed). The caller closes the descriptor returned."""
    try:
        tempfile.TemporaryFile(dir=descriptor_path(fd, cache)).close()  # mkdir succeeds on a read-only folder
        return cache, fd
    except OSError as e:
        os.close(fd)
        return _fall_back(cache, e)


def _record_name(name):
    return name + ".sha256"


def _fingerprint(data):
    return f"{len(data)} {sha256_bytes(data)}"


def _read(fd):
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _open_regular(folder_fd, name):
    """The descriptor of the regular file name in folder_fd, never through a link; OSError, or ValueError
    saying what else is there."""
    try:
        fd = os.open(name, _FILE, dir_fd=folder_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("is a symbolic link") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("is not a regular file")
    return fd


def _distrust(fd, folder_fd, name):
    """Why the open cached build fd (name in folder_fd) must not be loaded; None when it is the user's alone
    and its size and SHA-256 match its record."""
    why = _not_private(os.fstat(fd))
    if why is not None:
        return why
    try:
        record_fd = _open_regular(folder_fd, _record_name(name))
    except FileNotFoundError:
        return "is damaged (it has no size/SHA-256 record)"
    except (OSError, ValueError) as e:
        return f"is damaged (its record {e.strerror if isinstance(e, OSError) else e})"
    try:
        recorded = _read(record_fd).decode(errors="replace").strip()
    finally:
        os.close(record_fd)
    return None if recorded == _fingerprint(_read(fd)) else "is damaged (its size or SHA-256 differs from its record)"


def _cached(folder_fd, name):
    """(descriptor, None) of the cached build name when it may be loaded; (None, why not) when it must be
    rebuilt; (None, None) when there is none."""
    try:
        fd = _open_regular(folder_fd, name)
    except FileNotFoundError:
        return None, None
    except ValueError as e:
        return None, str(e)
    except OSError as e:
        return None, f"cannot be read ({e.strerror})"
    try:
        why = _distrust(fd, folder_fd, name)
    except BaseException:
        os.close(fd)
        raise
    if why is not None:
        os.close(fd)
        return None, why
    return fd, None


def _pinned(fd, path):
    """The path dlopen is to open the checked library fd by: the descriptor itself (kept open), so that the
    file loaded is the one checked; path where there is no /proc."""
    st = os.fstat(fd)
    kept = _PINNED.setdefault((st.st_dev, st.st_ino), fd)
    if kept != fd:
        os.close(fd)
    return Path(descriptor_path(kept, path))


def _write_private(path, data):
    """A new file of bytes, 0600 whatever the umask, on disk when this returns."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600), "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


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


def _build(command, wrapper, path, real_name, folder, name):
    """Compile wrapper into folder/name (folder: a path through its open descriptor) and publish it with its
    record; the descriptor of the library built."""
    _remove_stale_builds(folder)
    # The pid in the name lets a later process remove the folder if this one dies mid-build.
    with tempfile.TemporaryDirectory(prefix=f"build-{os.getpid()}-", dir=folder) as tmp:
        build = Path(tmp)
        # Relative names in the build folder: its random path must not end up in the library's bytes.
        cpp = f"{path.stem}_launchers.cpp"
        _write_private(build / cpp, wrapper.encode())
        returncode, stderr = _run_compiler(command + ["-o", "kernel.so", cpp], cwd=build)
        if returncode != 0:
            raise KernelError(f"g++ could not compile {path} (real_t={real_name}):\n{stderr}")
        fd = os.open(build / "kernel.so", _FILE)
        try:
            os.fchmod(fd, 0o700)  # the linker gives it 0777 less the umask: 0777 under umask 000
            os.fsync(fd)
            _write_private(build / "record", (_fingerprint(_read(fd)) + "\n").encode())
            # Atomic: a concurrent process sees the old state or the whole file. The record lands last, so
            # a library without a matching record (a publish cut short) is rebuilt, never loaded.
            os.replace(build / "kernel.so", folder / name)
            os.replace(build / "record", folder / _record_name(name))
        except BaseException:
            os.close(fd)
            raise
    return fd


def _library_name(path, wrapper, real_name, include_dir):
    """(g++ command, file name) of the build: the name carries the key of everything that makes its bytes."""
    command = cpu_compile_command(real_name) + [f"-I{include_dir}"]
    parts = [part.encode() for part in (wrapper, " ".join(command), _compiler_version(command[0]))]
    # the kernel file itself (it may live outside include_dir, as the tests' quant.cu does) and every header
    # it may include
    parts.append(Path(path).read_bytes())
    parts += [dependency.name.encode() + dependency.read_bytes() for dependency in sorted(Path(include_dir).glob("*"))
              if dependency.suffix in (".cu", ".cuh", ".h")]
    # The target in the name as well as in the digest (its flags are in the command): a cache shared by an
    # AVX-512 machine and an AVX2 one holds a build for each, and each loads its own.
    return command, f"{path.stem}-{real_name}-{cpu_target()[0]}-{sha256_bytes(*parts)[:20]}.so"


_COMPILING = {"seconds": 0.0}  # this process's time in g++ (compiling_seconds)


def compiling_seconds():
    """Seconds this process has spent compiling kernel files: a trainer's ETA leaves a first build out of its pace."""
    return _COMPILING["seconds"]


def cached_library(path, wrapper, real_name, include_dir):
    """The path of a verified build of wrapper, C++ that includes the kernel file at path, for real_t =
    real_name with include_dir's headers: the cached one, or a new one published to the cache. The path
    reaches the very file checked (/proc/self/fd/N, held open), for ctypes.CDLL to load."""
    command, name = _library_name(path, wrapper, real_name, include_dir)
    cache, fd = _usable_cache(cache_dir())
    try:
        library, why = _cached(fd, name)
        if library is not None:
            return _pinned(library, cache / name)
        if why is not None:
            _warn(f"the cached kernel build {cache / name} {why}; rebuilding it")
        cache, build_fd = _writable_cache(cache, os.dup(fd))
    finally:
        os.close(fd)
    try:
        # A first run compiles every kernel file (minutes on a loaded machine): say so, not a silent wait.
        kept = (f"once: later runs load it from {cache}" if cache == cache_dir()
                else f"for this process only, in {cache}")
        print(f"minibp: compiling {path.name} ({real_name}) for this CPU ({cpu_target()[0]}), {kept}", end="",
              file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            library = _build(command, wrapper, path, real_name, Path(descriptor_path(build_fd, cache)), name)
        finally:
            seconds = time.perf_counter() - start
            _COMPILING["seconds"] += seconds
            print(f" ({seconds:.1f} s)", file=sys.stderr, flush=True)
        return _pinned(library, cache / name)
    finally:
        os.close(build_fd)
