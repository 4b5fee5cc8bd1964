#!/usr/bin/env bash
# The GPU check, prepared to run in one call on a machine with one H200 and no network, within
# 10 minutes. Parts (all by default, in this order; name some to run those, in the order named):
#   smoke    the device, CuPy, cuDNN's frontend; one 4-bit training step of a small net
#   tests    the suite on CuPy in 14 processes (pytest-xdist), less test_hosts.py (it needs network
#            namespaces): tests/test_gpu.py (GPU vs CPU losses, cuDNN vs GEMM, no host synchronisation,
#            the pool against the plan), test_step.py (graph vs eager) and every kernel and layer on CuPy
#   cudnn    cuDNN against GEMM gradients twice: as is, and with TF32 off (NVIDIA_TF32_OVERRIDE=0), to
#            tell whether TF32 is why they differed on the first H200 (docs/gpu.md)
#   bench    bench/gpu.py: ResNet-164 and ResNet-1001 at batch 128, exact/8/4, eager and graph
#            ($STEPS), GEMM convolutions, PyTorch's exact step beside them; ResNet-164 with cuDNN's
# Each part has its own time limit and goes on after a failure; logs go to ${OUT:-bench/results}/
# (gpu_check.log: everything but the tests' lines; gpu_tests.log: those; gpu_failures.log: each failing
# test's report as it fails, kept when the time limit cuts the suite off). Installs nothing from the
# network: wheels carried in .whl/ (the cuDNN frontend) are installed from there if present, and minibp
# itself editable (pip install -e ., as the README's venv has it). Budgets: $TESTS_SECONDS, $BENCH_SECONDS.
#
#   bash bench/gpu_check.sh                 # everything
#   bash bench/gpu_check.sh smoke tests     # some parts
set -uo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-bench/results}
mkdir -p "$results"
log="$results/gpu_check.log"
parts=${*:-smoke cudnn tests bench}
export MINIBP_DEVICE=gpu PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
# The GPU machines run commands as root, which OpenMPI's mpirun refuses unless told (the MPI tests start it).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Some tests run scripts from other folders: minibp must import there too (offline: no build isolation).
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
    echo "minibp could not be installed (pip install -e .): tests that run scripts from other folders will fail"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
smoke() {
    echo "== smoke"
    timeout 120 python3 - <<'EOF'
import time, numpy as np, cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion())
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version())
except Exception as e:
    print("cudnn frontend: not usable:", type(e).__name__, e)
from minibp import backend, models
from minibp.optim import SGD
print("minibp device", backend.device)
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 16, 16, 3)).astype(np.float32); y = rng.integers(0, 10, 16)
net = models.preact_resnet(20, input_shape=(16, 16, 3)).compile(batch=16, bits="4", seed=0)
opt = SGD(net)
start = time.perf_counter()
for i in range(3):
    net.zero_grad(); loss = net.forward(x, y)[0]; net.backward(); opt.step(lr=0.05)
    print(f"step {i}: loss {loss:.5f}")
print(f"3 steps in {time.perf_counter() - start:.2f} s (kernels compiled in the first)")
EOF
    echo "== smoke exit $?"
}
tests() {
    echo "== tests on the GPU (log: gpu_tests.log)"
    FAILURES_LOG="$results/gpu_failures.log" PYTHONPATH="$PYTHONPATH:$PWD/bench" timeout ${TESTS_SECONDS:-220} \
        python3 -m pytest -q -p no:cacheprovider -p pytest_failures -n 14 --dist loadfile --timeout 150 -rfE \
        tests --ignore=tests/test_hosts.py > "$results/gpu_tests.log" 2>&1
    echo "== tests exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$results/gpu_tests.log" | tail -5
    grep "^==== " "$results/gpu_failures.log" 2>/dev/null | sed 's/^==== //' | cut -c1-150
}
cudnn() {
    for tf32 in "" 0; do
        echo "== cuDNN against GEMM, NVIDIA_TF32_OVERRIDE=${tf32:-unset}"
        env ${tf32:+NVIDIA_TF32_OVERRIDE=$tf32} timeout 120 python3 -m pytest -q -p no:cacheprovider \
            tests/test_gpu.py::test_cudnn_and_gemm_convolutions_agree 2>&1 | grep -E "^E |passed|failed" | head -5
    done
}
bench() {
    echo "== bench/gpu.py (GEMM convolutions; eager and graph)"
    timeout ${BENCH_SECONDS:-180} python3 bench/gpu.py --rounds 3 --stores ${STORES:-exact,8,4} --steps ${STEPS:-eager,graph} --pytorch --profile 15
    echo "== bench exit $?"
    echo "== bench/gpu.py (cuDNN convolutions)"
    timeout 60 python3 bench/gpu.py --rounds 3 --models resnet164 --conv cudnn --steps ${STEPS:-eager,graph}
    echo "== bench exit $?"
}
{
    echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
    echo "== parts: $parts; $(python3 --version); $(nproc) cores"
    for name in $parts; do
        case $name in smoke|cudnn|tests|bench) $name ;; *) echo "no part $name (smoke, cudnn, tests, bench)" ;; esac
    done
} 2>&1 | tee -a "$log"
