"""Conv2D's ways of computing against the NumPy im2col reference, to float32 rounding: conv_direct.cu's
direct kernels (the CPU's fast path, conv_direct.py) on every CPU target and on aarch64, and the chunked im2col
path, odd shapes included; the workspace each needs; and OpenBLAS's idle threads, which would take the cores
from the direct kernels. (bench/versus_pytorch.py: tests/test_bench.py.)"""
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest

from minibp import backend, build, constants, kernels, layers
from minibp.layers import conv_direct
from conftest import device, host

from runs import ROOT
CASES = [  # (H, W, Cin, Cout, kernel, stride, padding): odd sizes, channels off the 16-lane blocks
    (5, 7, 3, 16, 3, 1, "same"), (6, 6, 16, 32, 3, 2, "same"), (7, 5, 20, 5, 3, 2, "valid"),
    (9, 9, 17, 40, 5, 1, "same"), (8, 6, 6, 24, 5, 1, "valid"), (6, 6, 16, 16, 1, 1, "same"),
    (7, 7, 24, 9, 1, 2, "same"), (11, 3, 32, 48, 3, 1, "same"), (4, 4, 3, 16, 2, 2, "same"),
    (2, 3, 4100, 5, 1, 1, "same"),  # more input channels than conv_direct.cu's row of zeros: its plain loop
]


def reference(conv, x, w, dy):
    """(y, dw, dx, |terms| bounds of each) in float64 from the im2col reference."""
    geometry = (conv.kh, conv.kw, conv.stride, conv.pad_top, conv.pad_left, conv.Ho, conv.Wo)
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    col, w2, dy2 = layers.im2col_ref(x, *geometry), w.reshape(conv.cout, -1), dy.reshape(-1, conv.cout)
    y, dw, dx = col @ w2.T, dy2.T @ col, layers.col2im_ref(dy2 @ w2, x.shape, *geometry)
    bounds = ((np.abs(col) @ np.abs(w2).T).reshape(dy.shape), (np.abs(dy2).T @ np.abs(col)).reshape(w.shape),
              layers.col2im_ref(np.abs(dy2) @ np.abs(w2), x.shape, *geometry))
    return (y.reshape(dy.shape), dw.reshape(w.shape), dx), bounds


def assert_float32_close(got, want, bound, name):
    """|got - want| within float32 rounding of a sum: 1e-5 (84 float32 ulps) of the sum of |terms|."""
    err = np.abs(host(got).astype(np.float64) - want)
    assert np.all(err <= 1e-5 * bound + 1e-30), f"{name}: error {err.max():.3g} beyond float32 rounding"


def run_conv(conv, x, w, bias, dy, *, n=2, col_values=None):
    """Conv2D forward and backward in float32 with a workspace of exactly workspace_shape's size."""
    col = device(np.zeros(col_values or int(np.prod(conv.workspace_shape(n, accumulate_dx=True))) or 1,
                          np.float32))
    y = device(np.full((n,) + conv.out_shape, np.nan, np.float32))
    conv.forward(device(x), device(w), device(bias), y, col=col)
    dw, db = device(np.ones(conv.weight_shape, np.float32)), device(np.zeros(conv.cout, np.float32))
    dx = device(np.full(x.shape, np.nan, np.float32))
    conv.backward(device(x), device(w), device(dy), dw=dw, dbias=db, dx=dx, col=col)
    dx_added = device(np.ones(x.shape, np.float32))
    conv.backward(device(x), device(w), device(dy), dw=device(np.zeros(conv.weight_shape, np.float32)),
                  dbias=device(np.zeros(conv.cout, np.float32)), dx=dx_added, accumulate_dx=True, col=col)
    return y, dw, db, dx, dx_added


def conv_on(path, *args, **kwargs):
    """A Conv2D computing through conv_direct.DirectPath if path is "direct", else through its own GemmPath."""
    if path == "direct" and backend.device != "cpu":
        pytest.skip("the direct kernels are the CPU's path (Net.compile refuses them elsewhere)")
    conv = layers.Conv2D(*args, **kwargs)
    return conv.use(conv_direct.DirectPath(conv)) if path == "direct" else conv


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("path", ["direct", "im2col chunks"])
def test_conv_equals_the_im2col_reference_to_float32_rounding(rng, monkeypatch, case, path):
    """Forward, weight gradient (added to what dw holds), bias gradient, data gradient (written, and
    added with accumulate_dx). 'im2col chunks': 3 images of at most 2 a chunk."""
    H, W, cin, cout, k, s, padding = case
    if path != "direct":
        monkeypatch.setattr(layers.conv, "COL_ELEMENTS", 2 * H * W * k * k * cin)
    conv = conv_on(path, (H, W, cin), cout, kernel=k, stride=s, padding=padding, bias=True)
    n = 3
    x = rng.standard_normal((n, H, W, cin)).astype(np.float32)
    w = rng.standard_normal(conv.weight_shape).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    dy = rng.standard_normal((n,) + conv.out_shape).astype(np.float32)
    (y_ref, dw_ref, dx_ref), (y_bound, dw_bound, dx_bound) = reference(conv, x, w, dy)
    y, dw, db, dx, dx_added = run_conv(conv, x, w, bias, dy, n=n)
    assert_float32_close(y, y_ref + bias, y_bound + np.abs(bias), "y")
    assert_float32_close(dw, dw_ref + 1, dw_bound + 1, "dw")
    assert_float32_close(db, dy.astype(np.float64).sum(axis=(0, 1, 2)), np.abs(dy).sum(axis=(0, 1, 2)), "dbias")
    assert_float32_close(dx, dx_ref, dx_bound, "dx")
    assert_float32_close(dx_added, dx_ref + 1, dx_bound + 1, "dx with accumulate_dx")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("images_per_chunk", [1, 2])
def test_direct_kernels_equal_the_reference_for_both_real_types(rng, case, dtype, images_per_chunk):
    """conv_direct (tiles of 1 and 2 vectors, written and accumulated) and conv_weight_grad (tasks of 1 and 2
    vectors; 1x1 and "same" shapes join rows and images into runs), called directly: float64 runs the kernels'
    plain loops, float32 the vector ones of this CPU's target."""
    H, W, cin, cout, k, s, padding = case
    conv = layers.Conv2D((H, W, cin), cout, kernel=k, stride=s, padding=padding)
    n = 3
    x = rng.standard_normal((n, H, W, cin))
    w = rng.standard_normal(conv.weight_shape)
    dy = rng.standard_normal((n,) + conv.out_shape)
    (y_ref, dw_ref, _), (y_bound, dw_bound, _) = reference(conv, x, w, dy)
    tolerance = 1e-5 if dtype == np.float32 else 1e-13
    module = kernels.load("conv_direct.cu", dtype)
    shape = dict(N=n, H=H, W=W, C=cin, kh=k, kw=k, stride=s, pad_top=conv.pad_top, pad_left=conv.pad_left,
                 Ho=conv.Ho, Wo=conv.Wo, Cout=cout)
    wt = device(np.ascontiguousarray(w.reshape(cout, -1).T).astype(dtype))
    for vectors in (1, 2):
        for accumulate in (False, True):
            y = device(np.full(dy.shape, 2.0 if accumulate else np.nan, dtype))
            module.conv_direct(**shape, dilation=1, vectors=vectors, accumulate=accumulate, flipped=False,
                               x=device(x.astype(dtype)), wt=wt, y=y, grid=(5,), block=(3,))
            err = np.abs(host(y) - (y_ref + 2 * accumulate))
            assert np.all(err <= tolerance * (y_bound + 2)), (vectors, accumulate, err.max())
    chunks = -(-n // images_per_chunk)
    for vectors in (1, 2):
        partial = device(np.full((chunks, k * k * cin, cout), np.nan, dtype))
        module.conv_weight_grad(**shape, vectors=vectors, images_per_chunk=images_per_chunk, x=device(x.astype(dtype)),
                                dy=device(dy.astype(dtype)), partial=partial, grid=(4,), block=(2,))
        dw = host(partial).sum(axis=0).T.reshape(w.shape)
        assert np.all(np.abs(dw - dw_ref) <= tolerance * dw_bound), (vectors, np.abs(dw - dw_ref).max())


@pytest.fixture
def cpu_target(monkeypatch):
    """Builds the kernels for the CPU target it is called with (MINIBP_CPU_TARGET), then for this CPU's
    own again: the target, the loaded modules and the direct kernels' geometry are cached per process."""
    def use(target):
        monkeypatch.setenv("MINIBP_CPU_TARGET", target)
        for cache in (build.cpu_target, kernels.load, conv_direct.geometry):
            cache.cache_clear()
    yield use
    monkeypatch.delenv("MINIBP_CPU_TARGET", raising=False)  # (a test skipped before use() set it)
    for cache in (build.cpu_target, kernels.load, conv_direct.geometry):
        cache.cache_clear()


@pytest.mark.slow
def test_every_cpu_target_computes_the_same_convolutions(rng, cpu_target):
    """One source, every vector width this CPU runs (AVX-512's 16 floats, AVX2's 8, SSE's 4): each agrees
    with the reference to float32 rounding, and those with fused multiply-adds (AVX-512, AVX2) agree bit
    for bit, as do those without (SSE4, x86-64): every output sums the same products in the same order."""
    if backend.device != "cpu":
        pytest.skip("CPU targets")
    targets = build.usable_cpu_targets()
    cases = [(9, 9, 17, 40, 3, 1, "same"), (8, 8, 16, 32, 3, 2, "same"), (6, 6, 64, 10, 1, 1, "same")]
    data = []
    for H, W, cin, cout, k, s, padding in cases:
        conv = conv_on("direct", (H, W, cin), cout, kernel=k, stride=s, padding=padding)
        x = rng.standard_normal((3, H, W, cin)).astype(np.float32)
        w = rng.standard_normal(conv.weight_shape).astype(np.float32)
        dy = rng.standard_normal((3,) + conv.out_shape).astype(np.float32)
        data.append((conv, x, w, dy, *reference(conv, x, w, dy)))
    results = {}
    for target in targets:
        cpu_target(target)
        assert conv_direct.path() == f"direct, {target} ({conv_direct.geometry().lanes} floats a vector)"
        results[target] = []
        for conv, x, w, dy, (y_ref, dw_ref, dx_ref), (y_bound, dw_bound, dx_bound) in data:
            y, dw, _, dx, _ = run_conv(conv, x, w, np.zeros(conv.cout, np.float32), dy, n=3)
            for got, want, bound, name in ((y, y_ref, y_bound, "y"), (dw, dw_ref + 1, dw_bound + 1, "dw"),
                                           (dx, dx_ref, dx_bound, "dx")):
                assert_float32_close(got, want, bound, f"{target} {name}")
                results[target].append(host(got))
    for group in ({"avx512", "avx2"}, {"sse4", "x86-64"}):
        ran = [t for t in targets if t in group]
        for other in ran[1:]:
            assert all(np.array_equal(a, b) for a, b in zip(results[ran[0]], results[other])), (ran[0], other)


def test_the_cpu_workspace_is_a_chunk_and_the_gpu_one_the_whole_pass(monkeypatch):
    """ResNet-164's convs at passes of 128 images: on the CPU at most COL_ELEMENTS values each (the im2col matrix
    of its largest 3x3 conv is 18.9 M); on the GPU the whole pass's im2col matrix, one GEMM, as before."""
    from minibp import models
    convs = [u.conv for u in models.preact_resnet(164).units]
    monkeypatch.setattr(backend, "device", "cpu")  # workspace_shape only asks which device (no arrays here)
    assert max(int(np.prod(c.workspace_shape(128, accumulate_dx=True))) for c in convs) <= layers.COL_ELEMENTS
    monkeypatch.setattr(backend, "device", "gpu")
    for c in convs:
        assert c.workspace_shape(128) == ((0, 0) if c.is_pointwise else (128 * c.Ho * c.Wo, c.kh * c.kw * c.cin))


@pytest.mark.parametrize("path", ["direct", "gemm"])
def test_a_workspace_smaller_than_planned_is_a_clear_error(rng, path):
    conv = conv_on(path, (6, 6, 4), 16, kernel=3, stride=2)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal(conv.weight_shape).astype(np.float32)
    dy = rng.standard_normal((2,) + conv.out_shape).astype(np.float32)
    planned = int(np.prod(conv.workspace_shape(2, accumulate_dx=True)))
    run_conv(conv, x, w, np.zeros(16, np.float32), dy, col_values=planned)  # exactly what was planned
    with pytest.raises(ValueError, match=r"the conv workspace col holds 1 values, this 3x3 conv needs \d+"):
        run_conv(conv, x, w, np.zeros(16, np.float32), dy, col_values=1)


@pytest.mark.slow
@pytest.mark.parametrize("given, expected", [(None, "4"), ("20", "20")])
def test_minibp_makes_openblas_threads_sleep_at_once_unless_told_otherwise(given, expected):
    """The im2col path's GEMMs on the CPU: OpenBLAS's idle threads would spin for 2^28 cycles and take the
    cores from the OpenMP kernels (bench/threads.py: a 3x slower step). Importing minibp before NumPy
    sets OpenBLAS's wait to 2^4 cycles; a value the user set is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if given is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = given
    done = subprocess.run([sys.executable, "-c",
                           "import minibp, numpy, os; print(os.environ['OPENBLAS_THREAD_TIMEOUT'])"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == expected, done.stderr


@pytest.mark.slow
def test_the_direct_kernels_build_and_agree_on_aarch64(tmp_path):
    """An aarch64 CPU takes the same source with NEON's 4-float vectors: tests/native/conv_direct_check.cpp
    (the vector kernels against their plain loops in double) cross-compiled with the neon target's flags and
    run under qemu. On an aarch64 machine the tests above run the same kernels natively."""
    compiler, emulator = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64-static")
    if compiler is None or emulator is None:
        pytest.skip("needs aarch64-linux-gnu-g++ and qemu-aarch64-static (apt-get install g++-aarch64-linux-gnu "
                    "qemu-user-static; .ci/run installs them)")
    flags = build.CPU_TARGETS["aarch64"]["neon"][1]
    built = subprocess.run([compiler, *build.CPU_ARITHMETIC, "-O2", *flags, "-fopenmp", "-static",
                            "-Dreal_t=float", *constants.defines(), f"-I{kernels.KERNEL_DIR}",  # as every build
                            str(ROOT / "tests" / "native" / "conv_direct_check.cpp"), "-o", str(tmp_path / "check")],
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    done = subprocess.run([emulator, str(tmp_path / "check")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.splitlines() == [
        "lanes 4, tile 12 pixels x 1 vector or 6 x 2, weight-gradient task 12 inputs x 1 vector or 6 x 2",
        "ok"], done.stdout + done.stderr


# ----------------------------------------------------------------------------- ConvPath: each conv's path in a net

def paths(net):
    """The class name of each conv's path, in the net's order."""
    return [type(c.path).__name__ for u in net.units for c in u.convs()]


def test_compile_gives_each_conv_its_path_and_refuses_direct_where_it_cannot_run():
    """"auto" is the direct kernels on the CPU in float32, GEMM elsewhere; a refused compile changes nothing."""
    from nets import small_net
    net = small_net()
    with pytest.raises(ValueError, match="conv must be one of 'auto', 'gemm', 'direct', 'cudnn', 'cudnn-tf32', got "
                                         "'fast'"):
        net.compile(pass_images=2, conv="fast")
    for kind, path in (("gemm", "GemmPath"), ("auto", "DirectPath" if backend.device == "cpu" else "GemmPath")):
        net.compile(pass_images=2, conv=kind)
        assert net.conv_path.kind == kind and not net.conv_path.graphs and set(paths(net)) == {path}
        assert "cudnn_workspace" not in net.arena.plan and "cudnn_dw" not in net.arena.plan
    double = small_net(dtype=np.float64).compile(pass_images=2)
    assert set(paths(double)) == {"GemmPath"}
    for refused in [double] + ([net] if backend.device == "gpu" else []):
        before = paths(refused)
        with pytest.raises(ValueError, match=f"conv='direct' runs on the CPU in float32 only, not on the "
                                             f"{backend.device} in {np.dtype(refused.dtype).name}"):
            refused.compile(pass_images=2, conv="direct")
        assert paths(refused) == before


def test_auto_is_direct_bit_for_bit_on_the_cpu_and_gemm_agrees():
    from nets import small_net, tiny_batch
    if backend.device != "cpu":
        pytest.skip("the direct kernels run on the CPU")
    net, (x, y) = small_net(), tiny_batch(np.random.default_rng(0), n=2)
    results = {}
    for kind in ("direct", "auto", "gemm"):
        net.compile(pass_images=2, conv=kind)
        net.initialize(seed=0)
        loss, _ = net.forward(x, y)
        net.backward()
        results[kind] = loss, host(net.grads).copy()
    assert results["auto"][0] == results["direct"][0] and np.array_equal(results["auto"][1], results["direct"][1])
    assert abs(results["gemm"][0] - results["direct"][0]) < 1e-5
    assert np.abs(results["gemm"][1] - results["direct"][1]).max() < 1e-4 * np.abs(results["direct"][1]).max()


def test_a_cudnn_path_plans_its_buffers_attaches_its_convs_and_warns_on_another_pass_size(monkeypatch):
    """The cuDNN path's wiring, with stand-ins for the graphs (building real ones needs a GPU)."""
    from types import SimpleNamespace

    from minibp.layers import conv_cudnn
    from nets import small_net
    net = small_net()
    nothing = lambda *args, **kwargs: None  # noqa: E731  (the graphs' executes: a compile records them)
    monkeypatch.setattr(conv_cudnn, "net_graphs", lambda units, *, pass_images, dtype, tf32: {
        c: SimpleNamespace(workspace_bytes=1000 + i, pass_images=pass_images, forward=nothing, backward_data=nothing,
                           backward_weights=nothing)
        for i, c in enumerate(c for u in units if not u.is_classifier for c in u.convs())})
    net.compile(pass_images=4, conv="cudnn")
    plan = net.arena.plan
    assert plan["cudnn_workspace"].shape == (1000 + len(net.conv_path.graphs) - 1,)
    assert plan["cudnn_dw"].shape == (max(int(np.prod(c.weight_shape)) for c in net.conv_path.graphs),)
    for conv in [c for u in net.units for c in u.convs()]:
        assert isinstance(conv.path, conv_cudnn.CudnnPath) == (conv in net.conv_path.graphs)
    assert not isinstance(net.units[-1].conv.path, conv_cudnn.CudnnPath)  # the classifier keeps "auto"'s path
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        net.conv_path.check_pass(4)
    with pytest.warns(UserWarning, match="built for passes of 4 images: a pass of 3 runs through GEMM"):
        net.conv_path.check_pass(3)
