"""One training step (forward, backward and SGD over the sub-batches of a batch), run eagerly or
replayed as one CUDA graph.

    step = TrainStep(net, opt, split=2, graph=True)   # graph: GPU only; elsewhere it runs eagerly
    step.run(images, labels, lr=0.1)                  # one step over split * net.batch images
    loss, accuracy = step.result()                    # the last step's mean over its sub-batches
    TrainStep(net, opt, split=1, group=dist.start())  # one rank's share of a batch (dist.py): see below

Eager: net.zero_grad(), then net.forward / net.backward for each sub-batch, then opt.step; the loss
comes back to the host after every forward, so a loss that is not finite raises FloatingPointError
at once (and leaves the running statistics as they were).

Graph (not yet run on a GPU: CuPy 14 refuses cuBLAS calls during stream capture, so TrainStep refuses
graph=True there with that reason until a capture works; graph_capture_refused asks): on a GPU a step is
thousands of kernel launches and array operations (bench/gpu.py counts them), each costing the host
microseconds while the device needs tens of milliseconds for the whole step's arithmetic. Every buffer
of a step is already in the net's arena, at fixed addresses, so the step can be captured once as a CUDA
graph and replayed:
- the batch is copied into fixed device buffers (images (B, H, W, C), labels (B,)) before each launch;
- the first step runs eagerly, on the step's own stream and memory pool, which teaches the pool the
  step's few temporaries (reductions, the loss); the next is captured and launched, the rest launched;
- the pool is private to the graph, so no other array ever takes the temporaries' addresses;
- the learning rate is a kernel argument frozen into a graph: each rate of the schedule gets its own
  capture (a schedule has a handful);
- clipping's gradient norm is computed and read on the device (optim.py), so a graph holds it; AdamW's
  bias correction, a kernel argument that changes every step, would be frozen: AdamW runs eagerly only;
- the loss stays on the device until result() reads it (once per logged step), so divergence is
  found at the next logged step, and checkpoints still refuse weights that are not finite.

Several ranks (group, dist.py), each running split sub-batches of its share of the batch, take the
step of one process running ranks * split sub-batches: each backward is scaled by 1 / (ranks * split);
the forward passes write the running-statistics increments aside (Net.defer_running); after the last
backward one sum over the ranks (group.sum: in rank order on the CPU) adds the flat gradients and one
all-gather brings every rank's increments, losses and accuracies, which every rank then applies in rank
order before the same SGD step. (With P ranks of 1 sub-batch each the summed gradients are bit for bit
those of one process with --split P, added in the same order; with split above 1 on each rank they
differ from it by the order of the additions, and NCCL's sum keeps its own order.) Eager, the losses are checked after the gather, on every rank alike, before
anything is applied; a graph captures the NCCL calls with the rest (MPI cannot be captured: the CPU has
no graphs anyway).
"""
import functools

import numpy as np

from . import backend, checks


@functools.lru_cache(maxsize=None)
def graph_capture_refused():
    """Why this CuPy cannot capture a step as a CUDA graph, or "" where it can. Every step multiplies matrices
    through cuBLAS, and CuPy 14 refuses any cuBLAS call while a stream captures (NotImplementedError: seen on
    an H200, docs/gpu.md), so a 2x2 product is captured once to ask."""
    xp = backend.xp
    stream, a = xp.cuda.Stream(non_blocking=True), xp.ones((2, 2), np.float32)
    out, why = xp.empty_like(a), ""
    with stream:
        stream.begin_capture()
        try:
            xp.matmul(a, a, out=out)
        except Exception as e:  # NotImplementedError from CuPy's cuBLAS wrapper, or a CUDA error
            why = f"{type(e).__name__}: {e}"
        finally:
            try:
                stream.end_capture()  # ends the capture even after a refused call, or the stream stays unusable
            except Exception as e:
                why = why or f"{type(e).__name__}: {e}"
    return why


class TrainStep:
    def __init__(self, net, opt, *, split=1, graph=False, group=None):
        if net.arena is None or not net.training:
            raise RuntimeError("TrainStep needs a net compiled for training")
        self.net, self.opt, self.split, self.group = net, opt, int(split), group
        self.graph = bool(graph) and backend.device == "gpu"  # the CPU fallback is eager execution
        if self.graph and net.store.stochastic:  # its draws are kernel arguments a graph would freeze
            raise ValueError("stochastic rounding does not run in a CUDA graph yet: train without --graph")
        if self.graph and getattr(opt, "uses_iteration", False):  # AdamW's bias correction: the same
            raise ValueError(f"{type(opt).__name__} does not run in a CUDA graph yet (its bias correction changes "
                             f"every step): train without --graph")
        if self.graph and graph_capture_refused():
            raise ValueError(f"this CuPy cannot capture a training step as a CUDA graph ({graph_capture_refused()}): "
                             "train without --graph")
        self.loss_scale = 1.0 / (self.split * (group.size if group else 1))
        self._last = (np.nan, np.nan)
        self._draws = None  # the first sub-batch's draw of the running step (run(iteration=...))
        self._iteration = None  # the running step's iteration, which the optimizer's step takes
        self._losses = None  # (split, 2) device: each sub-batch's loss and accuracy, in graph mode
        if group is not None:  # a row per sub-batch: its running-statistics increments (2, S), loss, accuracy
            S = net.arena["running"].shape[1]
            self._mine = backend.xp.zeros((self.split, 2 * S + 2), np.float64)  # (float64 holds all exactly)
            self._all = backend.xp.zeros((group.size,) + self._mine.shape, np.float64)  # (ranks, split, 2S + 2)
            self._increments = [row[:2 * S].reshape(2, S) for row in self._mine]
            self._losses = self._mine[:, 2 * S:]
        if self.graph:
            xp = backend.xp
            self.stream, self.pool, self.graphs, self._warm = xp.cuda.Stream(non_blocking=True), \
                xp.cuda.MemoryPool(), {}, False
            B = self.split * net.batch
            with xp.cuda.using_allocator(self.pool.malloc):
                self.images = xp.empty((B,) + net.input_shape, net.dtype)   # (B, H, W, C)
                self.labels = xp.empty((B,), np.int64)                      # (B,)
                if group is None:
                    self._losses = xp.empty((self.split, 2), net.dtype)     # (split, 2)

    def run(self, images, labels, *, lr, iteration=None):
        """One step on images (split * net.batch, H, W, C) and labels (split * net.batch,). iteration numbers
        the stores' random draws under stochastic rounding: sub-batch s of rank r takes draw
        iteration * ranks * split + r * split + s, as sub-batch r * split + s of one process would, so a
        resumed run and P ranks draw as one uninterrupted process (None: the net counts its forwards). It is
        the number of steps done before this one, which the optimizer's step takes too (AdamW needs it)."""
        if len(images) != self.split * self.net.batch:
            raise ValueError(f"a step takes {self.split} x {self.net.batch} images, got {len(images)}")
        if iteration is None and getattr(self.opt, "uses_iteration", False):  # before anything runs
            raise ValueError(f"{type(self.opt).__name__} needs run(..., iteration=): the steps done before this one")
        ranks, rank = (self.group.size, self.group.rank) if self.group else (1, 0)
        self._iteration = None if iteration is None else checks.index(iteration, "iteration")
        self._draws = None if iteration is None else self._iteration * ranks * self.split + rank * self.split
        if not self.graph and self.group is None:
            return self._eager(images, labels, lr)
        checks.check_labels(np.asarray(labels), len(labels), self.net.classes)  # on the host: no device sync
        if not self.graph:
            return self._body(images, labels, lr)
        xp = backend.xp
        with self.stream, xp.cuda.using_allocator(self.pool.malloc):
            xp.copyto(self.images, xp.asarray(images))
            xp.copyto(self.labels, xp.asarray(labels))
            if lr in self.graphs:
                self.graphs[lr].launch(stream=self.stream)
            elif not self._warm:
                self._body(self.images, self.labels, lr)
                self._warm = True
            else:
                self.stream.begin_capture()
                try:
                    self._body(self.images, self.labels, lr)
                except BaseException:  # a call the capture refused: end it, or the stream refuses all that follows
                    try:
                        self.stream.end_capture()
                    except Exception:
                        pass
                    raise
                self.graphs[lr] = self.stream.end_capture()
                self.graphs[lr].launch(stream=self.stream)

    def result(self):
        """(loss, accuracy) of the last step, averaged over its sub-batches and ranks (graph mode: a host read)."""
        if self.graph and self.group is not None:
            self.group.wait(self.stream)
            self._last = self._mean_over_ranks()
        elif self.graph:
            self.stream.synchronize()
            self._last = tuple(float(v) for v in backend.to_host(self._losses).mean(axis=0))
        return self._last

    def _mean_over_ranks(self):
        """(loss, accuracy) over every rank's sub-batches, averaged as one process averages its own."""
        losses = np.ascontiguousarray(backend.to_host(self._all)[..., -2:].reshape(-1, 2))  # (ranks * split, 2)
        if not self.graph and not np.isfinite(losses[:, 0]).all():
            rank, sub_batch = divmod(int(np.flatnonzero(~np.isfinite(losses[:, 0]))[0]), self.split)
            raise FloatingPointError(f"the loss is {losses[rank * self.split + sub_batch, 0]} on rank {rank}, "
                                     f"sub-batch {sub_batch}")
        return tuple(float(v) for v in losses.mean(axis=0))

    def _draw(self, s):
        return None if self._draws is None else self._draws + s

    def _eager(self, images, labels, lr):
        net, n = self.net, self.net.batch
        net.zero_grad()
        results = []
        for s, start in enumerate(range(0, len(images), n)):
            results.append(net.forward(images[start:start + n], labels[start:start + n], draw=self._draw(s)))
            net.backward(loss_scale=self.loss_scale)
        self.opt.step(lr=lr, iteration=self._iteration)
        self._last = tuple(float(v) for v in np.mean(results, axis=0))

    def _body(self, images, labels, lr):
        """The step with no host round-trip: what a graph captures (eager with a group, one host read of
        the gathered losses before anything is applied)."""
        net, n, group = self.net, self.net.batch, self.group
        net.zero_grad()
        for s in range(self.split):
            if group is not None:
                net.defer_running(self._increments[s])
            loss, accuracy = net.forward(images[s * n:(s + 1) * n], labels[s * n:(s + 1) * n], sync=False,
                                         draw=self._draw(s))
            self._losses[s, 0], self._losses[s, 1] = loss, accuracy
            net.backward(loss_scale=self.loss_scale)
        if group is not None:
            net.defer_running(None)
            group.sum(net.grads)
            group.gather(self._mine, self._all)
            if not self.graph:
                group.wait()
                self._last = self._mean_over_ranks()  # raises FloatingPointError before anything is applied
            for increments in self._all.reshape(-1, self._mine.shape[1])[:, :-2]:  # in rank order
                net.add_running(increments.reshape(2, -1))
        self.opt.step(lr=lr, iteration=self._iteration)
