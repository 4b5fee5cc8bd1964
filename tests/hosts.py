"""What the tests of several ranks share (tests/test_dist.py, tests/test_hosts.py): mpirun and the environment its
ranks run in, the trainer under it, what its runs print and write, the pid of a rank; and simulated hosts.

Simulated hosts (Hosts) are machines made of namespaces on this one, so that MPICH runs across "machines" as it
would across real ones:

    with Hosts(tmp_path, 3) as hosts:           # host0, host1, host2 at 10.211.37.1, .2, .3
        hosts[1].path("/tmp/data")              # host1's /tmp/data, as seen from here
        process = hosts.mpiexec([2, 2, 0], argv, env=ENV)   # 2 ranks on host0 (mpiexec's host), 2 on host1
        hosts[1].link("down")                   # host1 cut off from the others

Each host is a process holding its own network namespace (its address on a veth cable to a bridge, in a namespace
of the bridge's own, so no packet reaches this machine's network), mount namespace (a folder of its own over /tmp,
a tmpfs over /dev/shm), host name and IPC namespace. mpiexec runs on host0, with a hostfile of addresses; it starts
the other hosts' MPI proxies through a launcher script (in ssh's place) that enters the host's namespaces. Closing
kills every process in the hosts' network namespaces, and with them the namespaces, cables and mounts.
"""
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

from minibp.run import checkpoint
from runs import ROOT

# One thread a rank, as 2 ranks on 2 cores should run; the one-process runs they are compared with too.
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1")
SUBNET = "10.211.37"  # the simulated hosts' addresses: SUBNET.1, .2, ...


def mpirun():
    """The mpirun of the MPI that mpi4py uses: pip's mpich puts it beside the interpreter's scripts."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        if (folder / "mpirun").is_file():
            return str(folder / "mpirun")
    found = shutil.which("mpirun")
    assert found, "mpich is installed with mpi4py (the test extra) and brings mpirun: none found"
    return found


def train(argv, *, ranks=1, env=ENV, timeout=120):
    """Run the trainer (under mpirun with ranks > 1); the CompletedProcess, stdout and stderr as text."""
    command = [sys.executable, "-m", "minibp.train"] + argv
    if ranks > 1:
        command = [mpirun(), "-n", str(ranks)] + command
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def errors(result):
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def same_state(a, b):
    a, b = (checkpoint.load(Path(run) / "checkpoint.h5") for run in (a, b))
    return a.iteration == b.iteration and a.state.keys() == b.state.keys() and all(
        np.array_equal(a.state[name], b.state[name]) for name in a.state)


def without_timing(records):
    return [{k: v for k, v in r.items() if k not in ("images_per_s", "time")} for r in records]


def tagged_pids(tag, rank=None):
    """The pids of the processes of the run started with MINIBP_TEST_TAG=tag, or of its rank `rank` alone
    (MPICH tells each its rank as PMI_RANK). A zombie has no environment left: it no longer counts."""
    wanted = {f"MINIBP_TEST_TAG={tag}".encode()} | ({f"PMI_RANK={rank}".encode()} if rank is not None else set())
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted <= set((entry / "environ").read_bytes().split(b"\0")):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return pids


def rank_pid(tag, rank):
    """The pid of the rank of the run started with MINIBP_TEST_TAG=tag."""
    pids = tagged_pids(tag, rank)
    if not pids:
        raise AssertionError(f"no rank {rank} with tag {tag}")
    return pids[0]


def wait_for_rank_to_exit(tag, rank, *, timeout=30):
    """Wait until rank `rank` of the run tagged `tag` is gone: mpiexec can return once it has sent its SIGKILLs,
    while rank 0, still exiting, holds the run folder's lock."""
    deadline = time.time() + timeout
    while tagged_pids(tag, rank):
        assert time.time() < deadline, f"rank {rank} of run {tag} still alive after {timeout} s"
        time.sleep(0.05)


# ----------------------------------------------------------------------------- simulated hosts

def unavailable():
    """Why simulated hosts cannot be made on this machine, in one line; None when they can."""
    if os.geteuid() != 0:
        return "simulated hosts need root (they are network and mount namespaces)"
    for tool, package in (("ip", "iproute2"), ("unshare", "util-linux"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return f"simulated hosts need {tool} (apt-get install {package})"
    probe = subprocess.run(["unshare", "--net", "--mount", "--uts", "--ipc", "true"], capture_output=True, text=True)
    if probe.returncode:
        return f"simulated hosts need namespaces, which this machine refuses: {probe.stderr.strip()}"
    return None


def kept_in_view():
    """The folders under /tmp that the hosts' private /tmp must not hide: the checkout (CI clones into /tmp) and
    the interpreter's prefixes (a venv made there, which holds mpirun and the packages), the outermost of each."""
    kept = []
    for path in sorted({Path(p).resolve() for p in (ROOT, sys.prefix, sys.exec_prefix, sys.base_prefix)}):
        if path.is_relative_to("/tmp") and path != Path("/tmp") and not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def _holder(command, *args):
    """A process that makes namespaces (command: a shell script run in them), says ready and then holds them."""
    process = subprocess.Popen(["unshare", "--net", "--mount", "--uts", "--ipc", "--propagation", "private", "--",
                                "sh", "-c", f"{command} && ip link set lo up && echo ready && exec sleep infinity",
                                "sh", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise RuntimeError(f"a namespace could not be set up: {process.communicate()[1].strip()}")
    return process


class Host:
    """One simulated machine: name, address, root (its /tmp, as seen from here), pid (the process holding it)."""

    def __init__(self, name, address, root, pid):
        self.name, self.address, self.root, self.pid = name, address, root, pid

    def path(self, inside):
        """Where a path under this host's /tmp is, seen from here."""
        return self.root / Path(inside).relative_to("/tmp")

    def run(self, *command):
        """A command run in every namespace of this host; it must succeed."""
        subprocess.run(["nsenter", "-t", str(self.pid), "-a", "--", *command], check=True, capture_output=True)

    def mount_tmpfs(self, inside, *, size):
        """A tmpfs of `size` (e.g. "64k") over a folder of this host's, which only this host sees."""
        self.path(inside).mkdir(parents=True, exist_ok=True)
        self.run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", inside)

    def link(self, state):
        """This host's cable "up" or "down"."""
        self.run("ip", "link", "set", "eth0", state)


class Hosts:
    """count simulated hosts on one bridge (see the module's docstring); a context manager that tears them down."""

    def __init__(self, base, count):
        self.base, self.hosts, self._holders = Path(base), [], []
        try:
            bridge = self._hold("ip link add br0 type bridge && ip link set br0 up")
            for i in range(count):
                root = self.base / f"host{i}"
                root.mkdir(parents=True)
                # What lies under /tmp and every host must see stays in view: bound into the host's own /tmp
                # before it goes over /tmp (--rbind carries those binds along), as a shared install would be.
                binds = []
                for keep in kept_in_view():
                    inner = root / keep.relative_to("/tmp")
                    inner.mkdir(parents=True)
                    binds += [str(keep), str(inner)]
                holder = self._hold('hostname "$1" && root="$2" && shift 2 && while [ $# -gt 1 ]; do '
                                    'mount --bind "$1" "$2" || exit 1; shift 2; done && '
                                    'mount --rbind "$root" /tmp && mount -t tmpfs tmpfs /dev/shm',
                                    f"host{i}", str(root), *binds)
                host = Host(f"host{i}", f"{SUBNET}.{i + 1}", root, holder.pid)
                # the cable: eth0 in the host, its other end a port of the bridge
                for command in (f"ip link add eth0 netns {host.pid} type veth peer name port{i}",
                                f"ip link set port{i} master br0 up"):
                    subprocess.run(["nsenter", "-t", str(bridge.pid), "-n", *command.split()], check=True,
                                   capture_output=True)
                host.run("ip", "addr", "add", f"{host.address}/24", "dev", "eth0")
                host.link("up")
                self.hosts.append(host)
            # ssh's stand-in: mpiexec calls it as `ssh -x HOST COMMAND...` and it runs COMMAND in HOST's namespaces
            table = "".join(f"    {h.address}) pid={h.pid} ;;\n" for h in self.hosts)
            launcher = self.hosts[0].path("/tmp/launch")
            launcher.write_text(f'#!/bin/sh\n[ "$1" = -x ] && shift\ncase "$1" in\n{table}'
                                f'    *) echo "launch: no simulated host $1" >&2; exit 255 ;;\nesac\nshift\n'
                                'exec nsenter -t "$pid" -a -- sh -c "$*"\n')
            launcher.chmod(0o755)
        except BaseException:
            self.close()
            raise

    def _hold(self, command, *args):
        process = _holder(command, *args)
        self._holders.append(process)
        return process

    def __getitem__(self, i):
        return self.hosts[i]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def mpiexec(self, ranks, argv, *, env):
        """The trainer under mpiexec on host0: ranks[i] ranks on host i (a Popen, output merged into stdout)."""
        hostfile = "".join(f"{host.address}:{n}\n" for host, n in zip(self.hosts, ranks) if n)
        self.hosts[0].path("/tmp/hostfile").write_text(hostfile)
        command = ["nsenter", "-t", str(self.hosts[0].pid), "-a", f"--wd={ROOT}", mpirun(), "-f", "/tmp/hostfile",
                   "-launcher", "ssh", "-launcher-exec", "/tmp/launch", "-n", str(sum(ranks)),
                   sys.executable, "-m", "minibp.train", *argv]
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def close(self):
        """Kill every process in the hosts' and the bridge's network namespaces: the namespaces go with them."""
        spaces = set()
        for holder in self._holders:
            try:
                spaces.add(os.stat(f"/proc/{holder.pid}/ns/net").st_ino)
            except OSError:  # already gone
                pass
        spaces.discard(os.stat("/proc/self/ns/net").st_ino)  # never this machine's own
        for _ in range(100):
            inside = []
            for entry in Path("/proc").iterdir():
                try:
                    if entry.name.isdigit() and os.stat(entry / "ns" / "net").st_ino in spaces:
                        inside.append(int(entry.name))
                except OSError:  # gone meanwhile
                    continue
            if not inside:
                break
            for pid in inside:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        for holder in self._holders:
            holder.kill()
            holder.communicate()
