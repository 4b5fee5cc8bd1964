"""GEMM, the one matrix product minibp issues (the convolutions' GEMM path and the classifier), as a device call.

    blas.gemm(a, b, c)                                  c = a @ b          (row-major 2-D arrays)
    blas.gemm(a, b, c, trans_a=True, accumulate=True)   c += a.T @ b       (a weight gradient, added in)

On the CPU it is NumPy's matmul (its BLAS). On the GPU it is cuBLAS through a thin binding of minibp's own,
`Cublas`, on the libcublas that CuPy loads (ctypes): its own handle, bound to the stream a step runs on, a
fixed workspace from the arena, float32 products computed in float32 (CUBLAS_COMPUTE_32F: no TF32) and the
scalars alpha and beta as constant host values. That is what a CUDA graph can capture; CuPy's own cuBLAS
wrapper refuses any call while a stream captures (CuPy 14: its setStream raises NotImplementedError), and
nvmath-python's bindings would be a dependency for the three functions used here.

A call goes through program.issue, so a recorded pass holds its GEMMs bound: on the GPU the binding's
arguments (the transposes, sizes and leading dimensions of the column-major call that computes the
row-major product) are worked out once, when the pass is recorded.
"""
import ctypes
import functools

import numpy as np

from . import backend, program


def gemm(a, b, c, *, trans_a=False, trans_b=False, accumulate=False, cublas=None):
    """c (M, N) = op(a) @ op(b), or c += it with accumulate; op transposes where asked (a.T rather than a); a, b, c
    are C-contiguous 2-D arrays of the device's module, of one float dtype. cublas: the Cublas binding a GPU
    computes it through (a net's, with the net's workspace: layers/conv.py), else the process's own."""
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)
    if op_a.ndim != 2 or op_b.ndim != 2 or c.ndim != 2 or op_a.shape[1] != op_b.shape[0] \
            or c.shape != (op_a.shape[0], op_b.shape[1]):
        raise ValueError(f"gemm: {'a.T' if trans_a else 'a'} {op_a.shape} @ {'b.T' if trans_b else 'b'} "
                         f"{op_b.shape} does not give c {c.shape}")
    if not (a.dtype == b.dtype == c.dtype) or c.dtype not in (np.float32, np.float64):
        raise ValueError(f"gemm multiplies float32 or float64 arrays of one dtype, got {a.dtype}, {b.dtype}, {c.dtype}")
    if not (a.flags.c_contiguous and b.flags.c_contiguous and c.flags.c_contiguous):
        raise ValueError("gemm: a, b and c must be C-contiguous (trans_a and trans_b read a and b transposed)")
    if backend.device == "gpu":
        (cublas or default_cublas()).gemm(a, b, c, trans_a=trans_a, trans_b=trans_b, accumulate=accumulate)
    elif accumulate:
        program.issue("gemm", _matmul_add, op_a, op_b, c)
    else:
        program.issue("gemm", np.matmul, op_a, op_b, c)


def _matmul_add(a, b, c):
    """c += a @ b in NumPy, computed as the product whose output has the longer side as rows (OpenBLAS runs these
    thin products up to 2x faster so)."""
    if c.shape[1] > c.shape[0]:
        c += (b.T @ a.T).T
    else:
        c += a @ b


# ----------------------------------------------------------------------------- the GPU: cuBLAS through ctypes

OP_N, OP_T = 0, 1                                      # cublasOperation_t
CUDA_R_32F, CUDA_R_64F = 0, 1                          # cudaDataType
COMPUTE_32F, COMPUTE_64F = 68, 70                      # cublasComputeType_t: no TF32 in float32
GEMM_DEFAULT = -1                                      # cublasGemmAlgo_t
WORKSPACE_BYTES = 32 << 20                             # cuBLAS's advice for Hopper


def column_major_call(a, b, c, *, trans_a, trans_b):
    """The arguments (transa, transb, m, n, k, A, lda, B, ldb, ldc) of the column-major cublasGemmEx that computes
    the row-major c = op(a) @ op(b): column-major, c is c.T (N x M) = op(b).T @ op(a).T, so cuBLAS's first
    operand is b and its second a. A row-major (r, s) array is the column-major (s, r) array x.T with leading
    dimension s: b itself is op(b).T unless trans_b asks for b.T, and then cuBLAS transposes it."""
    M, N = c.shape
    K = a.shape[0] if trans_a else a.shape[1]
    return (OP_T if trans_b else OP_N, OP_T if trans_a else OP_N, N, M, K, b, b.shape[1], a, a.shape[1], N)


class Cublas:
    """minibp's own cuBLAS handle on `library` (libcublas: loaded() finds the one CuPy loaded), with a fixed
    workspace (a device array of bytes: a net's is in its arena); gemm issues cublasGemmEx with constant
    host-pointer alpha and beta. A call runs on CuPy's current stream, as CuPy's own calls do: the handle follows
    it (a captured step's stream, or the default one)."""

    def __init__(self, library, *, workspace):
        self.library, self.workspace = library, workspace
        self.handle = ctypes.c_void_p()
        self._check("cublasCreate_v2", library.cublasCreate_v2(ctypes.byref(self.handle)))
        self.stream = None  # set at the first call: cuBLAS ties a workspace to the stream it was set with
        # alpha, beta as host values that live as long as the handle: a captured call reads them once, at capture
        self._scalars = {np.float32: (ctypes.c_float(1), ctypes.c_float(0)),
                         np.float64: (ctypes.c_double(1), ctypes.c_double(0))}

    def __del__(self):
        try:  # a net's binding goes with its arena (a recompile makes another)
            self.library.cublasDestroy_v2(self.handle)
        except Exception:  # (at the interpreter's exit the library may be gone first)
            pass

    @classmethod
    def loaded(cls, *, workspace):
        """A binding on the libcublas that CuPy loaded (GPU only)."""
        if backend.device != "gpu":
            raise RuntimeError("cuBLAS runs on the GPU only (MINIBP_DEVICE=gpu)")
        return cls(_library(), workspace=workspace)

    def _check(self, name, status):
        if status != 0:
            raise RuntimeError(f"{name} failed: cuBLAS status {status}")

    def gemm(self, a, b, c, *, trans_a, trans_b, accumulate):
        """Issue the cublasGemmEx that computes c = op(a) @ op(b) (+ c): its arguments worked out here, once."""
        transa, transb, m, n, k, A, lda, B, ldb, ldc = column_major_call(a, b, c, trans_a=trans_a, trans_b=trans_b)
        one, zero = self._scalars[c.dtype.type]
        data, compute = (CUDA_R_32F, COMPUTE_32F) if c.dtype == np.float32 else (CUDA_R_64F, COMPUTE_64F)
        arguments = (self.handle, transa, transb, m, n, k, ctypes.byref(one), _pointer(A), data, lda, _pointer(B), data,
                     ldb, ctypes.byref(one if accumulate else zero), _pointer(c), data, ldc, compute, GEMM_DEFAULT)
        program.issue("gemm", self._gemm_ex, *arguments, keep=(A, B, c))

    @staticmethod
    def current_stream():
        return backend.xp.cuda.get_current_stream().ptr

    def _gemm_ex(self, *arguments):
        stream = self.current_stream()
        if stream != self.stream:  # follow CuPy's current stream
            self._check("cublasSetStream_v2", self.library.cublasSetStream_v2(self.handle, ctypes.c_void_p(stream)))
            if self.workspace is not None:  # (setting a stream puts cuBLAS back on its own workspace pool)
                self._check("cublasSetWorkspace_v2", self.library.cublasSetWorkspace_v2(
                    self.handle, _pointer(self.workspace), ctypes.c_size_t(self.workspace.nbytes)))
            self.stream = stream
        self._check("cublasGemmEx", self.library.cublasGemmEx(*arguments))


def _pointer(array):
    """A device array's address (a host array's, for the tests of the binding's arguments on the CPU)."""
    return ctypes.c_void_p(array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr)


@functools.lru_cache(maxsize=None)
def default_cublas():
    """The process's own binding, for GEMMs outside a net (tests, benchmarks), with a workspace of its own."""
    return Cublas.loaded(workspace=backend.xp.empty(WORKSPACE_BYTES, np.uint8))


@functools.lru_cache(maxsize=None)
def _library():
    """ctypes' handle on the libcublas this process loaded through CuPy."""
    return ctypes.CDLL(_loaded_library("libcublas.so", load=backend.xp.cuda.device.get_cublas_handle))


def _loaded_library(name, *, load):
    """The path of the shared library `name` this process has loaded (after load(), which makes CuPy load it)."""
    load()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if path.rsplit("/", 1)[-1].startswith(name):
                return path
    raise RuntimeError(f"CuPy loaded no {name}: minibp binds the cuBLAS that CuPy uses")
