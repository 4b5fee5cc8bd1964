"""Data-parallel training over several processes: MPI (mpi4py) starts them, names their ranks and sums
host arrays; on GPUs NCCL sums the gradients, its unique id sent over MPI.

    mpirun -n 2 python3 -m minibp.train --batch 128 ...     # each rank computes 64 of the 128 images

    group = start(timeout=60)      # None in a process that no MPI launcher started (mpi4py not imported)
    group.agree(options)           # rank 0's options and device on every rank, or a ValueError naming a difference
    result = group.on_rank_0(fn)   # fn() on rank 0 alone (the run folder is its); the result or error everywhere
    group.sum(grads)               # in place, over the ranks: NCCL for a device array, MPI for a host one
    group.gather(mine, out)        # out (size,) + mine.shape holds every rank's, in rank order
    group.any(flag)                # True on every rank when any rank's flag is

A process counts as one of several ranks when the launcher says so in its environment
(OMPI_COMM_WORLD_SIZE for Open MPI, PMI_SIZE for MPICH, Intel MPI and Slurm's PMI): only then is
mpi4py imported, so one process needs no MPI at all, and `mpirun -n 1` is one process.

No wait is unbounded. A rank that dies is normally seen by the launcher, which kills the others at once
(MPICH's mpirun does, printing "BAD TERMINATION"). Where it does not (a rank that hangs or is stopped,
one that returns early, a launcher run with cleanup disabled), every MPI collective here is
non-blocking and polled against a deadline, and a GPU stream is polled the same way before the host
reads it: after `timeout` seconds without the other ranks the rank raises RankTimeout, and the
trainer prints it and calls MPI_Abort, which ends the whole job.
"""
import os
import pickle
import sys
import time

import numpy as np

from . import backend

SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")  # set by Open MPI's, and by MPICH's (hydra) launchers
POLL_S = 2e-4  # between tests of a pending collective: short against a step, and leaves the core to the others


class RankTimeout(TimeoutError):
    """The other ranks did not answer within the timeout: one of them stopped, died or hangs."""


def launched_size():
    """(ranks, the variable that says so) from the launcher's environment; (1, None) outside a launcher."""
    for name in SIZE_VARIABLES:
        if os.environ.get(name, "").strip().isdigit():
            return int(os.environ[name]), name
    return 1, None


def start(*, timeout=60.0):
    """The Group of this process's ranks, or None when it runs alone (no launcher, or one rank). On GPUs each
    rank takes its own (its index on its node, modulo the GPUs it sees), before anything is allocated."""
    size, variable = launched_size()
    if size == 1:
        return None
    if not timeout > 0:
        raise ValueError(f"--rank-timeout must be a positive number of seconds, got {timeout}")
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ValueError(f"this process is one of {size} ranks ({variable}={size}) but mpi4py does not import "
                         f"({e}): pip install 'minibp[dist]'") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size:
        raise ValueError(f"the launcher started {size} ranks ({variable}={size}) but mpi4py's MPI sees "
                         f"{comm.Get_size()}: use the mpirun of the MPI that mpi4py uses "
                         f"({os.path.join(os.path.dirname(sys.executable), 'mpirun')} for pip's mpich)")
    if backend.device == "gpu":
        cupy = backend.xp
        local_rank = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
    return Group(comm, MPI, timeout=timeout)


class Group:
    """The ranks training together: rank, size, and the collectives training needs, each bounded."""

    def __init__(self, comm, mpi, *, timeout):
        self.comm, self.MPI, self.timeout = comm, mpi, float(timeout)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._nccl = None  # (cupy.cuda.nccl, its communicator over the ranks) once a device array is summed

    # ------------------------------------------------------------------ host collectives (MPI)

    def _wait(self, request, what):
        """Poll an MPI request until it completes; RankTimeout after self.timeout seconds."""
        deadline = time.monotonic() + self.timeout
        try:
            while not request.Test():
                if time.monotonic() > deadline:
                    raise RankTimeout(self._lost(what))
                time.sleep(POLL_S)
        except self.MPI.Exception as e:  # an MPI library that reports a failed peer instead of waiting
            raise RankTimeout(f"rank {self.rank}: the {what} failed ({e.Get_error_string()}): another rank "
                              "stopped") from None

    def _lost(self, what):
        return (f"rank {self.rank} of {self.size} waited {self.timeout:g} s for the others at a {what}: one of them "
                "died, stopped or hangs (its own error, if any, is above); --rank-timeout sets the wait")

    def broadcast(self, obj):
        """Rank 0's obj (any picklable object) on every rank."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8).copy() if self.rank == 0 else None
        length = np.array([0 if data is None else data.size], np.int64)
        self._wait(self.comm.Ibcast(length), "broadcast")
        if data is None:
            data = np.empty(int(length[0]), np.uint8)
        self._wait(self.comm.Ibcast(data), "broadcast")
        return obj if self.rank == 0 else pickle.loads(data.tobytes())

    def gather_objects(self, obj):
        """[every rank's obj] in rank order, on every rank."""
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        lengths = np.empty(self.size, np.int64)
        self._wait(self.comm.Iallgather(np.array([data.size], np.int64), lengths), "gather")
        padded, out = np.zeros(int(lengths.max()), np.uint8), np.empty((self.size, int(lengths.max())), np.uint8)
        padded[:data.size] = data
        self._wait(self.comm.Iallgather(padded, out), "gather")
        return [pickle.loads(row[:n].tobytes()) for row, n in zip(out, lengths)]

    def any(self, flag):
        """True on every rank when flag is true on any."""
        value = np.array([int(bool(flag))], np.int32)
        self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, value, op=self.MPI.MAX), "stop check")
        return bool(value[0])

    def barrier(self, *, timeout=None):
        """Wait for every rank (for at most timeout seconds, default the group's)."""
        saved, self.timeout = self.timeout, self.timeout if timeout is None else timeout
        try:
            self._wait(self.comm.Ibarrier(), "barrier")
        finally:
            self.timeout = saved

    def agree(self, options):
        """Check that every rank was started with rank 0's options (a dict) on the same kind of device;
        otherwise a ValueError on every rank naming the first rank that differs and how."""
        everyone = self.gather_objects(dict(options, device=backend.device))
        for rank, theirs in enumerate(everyone[1:], 1):
            differ = [f"--{k.replace('_', '-')} {theirs.get(k)} (rank 0 has {everyone[0].get(k)})"
                      for k in sorted(set(theirs) | set(everyone[0])) if theirs.get(k) != everyone[0].get(k)]
            if differ:
                error = ValueError(f"rank {rank} was started with other options than rank 0: {'; '.join(differ)}")
                error.on_every_rank = True
                raise error

    def on_rank_0(self, fn, *, share_result=True):
        """fn() on rank 0 alone. An exception it raises is raised on every rank (rank 0 reports it: see
        report); its result comes back on every rank (share_result=False: on rank 0, None elsewhere)."""
        result = error = None
        if self.rank == 0:
            try:
                result = fn()
            except Exception as e:  # sent to the other ranks, then raised again here
                error = e
        error = self.broadcast(error)
        if error is not None:
            error.on_every_rank = True
            raise error
        return self.broadcast(result) if share_result else result

    def share_of(self, n):
        """This rank's rows of n (divisible by size): a slice."""
        return slice(self.rank * n // self.size, (self.rank + 1) * n // self.size)

    # ------------------------------------------------------------------ arrays: gradients and statistics

    def sum(self, array):
        """array = its sum over the ranks, in place: NCCL on the current stream for a device array
        (queued, not waited for: see wait), MPI for a NumPy array."""
        if isinstance(array, np.ndarray):
            self._wait(self.comm.Iallreduce(self.MPI.IN_PLACE, array, op=self.MPI.SUM), "sum")
        else:
            nccl, comm = self._communicator()
            comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._nccl_type(array), nccl.NCCL_SUM,
                           backend.xp.cuda.get_current_stream().ptr)

    def gather(self, mine, out):
        """out (size,) + mine.shape = every rank's mine, in rank order (device arrays: NCCL, queued)."""
        if out.shape != (self.size,) + mine.shape or out.dtype != mine.dtype:
            raise ValueError(f"gather: out must be {(self.size,) + mine.shape} {mine.dtype}, "
                             f"got {out.shape} {out.dtype}")
        if isinstance(mine, np.ndarray):
            self._wait(self.comm.Iallgather(mine, out), "gather")
        else:
            _, comm = self._communicator()
            comm.allGather(mine.data.ptr, out.data.ptr, mine.size, self._nccl_type(mine),
                           backend.xp.cuda.get_current_stream().ptr)

    def wait(self, stream=None):
        """Wait, at most the timeout, for the queued device work (the NCCL calls) of stream (default: the
        current one); a no-op on the CPU, where every collective has completed on return."""
        if self._nccl is None:
            return
        stream = stream or backend.xp.cuda.get_current_stream()
        deadline = time.monotonic() + self.timeout
        while not stream.done:
            self._nccl[1].check_async_error()  # a failed peer that NCCL noticed
            if time.monotonic() > deadline:
                self._nccl[1].abort()
                raise RankTimeout(self._lost("device collective"))
            time.sleep(POLL_S)

    def _communicator(self):
        """(cupy.cuda.nccl, an NCCL communicator over the ranks), made at the first device collective (every
        rank reaches it at the same point; a graph's first step runs eagerly) from a unique id that rank 0
        makes and MPI broadcasts."""
        if self._nccl is None:
            try:
                from cupy.cuda import nccl
                why = "" if nccl.available else "cupy.cuda.nccl.available is False"
            except ImportError as e:
                why = str(e)
            if why:
                raise ValueError(f"several ranks on GPUs need NCCL ({why}): pip install 'minibp[gpu-dist]' "
                                 "(nvidia-nccl-cu13)")
            unique_id = self.broadcast(nccl.get_unique_id() if self.rank == 0 else None)
            self._nccl = nccl, nccl.NcclCommunicator(self.size, unique_id, self.rank)
        return self._nccl

    def _nccl_type(self, array):
        nccl = self._nccl[0]
        return {np.float32: nccl.NCCL_FLOAT32, np.float64: nccl.NCCL_FLOAT64}[array.dtype.type]

    # ------------------------------------------------------------------ ending

    def report(self, message, error, code):
        """How a rank ends on an error: returns code, or does not return (MPI_Abort).

        An error every rank meets alike (error.on_every_rank: rank 0's, sent by on_rank_0; a disagreement;
        divergence, found by every rank from the same gathered losses) is printed by rank 0, and the ranks
        wait for each other (so that none is killed before rank 0 has printed) and return code. Any other
        error is this rank's alone: printed with its rank, then MPI_Abort ends every rank of the job."""
        if getattr(error, "on_every_rank", False):
            if self.rank == 0:
                print(f"error: {message}", file=sys.stderr, flush=True)
            try:
                self.barrier(timeout=min(self.timeout, 10.0))
            except RankTimeout:
                pass
            return code
        mine = message if message.startswith(f"rank {self.rank}") else f"rank {self.rank}: {message}"
        print(f"error: {mine}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # The launcher forwards a rank's output through a proxy that the abort kills: a moment first, or
        # the line can be lost (seen once in CI: a stopped rank's job ended with no message).
        time.sleep(0.5)
        self.comm.Abort(code)
