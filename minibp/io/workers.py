"""A pool of worker processes that run one function over lists in chunks: the ImageNet reader's decoders.

    pool = Pool(4, "minibp.io.imagenet:decode_chunk", what="an image-decoding worker")
    ticket = pool.submit(items, root, size)   # the workers run decode_chunk(root, size, chunk) on chunks of items
    images = pool.collect(ticket)             # the chunks' arrays, concatenated in the order of items
    pool.discard(ticket)                      # or forget a submitted list (its results are read and dropped)
    pool.close()                              # stops the workers (so do exit, Ctrl-C and garbage collection)

Each worker is a fresh interpreter (not a fork of the caller: no CUDA state, threads, MPI state or open
files such as the run folder's lock) in a session of its own (a Ctrl-C in the terminal reaches the caller
only), fed pickled tasks through its stdin, so it ends when the caller closes it or dies, however it dies.
Each answers its tasks in order, one at a time, and holds at most IN_FLIGHT of them, so that submitting
never blocks. A ValueError the function raises comes back as its one-line text and collect raises it
again; a worker that dies is a ChildProcessError naming it.
"""
import importlib
import itertools
import math
import os
import pickle
import signal
import subprocess
import sys
import weakref
from collections import deque
from pathlib import Path

import numpy as np

CHUNK = 64      # items a task at most: its pickle stays a few kB
IN_FLIGHT = 2   # tasks written to a worker and not yet answered: with CHUNK, far below a pipe's 64 kB, so a
                # write never blocks while the worker waits for its answer to be read (no deadlock)
WORKER = "import sys; sys.path.insert(0, {!r}); from minibp.io.workers import serve; serve({!r})"


def default_count():
    """One worker process per core the process may run on, less one for the caller."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores - 1)


def serve(function):
    """A worker process's loop: pickled argument tuples in on stdin, one pickled result each out on stdout
    (what function, "module:name", returns, or the text of a ValueError it raised), until stdin ends: when
    the caller closes it or dies, however it dies."""
    module, name = function.split(":")
    function = getattr(importlib.import_module(module), name)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: it finishes a step, then closes us
    tasks, results = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the results
    try:
        while True:
            try:
                task = pickle.load(tasks)
            except EOFError:
                return
            try:
                result = function(*task)
            except ValueError as e:
                result = str(e)
            pickle.dump(result, results, protocol=pickle.HIGHEST_PROTOCOL)
            results.flush()
    except BrokenPipeError:  # the caller is gone
        return


def _stop(processes):
    for p in processes:
        if p.poll() is None:
            p.terminate()  # a task holds nothing worth finishing
    for p in processes:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        for pipe in (p.stdin, p.stdout):
            try:
                pipe.close()
            except OSError:  # a broken pipe's unflushed task
                pass


class Pool:
    """count processes that run function ("module:name") on chunks: submit() hands a list out in chunks and
    returns a ticket, collect(ticket) reads the chunks' results back. `what` names a worker in errors."""

    def __init__(self, count, function, *, what="a worker"):
        if count < 1:
            raise ValueError(f"a pool needs at least 1 worker process, got {count}")
        self.what = what
        command = [sys.executable, "-c", WORKER.format(str(Path(__file__).resolve().parents[2]), function)]
        self.processes = []
        self._close = weakref.finalize(self, _stop, self.processes)
        for _ in range(count):
            self.processes.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   start_new_session=True))
        self._tickets, self._turn = itertools.count(), itertools.cycle(range(count))
        self._queued = [deque() for _ in range(count)]   # ((ticket, chunk), task) not yet written, in order
        self._sent = [deque() for _ in range(count)]     # (ticket, chunk) written, answered in this order
        self._waiting = {}   # ticket -> [worker of each chunk]
        self._ready = {}     # (ticket, chunk) -> a result read while looking for another

    def _fail(self, worker):
        p = self.processes[worker]
        try:
            code = p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = "none yet"
        return ChildProcessError(f"{self.what} (pid {p.pid}) stopped, exit code {code} (its error, if any, is "
                                 "above; -9 is a SIGKILL, e.g. the kernel's out-of-memory killer)")

    def _feed(self, worker):
        """Write the worker's queued tasks while it holds fewer than IN_FLIGHT (discarded lists' are dropped)."""
        queued, sent, pipe = self._queued[worker], self._sent[worker], self.processes[worker].stdin
        while queued and len(sent) < IN_FLIGHT:
            key, task = queued.popleft()
            if key[0] not in self._waiting:
                continue
            try:
                pickle.dump(task, pipe, protocol=pickle.HIGHEST_PROTOCOL)
                pipe.flush()
            except BrokenPipeError:
                raise self._fail(worker) from None
            sent.append(key)

    def submit(self, items, *args):
        """Give the workers function(*args, chunk) for chunks of items, in turn; returns the list's ticket."""
        ticket, per = next(self._tickets), min(CHUNK, math.ceil(len(items) / len(self.processes)))
        owners = []
        for chunk, start in enumerate(range(0, len(items), per)):
            worker = next(self._turn)
            self._queued[worker].append(((ticket, chunk), (*args, items[start:start + per])))
            owners.append(worker)
        self._waiting[ticket] = owners
        for worker in set(owners):
            self._feed(worker)
        return ticket

    def _result(self, ticket, chunk, worker):
        while (ticket, chunk) not in self._ready:
            self._feed(worker)
            got = self._sent[worker].popleft()
            try:
                result = pickle.load(self.processes[worker].stdout)
            except (EOFError, pickle.UnpicklingError):
                raise self._fail(worker) from None
            if got[0] in self._waiting:  # not a discarded list's
                self._ready[got] = result
        self._feed(worker)  # its next task, to run while the caller computes
        return self._ready.pop((ticket, chunk))

    def collect(self, ticket):
        """The ticket's results, concatenated (np.concatenate); the first chunk's ValueError, raised again, or
        ChildProcessError when a worker died."""
        parts = [self._result(ticket, chunk, worker) for chunk, worker in enumerate(self._waiting[ticket])]
        del self._waiting[ticket]
        failed = [p for p in parts if isinstance(p, str)]
        if failed:
            raise ValueError(failed[0])
        return np.concatenate(parts)

    def discard(self, ticket):
        """Forget a submitted list: its chunks not yet written are dropped, the others read and dropped."""
        for chunk in range(len(self._waiting.pop(ticket, []))):
            self._ready.pop((ticket, chunk), None)

    def close(self):
        self._close()

    @property
    def closed(self):
        return not self._close.alive
