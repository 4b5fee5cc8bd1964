"""The net: exact mode is ordinary backprop; the approximate modes change only the backward pass; recompiling keeps
the trained state, and prediction runs through an evaluation-only arena; the optimizer's buffers are planned by
compile(optimizer=, grad_norm=)."""
import tracemalloc

import numpy as np
import pytest

from minibp import backend, quant
from minibp.layers import softmax_cross_entropy_ref
from minibp.models import preact_resnet
from minibp.net import Net
from minibp import optim
from minibp.optim import SGD, AdamW
from conftest import device, host
from gradcheck import numerical_gradient, relative_error
from nets import odd_net, resnet20_16x16, small_net, tiny_net, train_steps
import reference_net


def batch(rng, n=4, shape=(8, 8, 3), classes=5, dtype=np.float32):
    return rng.standard_normal((n,) + shape).astype(dtype), rng.integers(0, classes, n)


@pytest.mark.slow
def test_whole_net_gradients_match_finite_differences_in_float64(rng):
    net = small_net(dtype=np.float64).compile(pass_images=3, bits="exact", seed=7, input_grad=True)
    x, y = batch(rng, 3, dtype=np.float64)
    x_device = device(x)
    net.forward(x_device, y)
    net.backward()
    loss = lambda: net.forward(x_device, y)[0]  # noqa: E731
    for name, analytic in net.grad_views.items():
        numeric = numerical_gradient(loss, net.param_views[name])
        assert relative_error(host(analytic), numeric) < 1e-6, name
    assert relative_error(host(net.arena["input_grad"]), numerical_gradient(loss, x_device)) < 1e-6


@pytest.mark.slow
def test_projection_block_then_fewer_channels_matches_finite_differences(rng):
    """The residual buffer carries the projection's output, the adding unit's input (16 channels here),
    not the adding unit's output (4 channels)."""
    net = Net((8, 8, 3), dtype=np.float64)
    net.conv(8, kernel=3)
    with net.residual(shortcut="projection"):
        net.conv(8, kernel=1)
        net.conv(16, kernel=3, stride=2)
    net.conv(4, kernel=1)  # adds the projection, then reduces the channels
    net.classifier(3)
    net.compile(pass_images=2, bits="exact", seed=1)
    x = device(rng.standard_normal((2, 8, 8, 3)))
    y = rng.integers(0, 3, 2)
    net.forward(x, y)
    net.backward()
    loss = lambda: net.forward(x, y)[0]  # noqa: E731
    for name, analytic in net.grad_views.items():
        assert relative_error(host(analytic), numerical_gradient(loss, net.param_views[name])) < 1e-6, name


def test_exact_mode_equals_ordinary_backprop(rng):
    net = small_net().compile(pass_images=4, bits="exact", seed=3, input_grad=True)
    x, y = batch(rng)
    loss, _ = net.forward(device(x), y)
    net.backward()
    ref_loss, ref_grads, ref_dx = reference_net.forward_backward(net, x, y)
    assert abs(loss - ref_loss) < 1e-5
    for name, ref in ref_grads.items():
        assert relative_error(host(net.grad_views[name]), ref) < 1e-5, name
    assert relative_error(host(net.arena["input_grad"]), ref_dx) < 1e-5


def test_forward_in_approximate_modes_is_bit_identical_to_exact(rng):
    x, y = batch(rng, n=12)  # 768 rows at 8 x 8: three block windows
    results = {}
    modes = ["exact"] + [f"{k}:{w}" for k in ("8", "4", "2") for w in quant.WINDOWS]  # every store and window
    for mode in modes:
        bits, _, window = mode.partition(":")
        net = small_net().compile(pass_images=12, bits=bits, window=window or "fixed", seed=1)
        loss, accuracy = net.forward(device(x), y)
        results[mode] = (loss, accuracy, host(net.arena["logits"]).copy(),
                         [host(net.arena["running"]).copy()])
    for mode in modes[1:]:
        assert results[mode][:2] == results["exact"][:2]
        assert np.array_equal(results[mode][2], results["exact"][2])
        assert all(np.array_equal(a, b) for a, b in zip(results[mode][3], results["exact"][3]))
    naive = small_net().compile(pass_images=12, bits="naive", seed=1)
    assert naive.forward(device(x), y)[0] != results["exact"][0]  # the ablation does feed a~ forward


def _grads(net_fn, mode, x, y, *, seed=0):
    net = net_fn().compile(pass_images=x.shape[0], bits=mode, seed=seed)
    net.forward(device(x), y)
    net.backward()
    return host(net.grads).astype(np.float64), net


def _cosine(a, b):
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_approximate_gradients_are_close_to_exact(rng):
    """Cosine similarity of the whole gradient with the exact one, ResNet-20 at initialisation on random
    16x16x3 data, batch 16 (measured 2026-11-30: 8 bits 0.9986, 4 bits 0.991, 2 bits 0.89, naive 0.13).

    8 bits is only a little closer than 4: both clip v to about +-3 sigma around b (docs/method.md, "The k-bit store"),
    and that clipping, not the bin width, is most of the 8-bit error.
    """
    x, y = batch(rng, 16, shape=(16, 16, 3), classes=10)
    net_fn = resnet20_16x16
    exact, _ = _grads(net_fn, "exact", x, y)
    cosine = {mode: _cosine(_grads(net_fn, mode, x, y)[0], exact) for mode in ("8", "4", "2", "naive")}
    assert cosine["8"] > 0.997
    assert cosine["4"] > 0.985
    assert cosine["2"] > 0.8
    assert cosine["naive"] < 0.5
    assert cosine["8"] > cosine["4"] > cosine["2"] > cosine["naive"]


def residual_chain(units):
    """A first conv, units-2 one-unit residual blocks of 3x3 convs (16 channels, 8x8), a classifier."""
    net = Net((8, 8, 4))
    net.conv(16, kernel=3)
    for _ in range(units - 2):
        with net.residual():
            net.conv(16, kernel=3)
    net.classifier(10)
    return net


def test_error_does_not_compound_with_depth_as_naive_quantization_does(rng):
    """Relative error ||g - g_exact|| / ||g_exact|| of the first unit's weight gradient, same batch of 16
    and same weights, measured 2026-11-30:

        units   mode 4   naive
            4    0.027   0.409
           16    0.039   0.582
           64    0.027   0.820

    With exact forward activations the error stays flat; feeding the approximation forward compounds it.
    """
    x, y = batch(rng, 16, shape=(8, 8, 4), classes=10)
    errors = {}
    for units in (4, 16, 64):
        exact, _ = _grads(lambda: residual_chain(units), "exact", x, y, seed=3)
        n = 16 * 3 * 3 * 4  # unit0.w, the first parameter array: (16, 3, 3, 4)
        for mode in ("4", "naive"):
            g, _ = _grads(lambda: residual_chain(units), mode, x, y, seed=3)
            errors[units, mode] = relative_error(g[:n], exact[:n])
    for units in (4, 16, 64):
        assert errors[units, "4"] < 0.1
        assert errors[units, "4"] < errors[units, "naive"] / 5
    assert errors[64, "naive"] > errors[4, "naive"] * 1.5
    assert errors[64, "4"] < errors[4, "4"] * 1.5  # grows more slowly than naive (here: not at all)


def test_plan_stores_cost_k_over_32_of_exact():
    net = preact_resnet(20)
    stores = {mode: net.plan(pass_images=32, bits=mode, window="range").bytes_by_category()["activation stores"]
              for mode in ("exact", "8", "4", "2")}
    for bits in (8, 4, 2):
        assert stores[str(bits)] * 32 == stores["exact"] * bits


@pytest.mark.skipif(backend.device != "cpu", reason="tracemalloc sees NumPy's allocations")
def test_a_training_step_allocates_little_outside_the_arena(rng):
    """Peak traced allocation of a whole step (forward, backward, SGD) for ResNet-20 at batch 32 on
    16x16x3: measured 2026-11-30 about 160 KB (the largest weight's gradient product, 147 KB) beside
    a 19-30 MB arena, whose largest activation buffer is 2 MB."""
    x, y = batch(rng, 32, shape=(16, 16, 3), classes=10)
    for mode in ("exact", "4"):
        net = resnet20_16x16().compile(pass_images=32, bits=mode)
        opt = SGD(net)
        net.forward(x, y)
        net.backward()
        opt.step(lr=0.1)
        tracemalloc.start()
        net.zero_grad()
        net.forward(x, y)
        net.backward()
        opt.step(lr=0.1)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        largest_weight = 4 * max(int(np.prod(s)) for _, _, s in ((0, 0, p.shape) for _, _, p in net.parameter_table()))
        assert peak < 1.2 * largest_weight + 64 * 1024, (mode, peak)


def test_resnet164_trains_a_step_at_batch_8(rng):
    net = preact_resnet(164).compile(pass_images=8, bits="4", seed=0)
    assert len(net.units) == 164
    opt = SGD(net)
    x, y = batch(rng, 8, shape=(32, 32, 3), classes=10)
    before = host(net.params).copy()
    loss, _ = net.forward(x, y)
    net.backward()
    opt.step(lr=0.1)
    assert np.isfinite(loss) and 1.0 < loss < 5.0
    assert not np.array_equal(host(net.params), before)


def test_backward_accumulates_with_a_loss_scale(rng):
    """backward() adds scale * gradient: two half-scaled passes over a batch equal one full pass."""
    net = small_net().compile(pass_images=4, bits="4", seed=2)
    x, y = batch(rng)
    net.forward(x, y)
    net.backward()
    whole = host(net.grads).copy()
    net.zero_grad()
    for _ in range(2):
        net.forward(x, y)
        net.backward(loss_scale=0.5)
    np.testing.assert_allclose(host(net.grads), whole, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("images,labels,match", [
    (np.zeros((4, 8, 8, 2), np.float32), np.zeros(4, np.int64), r"images must be \(N, 8, 8, 3\)"),
    (np.zeros((4, 8, 8, 3), np.float64), np.zeros(4, np.int64), "images must be float32"),
    (np.zeros((5, 8, 8, 3), np.float32), np.zeros(5, np.int64), "does not fit the 4"),
    (np.zeros((4, 8, 8, 3), np.float32), np.array([0, 1, 2, 5]), r"\[0, 5\)"),
    (np.zeros((4, 8, 8, 3), np.float32), np.zeros(3, np.int64), "labels must be 4"),
])
def test_bad_input_is_refused_clearly(images, labels, match):
    net = small_net().compile(pass_images=4, bits="4")
    with pytest.raises(ValueError, match=match):
        net.forward(images, labels)


def test_nan_loss_stops_training(rng):
    net = small_net().compile(pass_images=4, bits="4")
    x, y = batch(rng)
    x[0, 0, 0, 0] = np.nan
    with pytest.raises(FloatingPointError, match="nan"):
        net.forward(x, y)


def test_misuse_is_refused():
    net = small_net()
    with pytest.raises(RuntimeError, match="compile"):
        net.forward(np.zeros((1, 8, 8, 3), np.float32), np.zeros(1, np.int64))
    net.compile(pass_images=2, bits="4")
    with pytest.raises(RuntimeError, match="forward"):
        net.backward()
    with pytest.raises(ValueError, match="bits must be one of"):
        net.plan(pass_images=2, bits="3")
    with pytest.raises(ValueError, match="classifier"):
        net.conv(4)
    nested = Net((8, 8, 3))
    nested.conv(4)
    with pytest.raises(ValueError, match="nest"):
        with nested.residual():
            with nested.residual():
                pass
    odd = odd_net()
    with pytest.raises(ValueError, match="multiple of 2"):
        odd.compile(pass_images=2, bits="4")
    with pytest.raises(ValueError, match="9n\\+2"):
        preact_resnet(50)


def test_recompiling_keeps_the_trained_state(rng):
    net = tiny_net().compile(pass_images=4, bits=4)
    train_steps(net, rng)
    before = net.state()
    net.compile(pass_images=2, bits=8)
    after = net.state()
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    net.initialize(seed=0)  # initialisation is its own call
    assert not np.array_equal(net.state()["params/unit0.w"], before["params/unit0.w"])


def test_predict_runs_any_number_of_images_through_an_evaluation_arena(rng):
    trained = tiny_net().compile(pass_images=4, bits=4)
    train_steps(trained, rng)
    evaluator = tiny_net().compile(pass_images=3, bits=4, training=False)
    evaluator.load_state(trained.state())  # momentum ignored: the evaluation arena has none
    plan = evaluator.arena.plan
    assert not any(n in plan for n in ("grads", "velocity", "unit1.codes", "unit1.x_copy", "dlogits", "da"))
    assert plan.total_bytes < trained.arena.plan.total_bytes
    x = rng.standard_normal((7, 8, 8, 3)).astype(np.float32)
    logits = evaluator.predict(device(x))
    assert logits.shape == (7, 3)
    reference = np.concatenate([trained.predict(device(x[i:i + 4])) for i in (0, 4)])
    np.testing.assert_allclose(logits, reference, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        evaluator.forward(device(x[:3]), np.zeros(3, np.int64))


def test_the_optimizer_options_plan_their_buffers_and_nothing_else():
    net = small_net()
    P = net.num_parameters
    sgd = net.plan(pass_images=4, bits="4")
    assert not any(n in sgd for n in ("second_moment", "grad_sums", "grad_norm"))
    assert sgd.buffers == net.plan(pass_images=4, bits="4", optimizer="sgd", grad_norm=False).buffers
    for optimizer in ("sgd", "adamw"):
        for grad_norm in (False, True):
            plan = net.plan(pass_images=4, bits="4", optimizer=optimizer, grad_norm=grad_norm)
            added = {n: plan[n] for n in plan.buffers if n not in sgd}
            assert all(plan[n] == sgd[n] for n in sgd.buffers)  # SGD's plan, in its order, first
            assert list(plan.buffers)[:len(sgd.buffers)] == list(sgd.buffers)
            want = {}
            if optimizer == "adamw":
                want["second_moment"] = ((P,), np.float32, "second moment")
            if grad_norm:
                want["grad_sums"] = ((optim.norm_chunks(P),), np.float64, "workspace")
                want["grad_norm"] = ((1,), np.float64, "workspace")
            assert {n: (b.shape, b.dtype, b.category) for n, b in added.items()} == want
            evaluation = net.plan(pass_images=4, bits="4", training=False, optimizer=optimizer, grad_norm=grad_norm)
            assert evaluation.buffers == net.plan(pass_images=4, bits="4", training=False).buffers
    assert optim.norm_chunks(P) == -(-P // optim.NORM_CHUNK) == 3


@pytest.mark.parametrize("options,error,match", [
    (dict(optimizer="adam"), ValueError, "optimizer must be one of 'sgd', 'adamw', got 'adam'"),
    (dict(optimizer=None), ValueError, "optimizer must be one of"),
    (dict(grad_norm=1), TypeError, "grad_norm must be True or False, got 1"),
])
def test_plan_and_compile_refuse_unknown_optimizer_options(options, error, match):
    net = small_net()
    for call in (net.plan, net.compile):
        with pytest.raises(error, match=match):
            call(pass_images=2, bits="4", **options)
    assert net.arena is None


def test_recompiling_keeps_the_adamw_state_and_another_optimizer_drops_it(rng):
    net = tiny_net().compile(pass_images=4, bits=4, optimizer="adamw")
    opt = AdamW(net)
    x, y = batch(rng, classes=3)
    net.forward(device(x), y)
    net.backward()
    opt.step(lr=1e-3, iteration=0)
    before = net.state()
    assert sum(k.startswith("second_moment/") for k in before) == len(net.parameter_table())
    net.compile(pass_images=2, bits=8, optimizer="adamw", grad_norm=True)
    after = net.state()
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    net.compile(pass_images=2, bits=8)  # SGD's arena: no second moment, the rest kept
    assert {k: v for k, v in before.items() if not k.startswith("second_moment/")}.keys() == net.state().keys()
    net.compile(pass_images=2, bits=8, optimizer="adamw")
    assert all(not v.any() for k, v in net.state().items() if k.startswith("second_moment/"))
    net.initialize(seed=1)
    assert all(not v.any() for k, v in net.state().items() if k.startswith(("second_moment/", "momentum/")))


@pytest.mark.skipif(backend.device != "cpu", reason="tracemalloc sees NumPy's allocations")
def test_an_adamw_step_with_clipping_allocates_nothing_large(rng):
    """The norm's partial sums and the moments are the arena's: a step of the optimizer allocates no (P,)
    temporary (resnet20_16x16: P = 0.27 M, 1 MB a float32 copy)."""
    net = resnet20_16x16().compile(pass_images=2, bits="4", optimizer="adamw", grad_norm=True)
    net.grads[...] = device(rng.standard_normal(net.num_parameters).astype(np.float32))
    for opt in (AdamW(net, clip_norm=1.0), SGD(net, clip_norm=1.0)):
        opt.step(lr=1e-3, iteration=0)  # loads the kernels
        tracemalloc.start()
        opt.step(lr=1e-3, iteration=1)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 16 * 1024, (type(opt).__name__, peak)


def test_the_memory_checks_plan_the_optimizers_buffers(monkeypatch):
    """run/sizing.py's largest_batch and compile_within_memory size the plan the compile will allocate."""
    from minibp.run.sizing import compile_within_memory, largest_batch
    net, store = small_net(), quant.Store("4")
    sgd = net.plan(pass_images=64, store=store).allocation_bytes
    adamw = net.plan(pass_images=64, store=store, optimizer="adamw", grad_norm=True).allocation_bytes
    budget = (sgd + adamw) // 2
    assert largest_batch(net, store=store, budget=budget) >= 64
    assert largest_batch(net, store=store, budget=budget, optimizer="adamw", grad_norm=True) < 64
    monkeypatch.setattr(backend, "available_memory", lambda: budget)
    with pytest.raises(ValueError, match="a pass of 64 images needs"):
        compile_within_memory(net, pass_images=64, store=store, optimizer="adamw", grad_norm=True)
    compile_within_memory(net, pass_images=64, store=store)
    assert "second_moment" not in net.arena


# ----------------------------------------------------------------------------- a store a unit (a mix)

def test_a_mix_plans_each_units_store_by_its_own_bits():
    """compile(store=[...]) takes a quant.Store a unit: each unit's store and windows are sized by its own, the rest of
    the plan is the uniform plan's, and one Store for all is the list of it repeated."""
    net = small_net()
    bits = ["exact", "8", "4", "2", "exact", "4", "8", "2"][:len(net.units)]
    mix = [quant.Store(b) for b in bits]
    plan = net.plan(pass_images=4, store=mix)
    for u, store in zip(net.units, mix):
        name = f"unit{u.index}.{'x_copy' if store.bits == 'exact' else 'codes'}"
        if u.bn_channels:
            want = 4 * int(np.prod(u.in_shape)) * (4 if store.bits == "exact" else store.k / 8)
            assert plan[name].nbytes == want, name
            assert (f"unit{u.index}.windows" in plan) == (store.bits != "exact")
    uniform = net.plan(pass_images=4, store=quant.Store("4"))
    assert net.plan(pass_images=4, store=[quant.Store("4")] * len(net.units)).buffers == uniform.buffers
    assert net.compile(pass_images=4, store=mix).stores == tuple(mix) and net.store is None
    assert net.compile(pass_images=4, store=[quant.Store("4")] * len(net.units)).store == quant.Store("4")


def test_a_mix_is_refused_in_one_line_where_it_does_not_fit_the_units():
    net = small_net()
    with pytest.raises(TypeError, match=f"a list of {len(net.units)} of them \\(one a unit\\), got list of 2"):
        net.plan(pass_images=4, store=[quant.Store("4")] * 2)
    with pytest.raises(ValueError, match="differs in bits alone"):
        net.plan(pass_images=4, store=[quant.Store("4", "range")] + [quant.Store("4")] * (len(net.units) - 1))


def test_each_unit_reads_its_own_store(rng):
    """Units after the one coded unit (in backward order: before it) see exact gradients: with unit i at 4 bits and
    every other exact, every gradient of a unit above i is the exact net's bit for bit, unit i's own is not, and the
    loss (an exact forward) is the same."""
    x, y = batch(rng, 4)
    exact = small_net().compile(pass_images=4, bits="exact", seed=3)
    i = 3
    mix = [quant.Store("exact")] * len(exact.units)
    mix[i] = quant.Store("4")
    mixed = small_net().compile(pass_images=4, store=mix, seed=3)
    losses = [n.forward(device(x), y) for n in (exact, mixed)]
    for n in (exact, mixed):
        n.backward(accumulate=False)
    assert losses[0] == losses[1]
    for u in exact.units:
        same = np.array_equal(host(exact.grad_views[f"unit{u.index}.w"]), host(mixed.grad_views[f"unit{u.index}.w"]))
        assert same == (u.index > i), u.index


def test_a_training_loss_smooths_and_weights_as_its_reference(rng):
    """compile(label_smoothing=, class_weights=): the forward's loss is the reference's on the net's own logits, the
    weights are planned as a buffer of their own, and an evaluation net refuses both."""
    x, y = batch(rng, 4)
    weights = np.array([1.0, 2.0, 0.5, 0.0, 3.0])
    net = small_net().compile(pass_images=4, bits="exact", seed=1, label_smoothing=0.1, class_weights=weights)
    assert net.arena.plan.buffers["class_weights"].shape == (5,)
    loss, _ = net.forward(device(x), device(y))
    logits = host(net.arena["logits"])  # the training forward's (batch statistics)
    want, _ = softmax_cross_entropy_ref(logits, y, smoothing=0.1, weights=weights)
    assert loss == pytest.approx(want, rel=1e-5)
    with pytest.raises(ValueError, match="training loss"):
        small_net().compile(pass_images=4, training=False, label_smoothing=0.1)
    with pytest.raises(ValueError, match="5 finite non-negative numbers"):
        small_net().compile(pass_images=4, class_weights=[1.0, -1.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"label_smoothing must be a number in \[0, 1\)"):
        small_net().compile(pass_images=4, label_smoothing=1.0)
