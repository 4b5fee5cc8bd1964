"""The g++ build of the CPU kernels (build.py): compiler errors and a missing compiler named, builds cached under
$XDG_CACHE_HOME/minibp/kernels without -march=native, one a CPU target, a target this CPU cannot run refused, and
the cache surviving damage, an unwritable cache, interrupted and concurrent builds. The cache is code the user
runs: a library planted by another user, through a folder that is not the user's alone or through a symbolic
link, is never loaded, and every file and folder minibp makes is private whatever the umask.

The cache's tests load sgd.cu (the smallest kernel) in a fresh `python3 -c` process: ctypes never unloads
a library, and a damaged one can kill the process that loads it (SIGBUS), not only raise.
"""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from minibp import backend, build, kernels

REPO = Path(__file__).resolve().parent.parent

# Loads sgd.cu and runs it: p -= 0.5 * (0.9 * 0 + 2) from 1 leaves 0.
LOAD_AND_RUN = """
import numpy as np
from minibp import kernels
p, g, v = np.ones(5, np.float32), np.full(5, 2, np.float32), np.zeros(5, np.float32)
kernels.load("sgd.cu").sgd_momentum(n=5, n_decay=0, lr=np.array([0.5]), momentum=0.9, weight_decay=0.0, params=p,
                                    grads=g, velocity=v, threads=5)
assert np.array_equal(p, np.zeros(5, np.float32)), p
print("ran")
"""


def _env(cache_home, **extra):
    return {**os.environ, "XDG_CACHE_HOME": str(cache_home), "MINIBP_DEVICE": "cpu", **extra}


def load_in_subprocess(cache_home, **extra_env):
    """The finished `python3 -c LOAD_AND_RUN` (cwd: the checkout, so it imports this minibp)."""
    return subprocess.run([sys.executable, "-c", LOAD_AND_RUN], cwd=REPO, env=_env(cache_home, **extra_env),
                          capture_output=True, text=True, timeout=120)


def assert_ran(done, *, warning=None):
    assert done.returncode == 0 and "ran" in done.stdout, f"rc {done.returncode}\n{done.stdout}\n{done.stderr}"
    warnings = [line for line in done.stderr.splitlines() if "minibp: warning" in line]
    if warning is None:
        assert not warnings, done.stderr
    else:
        assert len(warnings) == 1 and warning in warnings[0], done.stderr


def cached_builds(cache_home):
    return sorted((cache_home / "minibp" / "kernels").glob("sgd-float-*.so"))


def assert_matches_record(library):
    data = library.read_bytes()
    record = library.with_name(library.name + ".sha256").read_text().split()
    assert record == [str(len(data)), hashlib.sha256(data).hexdigest()]


def _alive(pid):
    """Whether pid runs (a zombie, killed but not yet reaped by a busy init, does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _dead_pid():
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.skipif(backend.device != "cpu", reason="the g++ path")
def test_compiler_errors_name_the_file_and_show_the_log(tmp_path, monkeypatch):
    kdir = tmp_path / "kernels"
    kdir.mkdir()
    for header in ("cpu_shim.h", "common.cuh"):
        shutil.copy(kernels.KERNEL_DIR / header, kdir / header)
    (kdir / "broken.cu").write_text('#include "common.cuh"\nextern "C" __global__ void f(int n) { undefined_name; }\n')
    monkeypatch.setattr(kernels, "KERNEL_DIR", kdir)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(kernels.KernelError, match=r"(?s)broken\.cu.*undefined_name"):
        kernels.load.__wrapped__("broken.cu", np.float32)


@pytest.mark.skipif(backend.device != "cpu", reason="the g++ path")
def test_missing_compiler_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-minibp")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(kernels.KernelError, match="apt-get install g\\+\\+"):
        kernels.load.__wrapped__("sgd.cu", np.float32)


@pytest.mark.slow
@pytest.mark.skipif(backend.device != "cpu", reason="the g++ path")
def test_cpu_builds_are_cached_under_xdg_cache_home_without_march_native(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kernels.load.__wrapped__("sgd.cu", np.float32)
    built = list((tmp_path / "minibp" / "kernels").glob("sgd-float-*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    kernels.load.__wrapped__("sgd.cu", np.float32)  # a second process-level load reuses the file
    assert built[0].stat().st_mtime_ns == mtime
    assert "-march=native" not in build.cpu_compile_command("float")


@pytest.mark.slow
@pytest.mark.parametrize("damage", [
    "truncated",  # a copy cut short: loading it used to die of SIGBUS with no message
    "garbage",    # used to fail with OSError on every run, never rebuilt
    "no record",  # a publish cut short before the record: unverifiable, so rebuilt
])
def test_a_damaged_cached_build_is_rebuilt_with_a_warning(tmp_path, damage):
    assert_ran(load_in_subprocess(tmp_path))
    [library] = cached_builds(tmp_path)
    if damage == "truncated":
        library.write_bytes(library.read_bytes()[:len(library.read_bytes()) // 2])
    elif damage == "garbage":
        library.write_bytes(b"not a shared library\n" * 100)
    else:
        library.with_name(library.name + ".sha256").unlink()
    assert_ran(load_in_subprocess(tmp_path), warning=f"cached kernel build {library} is damaged")
    assert cached_builds(tmp_path) == [library]
    assert_matches_record(library)
    assert_ran(load_in_subprocess(tmp_path))  # the rebuilt library is trusted again: no warning


@pytest.mark.slow
def test_an_unwritable_cache_falls_back_to_a_temporary_one(tmp_path):
    (tmp_path / "file").write_text("a regular file: nothing can be created under it, even by root")
    cache_home = tmp_path / "file" / "cache"
    done = load_in_subprocess(cache_home)
    assert_ran(done, warning=f"cannot write the kernel cache {cache_home / 'minibp' / 'kernels'}")
    fallback = done.stderr.split("building the kernels in ")[1].split()[0]
    assert not Path(fallback).exists()  # the private cache is removed at exit


@pytest.mark.slow
def test_build_folders_of_dead_processes_are_removed(tmp_path):
    cache = tmp_path / "minibp" / "kernels"
    stale = cache / f"build-{_dead_pid()}-x1y2"
    live = cache / f"build-{os.getpid()}-x3y4"  # this pytest process: still running, maybe still building
    for folder in (stale, live):
        folder.mkdir(parents=True)
        (folder / "sgd_launchers.cpp").write_text("// left by a build")
    assert_ran(load_in_subprocess(tmp_path))
    assert not stale.exists() and live.exists()


@pytest.mark.slow
def test_an_interrupted_compile_leaves_no_compiler_and_no_build_folder(tmp_path):
    # A stand-in g++ that, like the real driver with cc1plus, runs a child and waits for it.
    compiler, pid_file = tmp_path / "slow-g++", tmp_path / "child.pid"
    compiler.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo slow-g++ 1; exit 0; }\n'
                        f'sleep 120 & echo $! > {pid_file}\nwait\n')
    compiler.chmod(0o755)
    process = subprocess.Popen([sys.executable, "-c", LOAD_AND_RUN], cwd=REPO, env=_env(tmp_path, CXX=str(compiler)),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            if process.poll() is not None:  # say why the loader ended before its compiler started
                raise AssertionError(f"the loader exited ({process.returncode}) first: {process.communicate()}")
            assert time.monotonic() < deadline, "the stand-in compiler never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        process.send_signal(signal.SIGINT)  # Ctrl-C, delivered to Python only
        _, stderr = process.communicate(timeout=30)
        assert process.returncode != 0 and "KeyboardInterrupt" in stderr, stderr
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "the compiler's child outlived the interrupted build"
        assert list((tmp_path / "minibp" / "kernels").glob("build-*")) == []
    finally:
        process.kill()
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow
def test_concurrent_builds_of_one_kernel_both_succeed_and_match_the_record(tmp_path):
    processes = [subprocess.Popen([sys.executable, "-c", LOAD_AND_RUN], cwd=REPO, env=_env(tmp_path),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        assert_ran(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    [library] = cached_builds(tmp_path)
    assert_matches_record(library)
    assert list(library.parent.glob("build-*")) == []


@pytest.mark.slow
def test_a_cache_shared_by_two_cpu_targets_holds_a_build_for_each(tmp_path):
    """A home folder shared by an AVX-512 machine and an AVX2 one: the target is in the build's name (and
    key), so each CPU loads its own build and neither runs instructions the other lacks. The narrower
    target stands in for the other machine (MINIBP_CPU_TARGET)."""
    targets = build.usable_cpu_targets()
    if len(targets) < 2:
        pytest.skip(f"this CPU runs one target only ({targets[0]})")
    for target in targets[:2]:
        assert_ran(load_in_subprocess(tmp_path, MINIBP_CPU_TARGET=target))
    builds = cached_builds(tmp_path)
    assert [b.name.split("-")[2] for b in builds] == sorted(targets[:2]), builds
    for target in targets[:2]:  # again: each finds its own build, and nothing new is compiled
        assert_ran(load_in_subprocess(tmp_path, MINIBP_CPU_TARGET=target))
    assert cached_builds(tmp_path) == builds


@pytest.mark.parametrize("target, message", [
    ("avx9000", r"MINIBP_CPU_TARGET=avx9000 is not a CPU target of this \w+ machine: its targets are "),
    ("avx512", r"MINIBP_CPU_TARGET=avx512, but this CPU lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl: "
               r"it runs avx2, sse4, x86-64"),
])
def test_a_cpu_target_this_cpu_cannot_run_is_refused_in_one_line(monkeypatch, target, message):
    """Never SIGILL: a target the CPU lacks is refused before anything is built (here on a CPU made to
    look like an AVX2-only one)."""
    if build.platform.machine().lower() != "x86_64":
        pytest.skip("the flags below are x86-64's")
    monkeypatch.setattr(build, "_cpu_flags", lambda: set(build.CPU_TARGETS["x86_64"]["avx2"][0]))
    monkeypatch.setenv("MINIBP_CPU_TARGET", target)
    build.cpu_target.cache_clear()
    try:
        with pytest.raises(build.KernelError, match=message):
            build.cpu_target()
        monkeypatch.delenv("MINIBP_CPU_TARGET")
        assert build.cpu_target()[0] == "avx2"  # unset: the widest this CPU has
    finally:
        build.cpu_target.cache_clear()


@pytest.mark.slow
def test_a_build_says_what_it_compiles_and_how_long_it_took(tmp_path):
    """A first run compiles for minutes on a loaded machine: one line each build, none when cached."""
    first = load_in_subprocess(tmp_path)
    assert_ran(first)
    lines = [line for line in first.stderr.splitlines() if line.startswith("minibp: compiling sgd.cu (float)")]
    assert len(lines) == 1 and re.search(r"once: later runs load it from .+ \(\d+\.\d s\)$", lines[0]), first.stderr
    again = load_in_subprocess(tmp_path)
    assert_ran(again)
    assert "compiling" not in again.stderr, again.stderr


# ----------------------------------------------------------------------------- a cache other users could write

# A library whose constructor leaves a marker: loading it at all is what must never happen.
PLANTED = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("the planted library ran\\n", f); fclose(f); }
}
"""
OTHER_UID = 12345  # a user who is not the one running the tests


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A cache home whose kernel cache holds sgd.cu's build (copied by each test, so it is compiled once)."""
    home = tmp_path_factory.mktemp("built")
    assert_ran(load_in_subprocess(home))
    return home


@pytest.fixture
def planted(tmp_path):
    """(the planted library's bytes, the marker its constructor writes)."""
    source, marker = tmp_path / "planted.c", tmp_path / "planted-ran"
    source.write_text(PLANTED % marker)
    subprocess.run([os.environ.get("CXX", "g++"), "-x", "c++", "-shared", "-fPIC", "-o", tmp_path / "planted.so",
                    source], check=True)
    return (tmp_path / "planted.so").read_bytes(), marker


def copy_of(built, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(built, home, symlinks=True)
    [library] = cached_builds(home)
    return home, library


def plant(library, data):
    """Put data where the cached build is, with the size/SHA-256 record that matches it."""
    if library.exists() or library.is_symlink():
        library.unlink()
    library.write_bytes(data)
    library.with_name(library.name + ".sha256").write_text(f"{len(data)} {hashlib.sha256(data).hexdigest()}\n")


def fallback_of(done):
    return Path(done.stderr.split("private temporary folder ")[1].split()[0])


def needs_root_for(how):
    if "uid" in how and os.geteuid() != 0:
        pytest.skip("giving a file to another user takes root")


@pytest.mark.slow
@pytest.mark.parametrize("level, how", [
    ("minibp", "uid"), ("minibp/kernels", "uid"),  # root trains in a cache another user made first
    ("minibp", "mode 0770"), ("minibp/kernels", "mode 0777"),  # a folder others could write in
])
def test_a_cache_folder_that_is_not_the_users_alone_is_never_loaded_from(built, tmp_path, planted, level, how):
    needs_root_for(how)
    home, library = copy_of(built, tmp_path)
    plant(library, planted[0])
    folder = home / level
    if how == "uid":
        for path in (folder, *folder.rglob("*")):
            os.chown(path, OTHER_UID, OTHER_UID)
        why, fix = f"is owned by uid {OTHER_UID}, not by you (uid {os.geteuid()})", "set XDG_CACHE_HOME to a folder"
    else:
        folder.chmod(int(how.split()[1], 8))
        why, fix = f"is writable by other users ({how})", f"chmod 700 {folder}"
    done = load_in_subprocess(home)
    assert_ran(done, warning=f"the kernel cache {folder} {why}, so minibp loads no code from it: building the kernels "
                             "in a private temporary folder ")
    assert f"(fix: {fix}" in done.stderr and not planted[1].exists()
    assert library.read_bytes() == planted[0]  # nothing written into it either
    assert not fallback_of(done).exists()  # the private folder is removed at exit


@pytest.mark.slow
@pytest.mark.parametrize("level", ["minibp", "minibp/kernels"])
def test_a_cache_folder_that_is_a_symbolic_link_is_not_followed(built, tmp_path, planted, level):
    """The link leads to a private folder of the user's own: still refused, as minibp's folders are its own to
    make, and a link is how another user would lead it elsewhere."""
    home, library = copy_of(built, tmp_path)
    plant(library, planted[0])
    folder = home / level
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)
    done = load_in_subprocess(home)
    assert_ran(done, warning=f"the kernel cache {folder} is a symbolic link, so minibp loads no code from it")
    assert f"(fix: remove it (rm {folder}))" in done.stderr and not planted[1].exists()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["symbolic link", "uid", "mode 0777"])
def test_a_planted_library_in_a_private_cache_is_rebuilt_never_loaded(built, tmp_path, planted, how):
    """A cache of the user's own whose library is a link to, or a file of, someone else (with a matching
    record): the record catches damage, the owner and mode catch the swap."""
    needs_root_for(how)
    home, library = copy_of(built, tmp_path)
    target = tmp_path / "planted-target.so"
    if how == "symbolic link":
        plant(target, planted[0])
        library.unlink()
        library.symlink_to(target)
        plant(library.with_name("unused"), planted[0])  # the record beside it matches the target
        library.with_name("unused.sha256").replace(library.with_name(library.name + ".sha256"))
        why = "is a symbolic link"
    else:
        plant(library, planted[0])
        if how == "uid":
            os.chown(library, OTHER_UID, OTHER_UID)
            why = f"is owned by uid {OTHER_UID}, not by you (uid {os.geteuid()})"
        else:
            library.chmod(0o777)
            why = "is writable by other users (mode 0777)"
    done = load_in_subprocess(home)
    assert_ran(done, warning=f"the cached kernel build {library} {why}; rebuilding it")
    assert not planted[1].exists()
    assert not library.is_symlink() and library.stat().st_uid == os.geteuid()
    assert_matches_record(library)
    if how == "symbolic link":
        assert target.read_bytes() == planted[0]  # the link was replaced, not written through
    assert_ran(load_in_subprocess(home))  # the rebuilt library is trusted


@pytest.mark.slow
def test_the_cache_is_private_whatever_the_umask(tmp_path):
    """Under umask 000 the linker makes its library 0777 and os.makedirs its folders 0777: minibp sets each
    mode itself, including the folders of XDG_CACHE_HOME it makes."""
    home = tmp_path / "made" / "home"
    done = subprocess.run([sys.executable, "-c", LOAD_AND_RUN], cwd=REPO, env=_env(home), capture_output=True,
                          text=True, timeout=120, umask=0)
    assert_ran(done)
    [library] = cached_builds(home)
    modes = {path.relative_to(tmp_path).as_posix(): oct(path.stat().st_mode & 0o777)
             for path in (home.parent, home, home / "minibp", library.parent, library,
                          library.with_name(library.name + ".sha256"))}
    assert modes == {"made": "0o700", "made/home": "0o700", "made/home/minibp": "0o700",
                     "made/home/minibp/kernels": "0o700", f"made/home/minibp/kernels/{library.name}": "0o700",
                     f"made/home/minibp/kernels/{library.name}.sha256": "0o600"}


@pytest.mark.slow
@pytest.mark.skipif(backend.device != "cpu", reason="the g++ path")
@pytest.mark.parametrize("what", ["an empty library", "not a library"])
def test_a_foreign_library_of_the_users_own_in_the_cache_is_named_in_one_line(built, tmp_path, what):
    # An empty shared library of the right name (and a record that matches it: the user's own cache, which minibp
    # trusts) ended the run in an AttributeError traceback
    home, library = copy_of(built, tmp_path)
    if what == "an empty library":
        (tmp_path / "empty.cc").write_text("")
        subprocess.run([os.environ.get("CXX", "g++"), "-shared", "-fPIC", "-o", tmp_path / "empty.so",
                        tmp_path / "empty.cc"], check=True)
        plant(library, (tmp_path / "empty.so").read_bytes())
        why = r"it has no minibp_launch_\w+"
    else:
        plant(library, b"not a library, and more than the 64 bytes of an ELF header: " + bytes(64))
        why = "invalid ELF header"  # (dlerror's words)
    code = ("from minibp import kernels\n"
            "try:\n    kernels.load('sgd.cu')\nexcept kernels.KernelError as e:\n    print(f'error: {e}')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(home), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert re.fullmatch(re.escape(f"error: {library} is not minibp's build of sgd.cu (") + why
                        + re.escape("): delete it, and minibp builds it again\n"), done.stdout), done.stdout
    library.unlink()
    assert_ran(load_in_subprocess(home))  # (as it says: rebuilt)
