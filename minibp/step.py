"""One training step (forward, backward and the optimizer's step over the sub-batches of a batch), eager or
replayed.

    step = TrainStep(net, opt, sub_batches=2)          # graph=None: the device's default (below)
    step.run(images, labels, lr=0.1, iteration=i)      # one step: a batch of sub_batches * net.pass_images images
    loss, accuracy = step.result()                     # the last step's mean over its sub-batches
    TrainStep(net, opt, group=dist.start())            # one rank's share of a batch (dist.py): see below

Eager: net.forward / net.backward for each sub-batch (the first backward sets the gradients, the others add to
them), then opt.step: each pass is a recorded program replayed (program.py), and the loss comes back to the
host after every forward, so a loss that is not finite raises FloatingPointError at once (and leaves the
running statistics as they were).

Replayed (graph=True): the whole step is one program, recorded once from the passes' programs: for each
sub-batch, copy its images and labels from fixed staging buffers into the net's input buffers, then the
forward, loss and backward passes (the first sub-batch's set the loss sums and the gradients, the others add
to them); then the optimizer's step. What changes from step to step lives on the device and is written before
each replay: the batch (staged on the host), the learning rate and AdamW's bias corrections
(arena["scalars"]) and stochastic rounding's first draw (arena["draw"], which each forward counts on). So one
program serves a whole run: any schedule, AdamW, clipping (whose norm is computed and read on the device) and
stochastic rounding.
- On a GPU the program is captured once as a CUDA graph and relaunched: the host issues one launch a step
  instead of thousands of calls. Every buffer is the arena's, at a fixed address, and the staging buffers are
  pinned host memory, so the device memory is the plan's. The first step runs the program eagerly on the
  step's stream (it loads every kernel), the second captures it. The loss stays on the device until result()
  reads it, so divergence is found at the next logged step; checkpoints still refuse weights that are not
  finite. GEMMs go through minibp's own cuBLAS binding (blas.py) and convolutions through cuDNN's execute,
  both of which a capture holds (graph_capture_refused asks, once).
- On the CPU the same program is replayed as it is: the graph's stand-in, equal to eager steps bit for bit.
The default, graph=None, replays as a CUDA graph on a GPU that can capture one and runs eagerly elsewhere.
Either way run() checks the images as the eager forward does (checks.check_images: their height, width,
channels and dtype), before anything runs; and a net compiled again (another pass size or store) is stepped on its
new arena, the replay's staging buffers, program and graph made anew.

Several ranks (group, dist.py), each running sub_batches sub-batches of its share of the batch, take the
step of one process running ranks * sub_batches: each backward is scaled by 1 / (ranks * sub_batches); the
forward passes write the running-statistics increments aside (Net.defer_running); after the last backward one
sum over the ranks (group.sum: in rank order on the CPU) adds the flat gradients and one all-gather brings every
rank's increments, losses and accuracies, which every rank then applies in rank order before the same step of
the optimizer. (With P ranks of 1 sub-batch each the summed gradients are bit for bit those of one process with
P sub-batches, added in the same order; with more sub-batches on each rank they differ from it by the order of
the additions, and NCCL's sum keeps its own order.) The losses are checked after the gather, on every rank
alike, before anything is applied. Ranks step eagerly: MPI cannot be captured.
"""
import functools
import warnings
import weakref

import numpy as np

from . import backend, blas, checks, program


@functools.lru_cache(maxsize=None)
def graph_capture_refused():
    """Why a training step cannot be captured as a CUDA graph here, or "" where it can: a 2x2 product through
    minibp's cuBLAS binding (blas.py) is captured once, on a side stream, to ask."""
    if backend.device != "gpu":
        return "CUDA graphs need a GPU"
    xp = backend.xp
    pool = xp.cuda.MemoryPool()  # its own: what the question allocates goes with it, not into the net's pool
    try:
        with xp.cuda.using_allocator(pool.malloc):
            stream, a = xp.cuda.Stream(non_blocking=True), xp.ones((2, 2), np.float32)
            out, workspace = xp.empty_like(a), xp.empty(blas.WORKSPACE_BYTES, np.uint8)
        binding = blas.Cublas.loaded(workspace=workspace)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    why = ""
    with stream:
        stream.begin_capture()
        try:
            binding.gemm(a, a, out, trans_a=False, trans_b=False, accumulate=False)
        except Exception as e:  # a CUDA or cuBLAS error
            why = f"{type(e).__name__}: {e}"
        finally:
            try:
                stream.end_capture()  # ends the capture even after a refused call, or the stream stays unusable
            except Exception as e:
                why = why or f"{type(e).__name__}: {e}"
    return why


class TrainStep:
    def __init__(self, net, opt, *, sub_batches=1, graph=None, group=None, split=None):
        _check_compiled(net)
        if split is not None:  # the old name of sub_batches, for a release
            warnings.warn("TrainStep(split=) is now TrainStep(sub_batches=)", DeprecationWarning, stacklevel=2)
            sub_batches = split
        self.net, self.opt, self.group = net, opt, group
        self.sub_batches = checks.positive_int(sub_batches, "sub_batches")
        self.replay, self.graph = _replay_and_graph(graph, group=group)
        self.loss_scale = 1.0 / (self.sub_batches * (group.size if group else 1))
        self._last = (np.nan, np.nan)
        self._program = self._cuda_graph = None
        self._steps = 0  # replayed steps run (the first runs eagerly on the GPU, the second is captured)
        self._arena = None  # (a weak reference to) the arena the replay was prepared for
        if self.replay:
            self._prepare_replay()
        if group is not None:  # a row per sub-batch: its running-statistics increments (2, S), loss, accuracy
            S = net.arena["running"].shape[1]
            self._mine = backend.xp.zeros((self.sub_batches, 2 * S + 2), np.float64)  # (float64 holds all exactly)
            self._all = backend.xp.zeros((group.size,) + self._mine.shape, np.float64)  # (ranks, sub-batches, 2S + 2)
            self._increments = backend.xp.zeros((2, S), net.dtype)  # a sub-batch's, which forward writes

    split = property(lambda self: self.sub_batches)  # the old name

    def _prepare_replay(self):
        """The staging buffers the replayed step copies each sub-batch from (pinned host memory on the GPU), and
        on the GPU the stream it runs on; again after the net is compiled anew (another pass size, store or arena),
        the program and graph of the old arena dropped."""
        net, B = self.net, self.sub_batches * self.net.pass_images
        self._arena, self._program, self._cuda_graph, self._steps = weakref.ref(net.arena), None, None, 0
        if backend.device == "gpu":
            import cupyx  # (the GPU only: backend chose CuPy)
            self.stream = backend.xp.cuda.Stream(non_blocking=True)
            self._images = cupyx.empty_pinned((B,) + net.input_shape, net.dtype)   # (B, H, W, C)
            self._labels = cupyx.empty_pinned((B,), np.int64)                      # (B,)
        else:
            self._images = np.empty((B,) + net.input_shape, net.dtype)
            self._labels = np.empty((B,), np.int64)

    def run(self, images, labels, *, lr, iteration=None):
        """One step on a batch: images (sub_batches * net.pass_images, H, W, C) and labels (sub_batches *
        net.pass_images,), a pass a sub-batch. iteration numbers the stores' random draws under stochastic
        rounding: sub-batch s of rank r takes draw iteration * ranks * sub_batches + r * sub_batches + s, as
        sub-batch r * sub_batches + s of one process would, so a resumed run and P ranks draw as one
        uninterrupted process (None: the net counts its forwards).
        It is the number of steps done before this one, which the optimizer's step takes too (AdamW needs it)."""
        _check_compiled(self.net)  # (compiled again since: for evaluation, say)
        if self.replay and self._arena() is not self.net.arena:
            self._prepare_replay()
        if len(images) != self.sub_batches * self.net.pass_images:
            raise ValueError(f"a step takes {self.sub_batches} x {self.net.pass_images} images, got {len(images)}")
        # the eager forward's check, before anything runs: a replay's staging copy would broadcast other images
        checks.check_images(images, self.net.input_shape, self.net.dtype)
        if iteration is None and self.opt.uses_iteration:  # before anything runs
            raise ValueError(f"{type(self.opt).__name__} needs run(..., iteration=): the steps done before this one")
        ranks, rank = (self.group.size, self.group.rank) if self.group else (1, 0)
        self._iteration = None if iteration is None else checks.index(iteration, "iteration")
        first_draw = None if iteration is None else (self._iteration * ranks + rank) * self.sub_batches
        if self.group is not None:
            return self._ranks(images, labels, lr, first_draw)
        if not self.replay:
            return self._eager(images, labels, lr, first_draw)
        checks.check_labels(np.asarray(labels), len(labels), self.net.classes)  # on the host: no device sync
        if self.graph:  # the last step's graph may still be copying from the staging buffers
            self.stream.synchronize()
        self._images[...] = backend.to_host(images)
        self._labels[...] = backend.to_host(labels)
        if self.graph:
            with self.stream:
                self._write_scalars(lr, first_draw)
                self._replay_on_the_gpu()
        else:
            self._write_scalars(lr, first_draw)
            self._step_program().run()

    def _write_scalars(self, lr, first_draw):
        """What changes from step to step, on the device: the optimizer's scalars and the first draw."""
        self.opt.set_scalars(lr=lr, iteration=self._iteration)
        if first_draw is not None and "draw" in self.net.arena:
            backend.copy_in(self.net.arena["draw"], np.array([first_draw], np.int64))

    def _step_program(self):
        """The whole step as one Program (the module docstring), recorded at its first use."""
        if self._program is None:
            net, n = self.net, self.net.pass_images
            step = program.Program()
            for s in range(self.sub_batches):
                with program.record() as load:
                    program.upload(net.arena["input"], self._images[s * n:(s + 1) * n])
                    program.upload(net.arena["labels"], self._labels[s * n:(s + 1) * n])
                for part in (load, net.program("forward", n), net.program("loss", n, accumulate=s > 0),
                             net.program("backward", n, loss_scale=self.loss_scale, accumulate=s > 0)):
                    step.extend(part)
            self._program = step.extend(self.opt.program())
        return self._program

    def _replay_on_the_gpu(self):
        """The step program run eagerly on the step's stream (the first step: every kernel loads), then captured as
        a CUDA graph (the second) and launched (every later one)."""
        step = self._step_program()
        self._steps += 1
        if self._steps == 1:
            step.run()
            return
        if self._cuda_graph is None:
            self.stream.begin_capture()
            try:
                step.run()
            except BaseException:  # a call the capture refused: end it, or the stream refuses all that follows
                try:
                    self.stream.end_capture()
                except Exception:
                    pass
                raise
            self._cuda_graph = self.stream.end_capture()
        self._cuda_graph.launch(stream=self.stream)

    def result(self):
        """(loss, accuracy) of the last step, averaged over its sub-batches and ranks (replayed: a host read)."""
        if self.replay:
            if self.graph:
                self.stream.synchronize()
            self._last = tuple(float(v) / self.sub_batches for v in backend.to_host(self.net.arena["loss"][1]))
        return self._last

    def _eager(self, images, labels, lr, first_draw):
        net, n = self.net, self.net.pass_images
        results = []
        for s, start in enumerate(range(0, len(images), n)):
            results.append(net.forward(images[start:start + n], labels[start:start + n],
                                       draw=None if first_draw is None else first_draw + s))
            net.backward(loss_scale=self.loss_scale, accumulate=s > 0)  # (the first sets the gradients)
        self.opt.step(lr=lr, iteration=self._iteration)
        self._last = tuple(float(v) for v in np.mean(results, axis=0))

    def _ranks(self, images, labels, lr, first_draw):
        """One rank's share of the step, eagerly: its sub-batches with the running statistics deferred, then the
        sum of the gradients, the gather of the increments and losses, and their application in rank order."""
        net, n, group = self.net, self.net.pass_images, self.group
        checks.check_labels(np.asarray(labels), len(labels), net.classes)
        S = self._increments.shape[1]
        net.defer_running(self._increments)
        try:
            for s in range(self.sub_batches):
                loss, accuracy = net.forward(images[s * n:(s + 1) * n], labels[s * n:(s + 1) * n], sync=False,
                                             draw=None if first_draw is None else first_draw + s)
                row = self._mine[s]
                row[:2 * S] = self._increments.reshape(-1)
                row[2 * S], row[2 * S + 1] = loss, accuracy
                net.backward(loss_scale=self.loss_scale, accumulate=s > 0)
        finally:
            net.defer_running(None)
        group.sum(net.grads)
        group.gather(self._mine, self._all)
        group.wait()
        self._last = self._mean_over_ranks()  # raises FloatingPointError before anything is applied
        for increments in self._all.reshape(-1, self._mine.shape[1])[:, :-2]:  # in rank order
            net.add_running(increments.reshape(2, -1))
        self.opt.step(lr=lr, iteration=self._iteration)

    def _mean_over_ranks(self):
        """(loss, accuracy) over every rank's sub-batches, averaged as one process averages its own."""
        losses = np.ascontiguousarray(backend.to_host(self._all)[..., -2:].reshape(-1, 2))  # (ranks * sub-batches, 2)
        if not np.isfinite(losses[:, 0]).all():
            rank, sub_batch = divmod(int(np.flatnonzero(~np.isfinite(losses[:, 0]))[0]), self.sub_batches)
            raise FloatingPointError(f"the loss is {losses[rank * self.sub_batches + sub_batch, 0]} on rank {rank}, "
                                     f"sub-batch {sub_batch}")
        return tuple(float(v) for v in losses.mean(axis=0))


def _check_compiled(net):
    if net.arena is None or not net.training:
        raise RuntimeError("TrainStep needs a net compiled for training")


def _replay_and_graph(graph, *, group):
    """(replay, graph) for TrainStep(graph=...): None, the device's default (a CUDA graph where the GPU can capture
    one, else eager); True, replayed (a CUDA graph on a GPU: refused in one line where it cannot capture one);
    False, eager. Ranks step eagerly."""
    if graph is not None and not isinstance(graph, (bool, np.bool_)):
        raise TypeError(f"graph must be True, False or None (the device's default), got {graph!r}")
    gpu = backend.device == "gpu"
    if group is not None:
        if graph:
            raise ValueError("several ranks step eagerly (MPI cannot be captured): train without --graph")
        return False, False
    if graph is None:
        replay = gpu and not graph_capture_refused()
        return replay, replay
    if graph and gpu and graph_capture_refused():
        raise ValueError(f"this GPU cannot capture a training step as a CUDA graph ({graph_capture_refused()}): "
                         "train without --graph")
    return bool(graph), bool(graph) and gpu
