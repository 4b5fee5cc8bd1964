"""The kernel loader: signatures, argument checks, launch shapes, GPU builds. (The CPU's g++ builds, their compiler
errors and their cache: tests/test_build.py.)"""
import numpy as np
import pytest

from minibp import backend, kernels
from conftest import device, host
from quant_kernels import QUANT_CU

# The package's kernel files, and the tests' own (quant.cu, a path: the loader takes either)
KERNEL_FILES = sorted(p.name for p in kernels.KERNEL_DIR.glob("*.cu")) + [QUANT_CU]


def test_every_kernel_file_is_found():
    assert {"bn.cu", "conv_direct.cu", "pool.cu", "sgd.cu"} <= set(KERNEL_FILES)
    assert "quant.cu" not in KERNEL_FILES  # the store's stand-alone kernels are the tests', not the package's


@pytest.mark.slow
@pytest.mark.parametrize("filename", KERNEL_FILES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_compiles_for_sm90_with_nvrtc(filename, dtype):
    """Every kernel file builds for the H200 (sm_90) with the GPU path's NVRTC and options."""
    cubin = kernels.compile_cubin(filename, dtype=dtype, arch="sm_90")
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 500


@pytest.mark.parametrize("filename", KERNEL_FILES, ids=str)
def test_kernel_file_loads_for_both_real_types(filename):
    for dtype in (np.float32, np.float64):
        module = kernels.load(filename, dtype)
        assert module.kernels, filename


def test_signature_parsing():
    source = 'extern "C" __global__ void k(long long n, const real_t* __restrict__ x, unsigned char* y, float s) {}'
    [(name, params)] = kernels.parse_signatures(source, np.float64)
    assert name == "k"
    assert [(p.name, p.dtype, p.is_pointer, p.is_const) for p in params] == [
        ("n", np.int64, False, False), ("x", np.float64, True, True), ("y", np.uint8, True, False),
        ("s", np.float32, False, False)]
    with pytest.raises(kernels.KernelError, match="short"):
        kernels.parse_signatures('extern "C" __global__ void k(short n) {}', np.float32)


@pytest.fixture
def quant_module():
    return kernels.load(QUANT_CU, np.float32)


def _quantize_args(n_bytes=8):
    v = device(np.linspace(-3, 3, 2 * n_bytes, dtype=np.float32))
    return dict(n_bytes=n_bytes, C=2, bits=4, v=v, window=device(np.zeros((3, 2), np.float32)),
                codes=device(np.zeros(n_bytes, np.uint8)))


@pytest.mark.parametrize("change,match", [
    (dict(v=None), "missing v"),                                              # a name left out
    (dict(rows=3), "no parameter rows"),                                      # a name it does not have
    (dict(v="float64"), "'v'.*float32"),
    (dict(v="strided"), "C-contiguous"),
    (dict(C=2**40), "does not fit int32"),
    (dict(bits=4.5), "integer"),
    (dict(v=[0.0] * 16), "array"),
])
def test_arguments_are_checked_by_name_before_launch(quant_module, change, match):
    args = _quantize_args()
    for name, value in change.items():
        if value is None:
            del args[name]
        elif value == "float64":
            args[name] = args[name].astype(np.float64)
        elif value == "strided":
            args[name] = device(np.zeros((32, 2), np.float32))[:, 0]
        else:
            args[name] = value
    with pytest.raises(ValueError, match=match):
        quant_module.quantize(**args, threads=8)


def test_launches_need_names_and_a_shape(quant_module):
    args = _quantize_args()
    with pytest.raises(TypeError, match="by name"):
        quant_module.quantize(*args.values(), threads=8)
    with pytest.raises(ValueError, match="threads= or"):
        quant_module.quantize(**args)
    with pytest.raises(ValueError, match="1 to 3 positive"):
        quant_module.quantize(**args, grid=(0,), block=(1,))


def test_swapped_sizes_are_caught_by_name(quant_module):
    """A call that swaps two values still names each: the one that no longer fits its parameter is named."""
    args = _quantize_args()
    args["C"], args["codes"] = args["codes"], args["C"]
    with pytest.raises(ValueError, match="argument 'C'.*scalar|argument 'codes'"):
        quant_module.quantize(**args, threads=8)


@pytest.mark.skipif(backend.device != "cpu", reason="NumPy arrays carry the writeable flag")
def test_read_only_output_is_refused(quant_module):
    args = _quantize_args()
    args["codes"].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        quant_module.quantize(**args, threads=8)


@pytest.mark.parametrize("grid,block", [((1,), (1,)), ((3,), (7,)), ((1,), (1000,)), ((4096,), (256,)),
                                        ((2, 3, 5), (2, 3, 4))])
def test_any_launch_shape_gives_the_same_result(quant_module, grid, block):
    if backend.device == "gpu" and np.prod(block) > kernels.BLOCK:  # minibp launches at most BLOCK threads a block
        pytest.skip("over 256 threads a block: this kernel's registers do not fit 1000 threads on an H200 "
                    "(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES), and minibp never launches more than 256")
    rng = np.random.default_rng(1)
    v = rng.standard_normal((333, 6)).astype(np.float32) * 2
    from minibp.quant import quantize_ref, window_ref
    window = window_ref(np.zeros(6, np.float32), bits=4, kind="range", lo=v.min(axis=0), hi=v.max(axis=0))
    codes = device(np.zeros(v.size // 2, np.uint8))
    quant_module.quantize(n_bytes=v.size // 2, C=6, bits=4, v=device(v), window=device(window), codes=codes,
                          grid=grid, block=block)
    assert np.array_equal(host(codes), quantize_ref(v, window, bits=4))


def test_missing_kernel_file_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no kernel source"):
        kernels.load("no_such_file.cu")
