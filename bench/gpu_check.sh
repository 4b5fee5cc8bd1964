#!/usr/bin/env bash
# The GPU check, prepared to run in one call on a machine with one H200 and no network, within
# 10 minutes: the whole test suite on CuPy (including tests/test_gpu.py and the graph-vs-eager test
# in tests/test_step.py), then bench/gpu.py with GEMM and with cuDNN convolutions.
# Results go to ${OUT:-bench/results}/gpu_check.log. Installs nothing from the network: wheels
# carried in .whl/ (e.g. nvidia-cudnn-frontend) are installed from there if present.
#
#   bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
results=${OUT:-bench/results}
mkdir -p "$results"
log="$results/gpu_check.log"
export MINIBP_DEVICE=gpu PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:${PYTHONPATH:-}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
{
    echo "== $(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
    python3 -c "import cupy; print('cupy', cupy.__version__)"
    echo "== tests on the GPU"
    timeout 300 python3 -m pytest -q -x -p no:cacheprovider tests
    echo "== tests exit $?"
    echo "== bench/gpu.py (GEMM convolutions; eager and graph)"
    timeout 200 python3 bench/gpu.py --rounds 3
    echo "== bench exit $?"
    echo "== bench/gpu.py (cuDNN convolutions)"
    timeout 100 python3 bench/gpu.py --rounds 3 --models resnet164 --conv cudnn
    echo "== bench exit $?"
} 2>&1 | tee "$log"
