"""GPU checks (marked gpu: skipped with the reason where no GPU exists; run by bench/gpu_check.sh).

The rest of the suite is device-generic: with MINIBP_DEVICE=gpu it runs every kernel and layer on
CuPy against the same NumPy references, which is the GPU-vs-CPU parity of kernels and layers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minibp import backend, models
from minibp.optim import SGD
from nets import resnet20_16x16

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parent.parent

LOSSES = """
import json, numpy as np
from minibp import models
from minibp.optim import SGD
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 16, 16, 3)).astype(np.float32); y = rng.integers(0, 10, 16)
net = models.preact_resnet(20, input_shape=(16, 16, 3)).compile(pass_images=16, bits="{mode}", seed=0, conv="{conv}")
opt = SGD(net)
losses = []
for _ in range(20):
    net.zero_grad(); losses.append(net.forward(x, y)[0]); net.backward(); opt.step(lr=0.05)
print(json.dumps(losses))
"""


def losses_on(device, mode, conv="gemm"):
    env = dict(os.environ, MINIBP_DEVICE=device)
    done = subprocess.run([sys.executable, "-c", LOSSES.format(mode=mode, conv=conv)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return np.array(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "4"])
def test_twenty_training_steps_match_the_cpu(mode):
    gpu, cpu = losses_on("gpu", mode), losses_on("cpu", mode)
    assert np.all(np.abs(gpu - cpu) < 0.02 + 0.02 * np.abs(cpu)), (gpu, cpu)
    assert gpu[-1] < gpu[0]


@pytest.mark.slow
def test_cudnn_and_gemm_convolutions_agree():
    """Exact and 4-bit, one step's loss and gradients through cuDNN against the GEMM path's; both errors are
    reported together, since a 4-bit gap with an exact one says the convolutions differ (TF32, say) and a
    4-bit gap alone that codes moved across bin edges."""
    pytest.importorskip("cudnn")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 16, 16, 3)).astype(np.float32)
    y = rng.integers(0, 10, 16)
    errors = {}
    for bits in ("exact", "4"):
        grads, losses = {}, {}
        for conv in ("gemm", "cudnn"):
            net = resnet20_16x16().compile(pass_images=16, bits=bits, seed=0, conv=conv)
            losses[conv] = net.forward(x, y)[0]
            net.backward()
            grads[conv] = backend.to_host(net.grads).astype(np.float64)
        errors[bits] = (abs(losses["gemm"] - losses["cudnn"]),
                        np.linalg.norm(grads["gemm"] - grads["cudnn"]) / np.linalg.norm(grads["gemm"]))
    assert all(loss < 1e-4 and grad < 1e-3 for loss, grad in errors.values()), errors  # (loss, gradient) errors
    assert np.all(np.abs(losses_on("gpu", "4", "cudnn") - losses_on("gpu", "4", "gemm")) < 0.02)


def test_backward_and_step_never_synchronise_with_the_host():
    import cupyx
    net = resnet20_16x16().compile(pass_images=16, bits="4", seed=0)
    opt = SGD(net)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 16, 16, 3)).astype(np.float32), rng.integers(0, 10, 16)
    net.forward(x, y)
    with cupyx.allow_synchronize(False):  # raises on any device-to-host synchronisation
        net.backward()
        opt.step(lr=0.1)


def test_memory_pool_holds_the_plan_and_little_else():
    import cupy
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    net = models.preact_resnet(56).compile(pass_images=64, bits="4", seed=0)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, 64)
    net.forward(x, y)
    net.backward()
    SGD(net).step(lr=0.1)
    used = pool.used_bytes() - before
    plan = net.arena.plan.allocation_bytes
    print(f"pool used {used} bytes, plan {plan}")
    assert plan <= used <= plan * 1.05 + 16 * 2**20


def test_a_replayed_step_holds_the_plan_to_the_byte():
    """A step captured as a CUDA graph and replayed allocates nothing beside the arena: the batch is staged in pinned
    host memory, every GEMM's workspace is the arena's."""
    import cupy
    from minibp.step import TrainStep, graph_capture_refused
    if graph_capture_refused():
        pytest.skip(f"this GPU cannot capture a step: {graph_capture_refused()}")
    pool = cupy.get_default_memory_pool()
    pool.free_all_blocks()
    before = pool.used_bytes()
    net = models.preact_resnet(56).compile(pass_images=64, bits="4", seed=0)
    step = TrainStep(net, SGD(net), graph=True)
    rng = np.random.default_rng(0)
    for i in range(3):  # eager on the step's stream, captured, replayed
        step.run(rng.standard_normal((64, 32, 32, 3)).astype(np.float32), rng.integers(0, 10, 64), lr=0.1,
                 iteration=i)
        step.result()
    assert step.graph and pool.used_bytes() - before == net.arena.plan.allocation_bytes
