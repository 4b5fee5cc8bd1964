"""One training step (forward, backward and SGD over the sub-batches of a batch), run eagerly or
replayed as one CUDA graph.

    step = TrainStep(net, opt, split=2, graph=True)   # graph: GPU only; elsewhere it runs eagerly
    step.run(images, labels, lr=0.1)                  # one step over split * net.batch images
    loss, accuracy = step.result()                    # the last step's mean over its sub-batches

Eager: net.zero_grad(), then net.forward / net.backward for each sub-batch, then opt.step; the loss
comes back to the host after every forward, so a loss that is not finite raises FloatingPointError
at once (and leaves the running statistics as they were).

Graph: on a GPU a step is thousands of kernel launches and array operations (bench/gpu.py counts
them), each costing the host microseconds while the device needs tens of
milliseconds for the whole step's arithmetic. Every buffer of a step is already in the net's arena,
at fixed addresses, so the step can be captured once as a CUDA graph and replayed:
- the batch is copied into fixed device buffers (images (B, H, W, C), labels (B,)) before each launch;
- the first step runs eagerly, on the step's own stream and memory pool, which teaches the pool the
  step's few temporaries (reductions, the loss); the next is captured and launched, the rest launched;
- the pool is private to the graph, so no other array ever takes the temporaries' addresses;
- the learning rate is a kernel argument frozen into a graph: each rate of the schedule gets its own
  capture (a schedule has a handful);
- the loss stays on the device until result() reads it (once per logged step), so divergence is
  found at the next logged step, and checkpoints still refuse weights that are not finite.
"""
import numpy as np

from . import backend, layers


class TrainStep:
    def __init__(self, net, opt, *, split=1, graph=False):
        if net.arena is None or not net.training:
            raise RuntimeError("TrainStep needs a net compiled for training")
        self.net, self.opt, self.split = net, opt, int(split)
        self.graph = bool(graph) and backend.device == "gpu"  # the CPU fallback is eager execution
        self._last = (np.nan, np.nan)
        self._losses = None  # (split, 2) device: each sub-batch's loss and accuracy, in graph mode
        if self.graph:
            xp = backend.xp
            self.stream, self.pool, self.graphs, self._warm = xp.cuda.Stream(non_blocking=True), \
                xp.cuda.MemoryPool(), {}, False
            B = self.split * net.batch
            with xp.cuda.using_allocator(self.pool.malloc):
                self.images = xp.empty((B,) + net.input_shape, net.dtype)   # (B, H, W, C)
                self.labels = xp.empty((B,), np.int64)                      # (B,)
                self._losses = xp.empty((self.split, 2), net.dtype)         # (split, 2)

    def run(self, images, labels, *, lr):
        """One step on images (split * net.batch, H, W, C) and labels (split * net.batch,)."""
        if len(images) != self.split * self.net.batch:
            raise ValueError(f"a step takes {self.split} x {self.net.batch} images, got {len(images)}")
        if not self.graph:
            return self._eager(images, labels, lr)
        layers.check_labels(np.asarray(labels), len(labels), self.net.classes)  # on the host: no device sync
        xp = backend.xp
        with self.stream, xp.cuda.using_allocator(self.pool.malloc):
            xp.copyto(self.images, xp.asarray(images))
            xp.copyto(self.labels, xp.asarray(labels))
            if lr in self.graphs:
                self.graphs[lr].launch(stream=self.stream)
            elif not self._warm:
                self._body(lr)
                self._warm = True
            else:
                self.stream.begin_capture()
                self._body(lr)
                self.graphs[lr] = self.stream.end_capture()
                self.graphs[lr].launch(stream=self.stream)

    def result(self):
        """(loss, accuracy) of the last step, averaged over its sub-batches (graph mode: a host read)."""
        if self._losses is not None:
            self.stream.synchronize()
            self._last = tuple(float(v) for v in backend.to_host(self._losses).mean(axis=0))
        return self._last

    def _eager(self, images, labels, lr):
        net, n = self.net, self.net.batch
        net.zero_grad()
        results = []
        for start in range(0, len(images), n):
            results.append(net.forward(images[start:start + n], labels[start:start + n]))
            net.backward(loss_scale=1.0 / self.split)
        self.opt.step(lr=lr)
        self._last = tuple(float(v) for v in np.mean(results, axis=0))

    def _body(self, lr):
        """The step from the fixed buffers, with no host round-trip: what a graph captures."""
        net, n = self.net, self.net.batch
        net.zero_grad()
        for s in range(self.split):
            loss, accuracy = net.forward(self.images[s * n:(s + 1) * n], self.labels[s * n:(s + 1) * n], sync=False)
            self._losses[s, 0], self._losses[s, 1] = loss, accuracy
            net.backward(loss_scale=1.0 / self.split)
        self.opt.step(lr=lr)
