"""A pass as a program: the device calls of a forward or backward pass, checked and bound once, then replayed.

Every device call of a training step goes through `issue`: a kernel launch (kernels.py), a GEMM (blas.py),
a cuDNN convolution (layers/conv_cudnn.py), or one of the few array operations below. Outside a recording
`issue` performs the call at once. Inside `with record() as program:` it appends the bound call instead, and
`program.run()` later performs every call in order, with nothing checked or converted in between:

    with program.record() as forward:       # the arguments are checked here, once
        unit.forward(x, out, step)          # ... and each call bound: nothing runs
    forward.run()                           # the calls, in order: what a step replays

Net.compile records each pass of the net once (net.py), and a step replays them: on the GPU captured as one
CUDA graph (step.py), on the CPU replayed as they are, the graph's stand-in. A recorded call holds the
arrays it reads and writes (the arena's views), so a program is valid while its net's arena is.

`device_calls` counts the calls performed, eager or replayed (the benchmarks read it a step).
"""
import contextlib
import time

from . import backend

device_calls = 0   # device calls this process has performed
_recording = None  # the Program being recorded, or None: calls run at once
_timing = None     # {call name: seconds} while timed() times every call


class Program:
    """The bound device calls of a pass, in order: (name, function, arguments) each; run() performs them."""

    def __init__(self):
        self.names, self._calls = [], []
        self._keep = []  # arrays a call reaches through a raw address (the CPU's kernels): kept alive with it

    def append(self, name, function, arguments, keep=()):
        self.names.append(name)
        self._calls.append((function, arguments))
        self._keep += keep

    def extend(self, other):
        """Append another program's calls (a step is its passes' programs in turn)."""
        self.names += other.names
        self._calls += other._calls
        self._keep += other._keep
        return self

    def __len__(self):
        return len(self._calls)

    def substituted(self, replace):
        """A copy whose calls go through replace(function) instead (bench/step.py: the kernels' empty twins, to time
        the host's share of a step)."""
        copy = Program().extend(self)
        copy._calls = [(replace(function), arguments) for function, arguments in copy._calls]
        return copy

    def run(self):
        global device_calls
        if _timing is not None:
            for name, (function, arguments) in zip(self.names, self._calls):
                _timed(name, function, arguments)
        else:
            for function, arguments in self._calls:
                function(*arguments)
        device_calls += len(self._calls)


def issue(name, function, *arguments, keep=()):
    """Perform function(*arguments), a device call named `name`, or record it while a program is recorded
    (keep: arrays the arguments reach by address, which the program keeps alive)."""
    global device_calls
    if _recording is not None:
        _recording.append(name, function, arguments, keep)
        return
    if _timing is not None:
        _timed(name, function, arguments)
    else:
        function(*arguments)
    device_calls += 1


def recording():
    """True while a program is being recorded (a call must then not read results back)."""
    return _recording is not None


@contextlib.contextmanager
def record():
    """Record the device calls issued inside the block into a new Program, which the block's `as` receives."""
    global _recording
    if _recording is not None:
        raise RuntimeError("a program is already being recorded: recordings do not nest")
    _recording = Program()
    try:
        yield _recording
    finally:
        _recording = None


@contextlib.contextmanager
def timed():
    """Time every call performed inside the block, each waited for (the benchmarks: where a step's time goes);
    yields {call name: seconds}, filled as the calls run."""
    global _timing
    _timing = spent = {}
    try:
        yield spent
    finally:
        _timing = None


def _timed(name, function, arguments):
    backend.synchronize()
    start = time.perf_counter()
    function(*arguments)
    backend.synchronize()
    _timing[name] = _timing.get(name, 0.0) + time.perf_counter() - start


@contextlib.contextmanager
def paused():
    """Inside a recording, run the calls of the block at once: a query whose answer the recording needs now (the
    direct convolutions' tile geometry, say), not a call of the pass."""
    global _recording
    recording, _recording = _recording, None
    try:
        yield
    finally:
        _recording = recording


# ----------------------------------------------------------------------------- array operations as device calls

def copy(dst, src, *, name="copy"):
    """dst[...] = src (same shape; views of fixed buffers)."""
    issue(name, backend.xp.copyto, dst, src)


def fill(dst, value):
    """dst[...] = value."""
    issue("fill", dst.fill, value)


def upload(dst, src):
    """dst[...] = src, a host array (pinned, on the GPU: the copy is then asynchronous, and a CUDA graph holds it)."""
    if backend.device == "gpu":
        issue("upload", _upload, dst, src)
    else:
        issue("upload", backend.xp.copyto, dst, src)


def _upload(dst, src):
    # on the stream current at the call (a capture's): without a stream CuPy copies synchronously, which no graph holds
    dst.set(src, stream=backend.xp.cuda.get_current_stream())


def add(dst, src):
    """dst += src (same shape)."""
    issue("add", backend.xp.add, dst, src, dst)
