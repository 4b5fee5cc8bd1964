"""Passes as programs (minibp/program.py): recorded once, replayed; the GEMM's bindings (minibp/blas.py), NumPy's
here and cuBLAS's arguments up to the library call, checked by a stand-in library that computes what they ask."""
import ctypes

import numpy as np
import pytest

from minibp import backend, blas, kernels, program
from conftest import device, host
from nets import tiny_resnet


def test_a_recorded_call_runs_at_replay_and_is_counted():
    out = device(np.zeros(4, np.float32))
    with program.record() as recorded:
        program.fill(out, 3)
        program.add(out, device(np.ones(4, np.float32)))
        assert program.recording()
    assert host(out).tolist() == [0] * 4 and len(recorded) == 2 and recorded.names == ["fill", "add"]
    before = program.device_calls
    recorded.run()
    recorded.run()
    assert host(out).tolist() == [4] * 4 and program.device_calls - before == 4
    with pytest.raises(RuntimeError, match="do not nest"):
        with program.record():
            with program.record():
                pass


def test_a_kernel_is_checked_when_recorded_and_a_query_runs_at_once():
    module = kernels.load("sgd.cu")
    with program.record():
        with pytest.raises(ValueError, match="missing norm"):
            module.grad_norm_finish(chunks=1, sums=device(np.zeros(1)), grid=(1,), block=(1,))
        norm = device(np.zeros(1))
        with program.paused():
            module.grad_norm_finish(chunks=1, sums=device(np.full(1, 9.0)), norm=norm, grid=(1,), block=(1,))
    assert host(norm)[0] == 3.0


@pytest.mark.parametrize("trans_a,trans_b,accumulate", [(False, False, False), (True, False, True),
                                                        (False, True, False), (True, True, True)])
def test_gemm_on_numpy(trans_a, trans_b, accumulate):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 3) if trans_a else (3, 5))
    b = rng.standard_normal((4, 5) if trans_b else (5, 4))
    c0 = rng.standard_normal((3, 4))
    c = device(c0.copy())
    blas.gemm(device(a), device(b), c, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate)
    want = (a.T if trans_a else a) @ (b.T if trans_b else b) + (c0 if accumulate else 0)
    np.testing.assert_allclose(host(c), want, rtol=1e-12)
    with pytest.raises(ValueError, match="does not give c"):
        blas.gemm(device(a), device(b), device(np.zeros((4, 4))), trans_a=trans_a, trans_b=trans_b)


class ColumnMajorBlas:
    """A stand-in libcublas: cublasGemmEx computes, on host memory, the column-major product its arguments ask for
    (C = alpha op(A) op(B) + beta C, leading dimensions as given), and the handle's calls are recorded."""

    def __init__(self):
        self.calls = []

    def cublasCreate_v2(self, handle):
        return 0

    def cublasDestroy_v2(self, handle):
        return 0

    def cublasSetStream_v2(self, handle, stream):
        self.calls.append(("stream", stream.value))
        return 0

    def cublasSetWorkspace_v2(self, handle, pointer, size):
        self.calls.append(("workspace", size.value))
        return 0

    def cublasGemmEx(self, handle, transa, transb, m, n, k, alpha, A, atype, lda, B, btype, ldb, beta, C, ctype, ldc,
                     compute, algo):
        dtype, scalar = (np.float32, ctypes.c_float) if atype == blas.CUDA_R_32F else (np.float64, ctypes.c_double)
        self.calls.append(("gemm", compute, algo))
        def read(p, rows, cols, ld):  # the column-major (rows, cols) matrix at p, leading dimension ld
            memory = (ctypes.c_byte * (ld * cols * np.dtype(dtype).itemsize)).from_address(p.value)
            return np.ctypeslib.as_array(memory).view(dtype).reshape(cols, ld)[:, :rows].T
        op = lambda x, t: x.T if t == blas.OP_T else x  # noqa: E731
        a = op(read(A, *((k, m) if transa == blas.OP_T else (m, k)), lda), transa)
        b = op(read(B, *((n, k) if transb == blas.OP_T else (k, n)), ldb), transb)
        c = read(C, m, n, ldc)
        alpha_v = ctypes.cast(alpha, ctypes.POINTER(scalar)).contents.value
        beta_v = ctypes.cast(beta, ctypes.POINTER(scalar)).contents.value
        c[...] = alpha_v * (a @ b) + beta_v * c
        return 0


@pytest.mark.skipif(backend.device != "cpu", reason="the stand-in library reads host memory")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a,trans_b,accumulate", [(False, False, False), (True, False, True),
                                                        (False, True, False), (True, True, True)])
def test_the_cublas_binding_asks_for_the_row_major_product(monkeypatch, dtype, trans_a, trans_b, accumulate):
    """The binding's column-major call (transposes, m, n, k, leading dimensions, alpha and beta) computes c = op(a) @
    op(b) (+ c), as a library that takes the call literally computes it; float32 in float32 (COMPUTE_32F)."""
    library = ColumnMajorBlas()
    binding = blas.Cublas(library, workspace=np.zeros(64, np.uint8))
    monkeypatch.setattr(blas.Cublas, "current_stream", staticmethod(lambda: 1234))
    rng = np.random.default_rng(1)
    a = rng.standard_normal((7, 3) if trans_a else (3, 7)).astype(dtype)
    b = rng.standard_normal((5, 7) if trans_b else (7, 5)).astype(dtype)
    c0 = rng.standard_normal((3, 5)).astype(dtype)
    c = c0.copy()
    with program.record() as recorded:
        binding.gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate)
    assert library.calls == [] and np.array_equal(c, c0)  # bound, not run
    recorded.run()
    want = (a.T if trans_a else a).astype(np.float64) @ (b.T if trans_b else b) + (c0 if accumulate else 0)
    np.testing.assert_allclose(c, want, rtol=1e-5 if dtype == np.float32 else 1e-12)
    compute = blas.COMPUTE_32F if dtype == np.float32 else blas.COMPUTE_64F
    # a stream set puts cuBLAS back on its own workspace: the binding's is set again after it
    assert library.calls == [("stream", 1234), ("workspace", 64), ("gemm", compute, blas.GEMM_DEFAULT)]
    recorded.run()  # the same stream: neither set again
    assert library.calls[3:] == [("gemm", compute, blas.GEMM_DEFAULT)]


def test_a_nets_passes_are_recorded_once():
    net = tiny_resnet(classes=3).compile(pass_images=4, bits=4, seed=1)
    x, y = device(np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)), np.array([0, 1, 2, 0])
    net.forward(x, y)
    first = net.program("forward", 4)
    net.forward(x, y)
    assert net.program("forward", 4) is first and len(first) > 0
    net.compile(pass_images=4, bits=4)
    assert net.program("forward", 4) is not first  # a compile binds new buffers: the passes are recorded anew
    with pytest.raises(ValueError, match="a pass is one of forward, evaluate, loss, backward"):
        net.program("sideways", 4)
