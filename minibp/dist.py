"""Data-parallel training over several processes: MPI (mpi4py) starts them, names their ranks and sums
host arrays; on GPUs NCCL sums the gradients, its unique id sent over MPI.

    mpirun -n 2 python3 -m minibp.train --batch 128 ...     # each rank computes 64 of the 128 images

    group = start(timeout=60)      # None in a process that no MPI launcher started (mpi4py not imported)
    group.agree(options)           # rank 0's options and device on every rank, or a ValueError naming a difference
    result = group.on_rank_0(fn)   # fn() on rank 0 alone (the run folder is its); the result or error everywhere
    group.sum(grads)               # in place, over the ranks: NCCL for a device array, MPI for a host one
    group.gather(mine, out)        # out (size,) + mine.shape holds every rank's, in rank order
    group.any(flag)                # True on every rank when any rank's flag is
    group.agree_data(split, path)  # every rank reads rank 0's data, or a ValueError naming one that does not

A process counts as one of several ranks when the launcher says so in its environment
(OMPI_COMM_WORLD_SIZE for Open MPI, PMI_SIZE for MPICH, Intel MPI and Slurm's PMI): only then is
mpi4py imported, so one process needs no MPI at all, and `mpirun -n 1` is one process.

No wait is unbounded. A rank that dies is normally seen by the launcher, which kills the others at once
(MPICH's mpirun does, printing "BAD TERMINATION"). Where it does not (a rank that hangs or is stopped,
one that returns early, a launcher run with cleanup disabled), every MPI collective here is
non-blocking and polled against a deadline, and a GPU stream is polled the same way before the host
reads it: after `timeout` seconds without the other ranks the rank raises RankTimeout, and the
trainer prints it and calls MPI_Abort, which ends the whole job.

Several machines: a rank's messages name its host (MPI's processor name). A rank that ends the job first asks
the others whether they are there, on a communicator of its own that every waiting rank answers from its poll
loop. A timeout names the ranks, and their hosts, that did not answer (a dead, stopped or cut-off machine). An
error of a rank's own goes to the lowest rank that answers, which prints it: ranks that fail alike (a host's full
disk) print one line between them, from a rank the launcher still hears (a cut-off host's output is lost).
"""
import os
import pickle
import sys
import time

import numpy as np

from . import backend, extras, integrity

SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")  # set by Open MPI's, and by MPICH's (hydra) launchers
POLL_S = 2e-4  # between tests of a pending collective: short against a step, and leaves the core to the others
# How long an ending rank waits for the others to answer it, and for the rank it sent its error to to end the job:
# the ranks still there are waiting on the one that is not, so they answer within a poll.
GRACE_S = 2.0
PING, ANSWER, ERROR = 1, 2, 3  # the tags of the messages between ranks ending the job and the others


class RankTimeout(TimeoutError):
    """The other ranks did not answer within the timeout: one of them stopped, died or hangs. Also the error another
    rank sent this one to print for it (relayed: its exit status), the whole line in the message."""
    relayed = None


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
        raise ValueError(extras.missing("dist", f"this process is one of {size} ranks ({variable}={size}) but mpi4py "
                                                f"does not import ({e})")) from None
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
        self._talk, self._sent, self._answered = None, [], set()  # the ending ranks' messages (_serve)
        self.hosts = None  # every rank's host, in rank order
        talk, request = comm.Idup()  # a communicator of its own: its messages never match a collective's
        self._wait(request, "start")
        self._talk = talk
        self.hosts = self.gather_objects(mpi.Get_processor_name())

    # ------------------------------------------------------------------ host collectives (MPI)

    def _wait(self, request, what):
        """Poll an MPI request until it completes, answering the ranks that end the job (_serve); RankTimeout after
        self.timeout seconds."""
        deadline = time.monotonic() + self.timeout
        try:
            while not request.Test():
                self._serve()
                if time.monotonic() > deadline:
                    raise self._lost(what)
                time.sleep(POLL_S)
        except self.MPI.Exception as e:  # an MPI library that reports a failed peer instead of waiting
            raise RankTimeout(f"rank {self.rank}{self._on(self.rank)}: the {what} failed ({e.Get_error_string()}): "
                              "another rank stopped") from None

    def _lost(self, what):
        """The RankTimeout of a wait for the others at `what`, naming those that do not answer now, and their hosts."""
        answering = self._answering()
        silent = [rank for rank in range(self.size) if rank not in answering]
        if silent:
            where = {}
            for rank in silent:
                where.setdefault(self.hosts[rank] if self.hosts else None, []).append(str(rank))
            who = " and ".join(f"rank{'s' * (len(ranks) > 1)} {', '.join(ranks)}{f' on {host}' if host else ''}"
                               for host, ranks in where.items())
            why = f"{who} do{'es' * (len(silent) == 1)} not answer: died, stopped, hung or cut off from the network"
        else:
            why = "every rank answers, but the collective did not complete"
        error = RankTimeout(f"rank {self.rank} of {self.size} waited {self.timeout:g} s for the others at a {what}: "
                            f"{why} (an error of their own, if any, is above); --rank-timeout sets the wait")
        error.answering = answering
        return error

    def _on(self, rank):
        return f" on {self.hosts[rank]}" if self.hosts else ""

    # ------------------------------------------------------------------ ending the job (report)

    def _serve(self, *, relay=True):
        """Take the messages of ranks that are ending the job: answer a ping; count an answer to this rank's own;
        raise the error a rank sent here to print (relay=False, while ending the job itself: drop it)."""
        if self._talk is None:
            return
        status = self.MPI.Status()
        while self._talk.Iprobe(source=self.MPI.ANY_SOURCE, tag=self.MPI.ANY_TAG, status=status):
            source, tag = status.Get_source(), status.Get_tag()
            message = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
            self._talk.Recv(message, source=source, tag=tag)  # here already: returns at once
            if tag == PING:
                self._sent.append(self._talk.Isend(np.zeros(1, np.uint8), dest=source, tag=ANSWER))
            elif tag == ANSWER:
                self._answered.add(source)
            elif tag == ERROR and relay:
                line, code = pickle.loads(message.tobytes())
                error = RankTimeout(line)
                error.relayed = code
                raise error

    def _send(self, rank, tag, payload=b"\0"):
        try:
            self._sent.append(self._talk.Isend(np.frombuffer(payload, np.uint8), dest=rank, tag=tag))
        except self.MPI.Exception:  # a rank the library knows is gone: it does not answer
            pass

    def _answering(self):
        """The ranks that answer a ping within GRACE_S (or the timeout, if shorter), this one included."""
        self._answered = {self.rank}
        if self._talk is None:  # the ranks never started together: none can be asked
            return set(self._answered)
        for rank in range(self.size):
            if rank != self.rank:
                self._send(rank, PING)
        self._linger(min(self.timeout, GRACE_S), until=lambda: len(self._answered) == self.size)
        return set(self._answered)

    def _linger(self, seconds, *, until=lambda: False):
        """Answer the others (relaying nothing) for `seconds`, or until until() is true."""
        deadline = time.monotonic() + seconds
        while not until() and time.monotonic() < deadline:
            self._serve(relay=False)
            time.sleep(POLL_S)

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

    def agree_data(self, split, path):
        """Check that every rank reads the training data rank 0 reads (each reads its own copy: on several machines,
        its host's), by the SHA-256 of split (data.Split: the file's; imagenet.Folder: its listing's; an older file
        without one: its images'); otherwise a ValueError on every rank naming the first rank that differs and its
        host. path: the data file or folder, as the message names it."""
        digest = split.sha256() if callable(split.sha256) else split.sha256 or integrity.sha256_array(split.images)
        everyone = self.gather_objects(digest)
        for rank, theirs in enumerate(everyone):
            if theirs != everyone[0]:
                error = ValueError(f"rank {rank}{self._on(rank)} reads other data than rank 0{self._on(0)}: its {path} "
                                   f"has SHA-256 {theirs[:16]}..., rank 0's {everyone[0][:16]}...; every rank needs "
                                   "the same data at the same path")
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
            self._sum_in_rank_order(array)
        else:
            nccl, comm = self._communicator()
            comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._nccl_type(array), nccl.NCCL_SUM,
                           backend.xp.cuda.get_current_stream().ptr)

    def _sum_in_rank_order(self, array):
        """array = rank 0's + rank 1's + ... added in that order, as one process adds its sub-batches' gradients,
        so that P ranks of one sub-batch each step as one process with --split P, bit for bit (MPI's all-reduce
        adds in its algorithm's order, which past 2 ranks is not rank order). Each rank adds up one segment of
        every rank's array (an all-to-all), then every rank gathers the segments: what an all-reduce moves."""
        if not array.flags.c_contiguous:
            raise ValueError("sum: the array must be C-contiguous")
        flat, n = array.reshape(-1), array.size
        width = -(-n // self.size)  # each rank's segment, the last one padded
        padded = n != width * self.size
        rows = np.zeros((self.size, width), array.dtype) if padded else flat.reshape(self.size, width)
        if padded:
            rows.reshape(-1)[:n] = flat
        received = np.empty_like(rows)  # (ranks, width): every rank's copy of this rank's segment
        self._wait(self.comm.Ialltoall(rows, received), "sum")
        segment = received[0].copy()
        for row in received[1:]:
            segment += row
        self._wait(self.comm.Iallgather(segment, rows), "sum")
        if padded:
            flat[:] = rows.reshape(-1)[:n]

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
            self._serve()
            if time.monotonic() > deadline:
                self._nccl[1].abort()
                raise self._lost("device collective")
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
                raise ValueError(extras.missing("gpu-dist", f"several ranks on GPUs need NCCL ({why})"))
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
        error is this rank's alone: it names the rank and its host, on one line (a compiler's output too: the ranks'
        outputs interleave), and goes to the lowest rank that answers (_answering) to print; MPI_Abort then ends every
        rank of the job. One that another rank sent here (relayed) is printed as it came."""
        if getattr(error, "on_every_rank", False):
            if self.rank == 0:
                print(f"error: {message}", file=sys.stderr, flush=True)
            try:
                self.barrier(timeout=min(self.timeout, 10.0))
            except RankTimeout:
                pass
            return code
        if getattr(error, "relayed", None) is not None:
            mine, code = message, error.relayed
        else:
            mine = " ".join(line.strip() for line in message.splitlines() if line.strip())
            mine = mine if mine.startswith(f"rank {self.rank}") else f"rank {self.rank}{self._on(self.rank)}: {mine}"
            printer = min(getattr(error, "answering", None) or self._answering())
            if printer != self.rank:  # its abort ends this rank; if none comes, it is gone after all: print here
                self._send(printer, ERROR, pickle.dumps((mine, code)))
                self._linger(GRACE_S)
        print(f"error: {mine}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        # The launcher forwards a rank's output through a proxy that the abort kills: a moment first, or
        # the line can be lost (seen once in CI: a stopped rank's job ended with no message).
        time.sleep(0.5)
        self.comm.Abort(code)
