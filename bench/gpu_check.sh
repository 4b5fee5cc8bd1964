#!/usr/bin/env bash
# The GPU check, prepared to run in one call of at most 10 minutes on a machine with one H100 or H200 and no
# network (docs/gpu.md says what it found). Parts, all by default in this order; name some to run those:
#   smoke   the device, CuPy, cuDNN's frontend; a replayed (CUDA graph) 4-bit step of a small net
#   tests   the suite on CuPy in 14 processes (pytest-xdist), less test_hosts.py (network namespaces): every kernel
#           and layer on CuPy against the NumPy references, tests/test_gpu.py (20 steps against the CPU, cuDNN
#           against GEMM exact and 4-bit, the pool against the plan), tests/test_step.py (the replayed step
#           against the eager one); every skip listed with its reason
#   bench   bench/gpu.py --pytorch --parity: ResNet-164 and ResNet-1001 at batch 128, exact and 4 bits replayed,
#           4 bits eager, 4 bits through cuDNN; PyTorch's exact step with TF32 allowed and off; the replayed step
#           against the eager one, bit for bit
#   fit     bench/gpu.py --fit 11GiB: the paper's GPU, ResNet-1001's largest batch at 4 bits and exact, run, and
#           PyTorch's
#   memory  python3 -m minibp.train --memory 11GiB: ResNet-1001 at batch 128 on random CIFAR-shaped data, 3 steps: the
#           mix solved for the device's pool, its calibration, and the pool's bytes against the budget
#   dist    2 ranks on the one GPU (NCCL through CuPy, OpenMPI's root switches) against --sub-batches 2 (only when
#           named: time allowing)
# Each part has its own time limit ($SMOKE_SECONDS, $TESTS_SECONDS, $BENCH_SECONDS, $FIT_SECONDS, $MEMORY_SECONDS)
# and the next goes on after a failure; logs go to ${OUT:-bench/results}/ (gpu_check.log: all but the tests' lines;
# gpu_tests.log: those; gpu_failures.log: each failing test's report as it fails). Installs nothing from the network:
# wheels carried in .whl/ (the cuDNN frontend) go to /tmp/site, and minibp itself is installed editable.
#
#   bash bench/gpu_check.sh                 # smoke tests bench fit memory: about 10 minutes
#   bash bench/gpu_check.sh smoke bench     # some parts
set -uo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-bench/results}
mkdir -p "$results"
log="$results/gpu_check.log"
parts=${*:-smoke tests bench fit memory}
export MINIBP_DEVICE=gpu PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
# The GPU machines run commands as root, which OpenMPI's mpirun refuses unless told (the MPI tests start it).
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 ||
    echo "minibp could not be installed (pip install -e .): tests that run scripts from other folders will fail"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
smoke() {
    echo "== smoke"
    timeout "${SMOKE_SECONDS:-45}" python3 - <<'EOF'
import time, numpy as np, cupy
print("cupy", cupy.__version__, "CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion())
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version())
except Exception as e:
    print("cudnn frontend: not usable:", type(e).__name__, e)
from minibp import backend, models, step
from minibp.optim import SGD
print("minibp device", backend.device, "; graph capture:", step.graph_capture_refused() or "possible")
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 16, 16, 3)).astype(np.float32); y = rng.integers(0, 10, 16)
net = models.preact_resnet(20, input_shape=(16, 16, 3)).compile(pass_images=16, bits="4", seed=0)
train = step.TrainStep(net, SGD(net))
start = time.perf_counter()
for i in range(4):
    train.run(x, y, lr=0.05, iteration=i)
    print(f"step {i}: loss {train.result()[0]:.5f} (replayed as a CUDA graph: {train.graph})")
print(f"4 steps in {time.perf_counter() - start:.2f} s (kernels compiled in the first, the graph captured in the "
      "second)")
EOF
    echo "== smoke exit $?"
}
tests() {
    echo "== tests on the GPU (log: gpu_tests.log)"
    FAILURES_LOG="$results/gpu_failures.log" PYTHONPATH="$PYTHONPATH:$PWD/bench" timeout "${TESTS_SECONDS:-230}" \
        python3 -m pytest -q -p no:cacheprovider -p pytest_failures -n 14 --dist loadfile --timeout 150 -rfEs \
        tests --ignore=tests/test_hosts.py > "$results/gpu_tests.log" 2>&1
    echo "== tests exit $?"
    grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$results/gpu_tests.log" | cut -c1-200 | tail -60
    grep "^==== " "$results/gpu_failures.log" 2>/dev/null | sed 's/^==== //' | cut -c1-150
}
bench() {
    echo "== bench/gpu.py: replayed and eager, GEMM and cuDNN, beside PyTorch; the replay against eager"
    timeout "${BENCH_SECONDS:-200}" python3 bench/gpu.py --rounds 5 --pytorch --parity
    echo "== bench exit $?"
}
fit() {
    echo "== bench/gpu.py --fit 11GiB: the paper's GPU"
    timeout "${FIT_SECONDS:-90}" python3 bench/gpu.py --models '' --fit 11GiB
    echo "== fit exit $?"
}
memory() {
    echo "== python3 -m minibp.train --memory 11GiB: ResNet-1001 at batch 128, 3 steps"
    python3 -c "import numpy as np; from minibp.io import data; r = np.random.default_rng(0)
data.write('/tmp/memory.h5', train=(r.integers(0, 256, (512, 32, 32, 3), dtype=np.uint8), r.integers(0, 10, 512)),
           test=(r.integers(0, 256, (128, 32, 32, 3), dtype=np.uint8), r.integers(0, 10, 128)), classes=10)"
    timeout "${MEMORY_SECONDS:-90}" python3 -m minibp.train --data-file /tmp/memory.h5 --model resnet1001 --batch 128 \
        --memory 11GiB --iters 3 --val-every 3 --log-every 1 --lr-schedule 0:0.01 --out /tmp/memory-run --overwrite \
        | grep -v "^ "
    echo "== memory exit $?"
}
dist() {
    echo "== 2 ranks on one GPU against --sub-batches 2"
    timeout 60 python3 -m pytest -q -p no:cacheprovider -x tests/test_dist.py -k "as_one_process" 2>&1 | tail -5
    echo "== dist exit $?"
}
{
    echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
    echo "== parts: $parts; $(python3 --version); $(nproc) cores"
    for name in $parts; do
        case $name in
            smoke|tests|bench|fit|memory|dist) $name ;;
            *) echo "no part $name (smoke, tests, bench, fit, memory, dist)" ;;
        esac
    done
} 2>&1 | tee -a "$log"
