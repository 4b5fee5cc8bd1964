"""Units and the Net API around them: a new kind of unit, the state as named arrays, recompiling,
prediction through an evaluation-only arena, and old checkpoints."""
import json

import h5py
import numpy as np
import pytest

from minibp import checkpoint
from minibp.net import Net
from minibp.optim import SGD
from minibp.units import ReluConvUnit
from conftest import device, host
from gradcheck import numerical_gradient, relative_error


def net_with_relu_conv(dtype=np.float64):
    net = Net((6, 6, 3), dtype=dtype)
    net.conv(4, kernel=3)
    net.add(ReluConvUnit((6, 6, 4), 4, kernel=3))          # ReLU -> conv + bias, no BN
    with net.residual():
        net.add(ReluConvUnit((6, 6, 4), 4, kernel=1))
    net.classifier(3)
    return net


def test_a_new_unit_kind_matches_finite_differences(rng):
    net = net_with_relu_conv().compile(batch=2, bits="exact", seed=2, input_grad=True)
    x, y = device(rng.standard_normal((2, 6, 6, 3))), rng.integers(0, 3, 2)
    net.forward(x, y)
    net.backward()
    loss = lambda: net.forward(x, y)[0]  # noqa: E731
    assert any(name.endswith(".bias") for name in net.grad_views)
    for name, analytic in net.grad_views.items():
        numeric = numerical_gradient(loss, net.param_views[name])
        # (the last unit's bias feeds batch norm, which cancels it: both gradients are then ~0)
        assert relative_error(host(analytic), numeric) < 1e-6 or np.abs(host(analytic) - numeric).max() < 1e-10, name
    assert relative_error(host(net.arena["input_grad"]), numerical_gradient(loss, x)) < 1e-6


def test_a_new_unit_kind_keeps_its_input_in_full_precision_at_4_bits(rng):
    net = net_with_relu_conv(np.float32)
    plan = net.plan(batch=2, bits=4)
    assert plan["unit1.store"].dtype == np.float32 and plan["unit1.store"].shape == (2 * 6 * 6 * 4,)
    assert plan["unit3.store"].dtype == np.uint8  # the classifier's BN input: 4-bit codes


def small_net():
    net = Net((8, 8, 3))
    net.conv(8, kernel=3)
    with net.residual():
        net.conv(8, kernel=3)
    net.classifier(3)
    return net


def train_steps(net, rng, steps=3, n=4):
    opt = SGD(net)
    for _ in range(steps):
        x, y = device(rng.standard_normal((n, 8, 8, 3)).astype(np.float32)), rng.integers(0, 3, n)
        net.zero_grad()
        net.forward(x, y)
        net.backward()
        opt.step(lr=0.1)


def test_recompiling_keeps_the_trained_state(rng):
    net = small_net().compile(batch=4, bits=4)
    train_steps(net, rng)
    before = net.state()
    net.compile(batch=2, bits=8)
    after = net.state()
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    net.initialize(seed=0)  # initialisation is its own call
    assert not np.array_equal(net.state()["params/unit0.w"], before["params/unit0.w"])


def test_state_round_trips_and_refuses_another_net(rng):
    a = small_net().compile(batch=4, bits=4)
    train_steps(a, rng)
    b = small_net().compile(batch=4, bits=4, seed=9)
    b.load_state(a.state())
    x = device(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
    assert np.array_equal(a.predict(x), b.predict(x))
    assert set(a.state()) >= {"params/unit1.gamma", "momentum/unit1.gamma", "running/unit1.bn"}
    other = Net((8, 8, 3))
    other.conv(8, kernel=3)
    other.classifier(3)
    other.compile(batch=4, bits=4)
    with pytest.raises(ValueError, match="does not fit this net"):
        other.load_state(a.state())
    bad = a.state()
    bad["params/unit1.gamma"] = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"has shape \(3,\)"):
        b.load_state(bad)


def test_predict_runs_any_number_of_images_through_an_evaluation_arena(rng):
    trained = small_net().compile(batch=4, bits=4)
    train_steps(trained, rng)
    evaluator = small_net().compile(batch=3, bits=4, training=False)
    evaluator.load_state(trained.state())  # momentum ignored: the evaluation arena has none
    plan = evaluator.arena.plan
    assert not any(n in plan for n in ("grads", "velocity", "unit1.store", "dlogits", "da"))
    assert plan.total_bytes < trained.arena.plan.total_bytes
    x = rng.standard_normal((7, 8, 8, 3)).astype(np.float32)
    logits = evaluator.predict(device(x))
    assert logits.shape == (7, 3)
    reference = np.concatenate([trained.predict(device(x[i:i + 4])) for i in (0, 4)])
    np.testing.assert_allclose(logits, reference, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        evaluator.forward(device(x[:3]), np.zeros(3, np.int64))


def test_an_old_format_checkpoint_still_resumes(tmp_path, rng):
    net = small_net().compile(batch=4, bits=4)
    train_steps(net, rng)
    state = net.state()
    names = [n for n, _, _ in net.parameter_table()]
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:  # the flat layout of minibp-checkpoint-1
        f.attrs.update(format="minibp-checkpoint-1", iteration=3, config=json.dumps({}), data_epoch=0,
                       data_position=0, data_rng=json.dumps({"state": {}}))
        f["params"] = np.concatenate([state["params/" + n].ravel() for n in names])
        f["velocity"] = np.concatenate([state["momentum/" + n].ravel() for n in names])
        f["running"] = np.concatenate([state[n] for n in state if n.startswith("running/")], axis=1)
        f["data_order"] = np.arange(5)
    fresh = small_net().compile(batch=4, bits=4, seed=3)
    checkpoint.restore(fresh, checkpoint.load(path))
    assert all(np.array_equal(fresh.state()[k], state[k]) for k in state)
