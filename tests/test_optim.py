"""SGD with momentum and AdamW: the kernels against their references, bit for bit, with and without clipping by
the global gradient norm (itself a fixed-order reduction, against its reference); weight decay on weights only,
hyperparameters and learning rates that are not numbers in range refused, a net recompiled under them; AdamW
trains, and continues bit for bit from a state loaded into a fresh compile."""
import math
import re

import numpy as np
import pytest

from minibp import kernels, optim
from minibp.net import Net
from minibp.optim import SGD, AdamW
from conftest import device, host
from nets import small_net, tiny_batch, tiny_net


def _net():
    net = Net((4, 4, 2))
    net.conv(4, kernel=3)
    net.conv(4, kernel=1)
    net.classifier(3)
    return net.compile(pass_images=2, bits="4", seed=0)


def test_sgd_kernel_equals_reference_exactly(rng):
    net = _net()
    params0 = host(net.params).copy()
    grads = rng.standard_normal(params0.shape).astype(np.float32)
    velocity = rng.standard_normal(params0.shape).astype(np.float32)
    net.grads[...] = device(grads)
    net.arena["velocity"][...] = device(velocity)
    opt = optim.SGD(net, momentum=0.9, weight_decay=2e-4)
    opt.step(lr=0.1)
    want_p, want_v = optim.sgd_momentum_ref(params0, grads, velocity, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                            weight_decay=2e-4)
    assert np.array_equal(host(net.params), want_p)
    assert np.array_equal(host(net.arena["velocity"]), want_v)


def test_weight_decay_skips_batchnorm_and_bias():
    net = _net()
    net.params[...] = 1
    net.grads[...] = 0
    optim.SGD(net, momentum=0.0, weight_decay=0.5).step(lr=1.0)
    for name, _, param in net.parameter_table():
        assert np.all(host(net.param_views[name]) == (0.5 if param.decayed else 1.0)), name
    assert not any(p.decayed for _, _, p in net.parameter_table() if p.role in ("gamma", "beta", "bias"))


def test_bad_options_are_refused():
    net = _net()
    with pytest.raises(ValueError, match="momentum"):
        optim.SGD(net, momentum=1.5)
    with pytest.raises(ValueError, match="lr must be finite and >= 0, got nan"):
        optim.SGD(net).step(lr=float("nan"))
    with pytest.raises(RuntimeError, match="compile"):
        optim.SGD(Net((4, 4, 2)))


@pytest.mark.parametrize("lr,error,match", [
    ("0.1", TypeError, "lr must be a real number, got '0.1' (str)"),
    (True, TypeError, "lr must be a real number, got True (bool)"),
    (None, TypeError, "lr must be a real number, got None (NoneType)"),
    (np.array([0.1, 0.2]), TypeError, "lr must be a real number, got array"),
    (-0.1, ValueError, "lr must be finite and >= 0, got -0.1"),
    (float("inf"), ValueError, "lr must be finite and >= 0, got inf"),
])
def test_step_refuses_a_learning_rate_that_is_not_a_finite_number(lr, error, match):
    net = _net()
    before = host(net.params).copy()
    with pytest.raises(error, match=re.escape(match)):
        optim.SGD(net).step(lr=lr)
    assert np.array_equal(host(net.params), before)


@pytest.mark.parametrize("lr", [0, 0.1, np.float32(0.1), np.float64(0.1), 1])
def test_step_takes_any_real_learning_rate(lr):
    net = _net()
    net.grads[...] = 1
    optim.SGD(net, momentum=0.0, weight_decay=0.0).step(lr=lr)
    assert np.allclose(host(net.params), host(_net().params) - float(lr))


def test_step_needs_a_net_compiled_for_training():
    net = _net()
    opt = optim.SGD(net)
    net.compile(pass_images=2, bits="4", training=False)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        opt.step(lr=0.1)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        optim.SGD(net)


@pytest.mark.parametrize("options,error,match", [
    (dict(weight_decay=float("nan")), ValueError, "weight_decay must be finite and >= 0, got nan"),
    (dict(weight_decay=float("inf")), ValueError, "weight_decay must be finite and >= 0"),
    (dict(weight_decay=-1e-4), ValueError, "weight_decay must be finite and >= 0"),
    (dict(weight_decay="2e-4"), TypeError, r"weight_decay must be a real number, got '2e-4' \(str\)"),
    (dict(momentum=float("nan")), ValueError, r"momentum must be in \[0, 1\), got nan"),
    (dict(momentum=1.0), ValueError, r"momentum must be in \[0, 1\), got 1.0"),
    (dict(momentum="0.9"), TypeError, "momentum must be a real number"),
    (dict(momentum=False), TypeError, "momentum must be a real number, got False"),
])
def test_sgd_refuses_hyperparameters_that_are_not_numbers_in_range(options, error, match):
    net = tiny_net().compile(pass_images=2, bits="4")
    with pytest.raises(error, match=match):
        SGD(net, **options)


def test_sgd_follows_a_recompiled_net(rng):
    net = tiny_net().compile(pass_images=4, bits="4")
    opt = SGD(net, momentum=0.9)
    net.compile(pass_images=2, bits="4")  # a new arena, with a new momentum buffer
    x, y = tiny_batch(rng, 2)
    net.zero_grad()
    net.forward(x, y)
    net.backward()
    opt.step(lr=0.1)
    momentum = [v for name, v in net.state().items() if name.startswith("momentum/")]
    assert max(np.abs(v).max() for v in momentum) > 0  # the step's momentum is in the state a checkpoint saves


# ----------------------------------------------------------------------------- the gradient norm and clipping

ADAMW = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)


def _random_state(net, rng, *, scale=1.0):
    """Random gradients, parameters and optimizer state put into the net; their host copies (params, grads,
    velocity, second moment or None)."""
    P = net.num_parameters
    params = rng.standard_normal(P).astype(net.dtype)
    grads = (scale * rng.standard_normal(P)).astype(net.dtype)
    velocity = rng.standard_normal(P).astype(net.dtype)
    second = rng.random(P).astype(net.dtype) * 1e-2 if "second_moment" in net.arena else None
    net.params[...], net.grads[...], net.arena["velocity"][...] = device(params), device(grads), device(velocity)
    if second is not None:
        net.arena["second_moment"][...] = device(second)
    return params, grads, velocity, second


@pytest.mark.parametrize("n", [1, 1023, 1024, 1025, 5000])
def test_grad_norm_kernels_equal_the_reference_for_any_launch_shape(rng, n):
    """Chunks summed in order, then the chunks in order: the same float64 bits whatever the launch shape (and so
    whatever the thread count, since each chunk is one thread's)."""
    grads = rng.standard_normal(n).astype(np.float32)
    want = optim.grad_norm_ref(grads)
    assert math.isclose(want, math.sqrt(math.fsum(float(g) ** 2 for g in grads)), rel_tol=1e-12)
    module, chunks = kernels.load("sgd.cu", np.float32), optim.norm_chunks(n)
    for grid, block in [((1,), (1,)), ((3,), (7,)), ((4096,), (256,))]:
        sums, norm = device(np.full(chunks, np.nan)), device(np.full(1, np.nan))
        module.grad_sum_squares(n=n, chunk=optim.NORM_CHUNK, grads=device(grads), sums=sums, grid=grid, block=block)
        module.grad_norm_finish(chunks=chunks, sums=sums, norm=norm, grid=(1,), block=(1,))
        assert host(norm)[0] == want, (grid, block)


def _compiled(optimizer="sgd", *, grad_norm=True, dtype=np.float32):
    return small_net(dtype=dtype).compile(pass_images=2, bits="4", seed=0, optimizer=optimizer, grad_norm=grad_norm)


@pytest.mark.parametrize("binds", [True, False])
def test_clipped_sgd_equals_reference_exactly(rng, binds):
    net = _compiled()
    params, grads, velocity, _ = _random_state(net, rng)
    norm = optim.grad_norm_ref(grads)
    clip_norm = norm / 3 if binds else norm * 2
    SGD(net, momentum=0.9, weight_decay=2e-4, clip_norm=clip_norm).step(lr=0.1)
    want_p, want_v = optim.sgd_momentum_ref(params, grads, velocity, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                            weight_decay=2e-4, clip_norm=clip_norm)
    assert np.array_equal(host(net.params), want_p) and np.array_equal(host(net.arena["velocity"]), want_v)
    unclipped, _ = optim.sgd_momentum_ref(params, grads, velocity, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                          weight_decay=2e-4)
    assert np.array_equal(want_p, unclipped) != binds  # a clip that does not bind changes nothing
    assert np.array_equal(host(net.grads), grads)  # the gradient is scaled as it is read, not in place


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("iteration", [0, 1, 1000])
@pytest.mark.parametrize("clip", [None, "binds", "does not bind"])
def test_adamw_kernel_equals_reference_exactly(rng, dtype, iteration, clip):
    net = _compiled("adamw", dtype=dtype)
    params, grads, first, second = _random_state(net, rng, scale=0.1)
    norm = optim.grad_norm_ref(grads)
    clip_norm = {None: None, "binds": norm / 4, "does not bind": norm * 1.5}[clip]
    opt = AdamW(net, **ADAMW, clip_norm=clip_norm)
    opt.step(lr=1e-3, iteration=iteration)
    want = optim.adamw_ref(params, grads, first, second, n_decay=net.num_decayed, lr=1e-3, iteration=iteration,
                           clip_norm=clip_norm, **ADAMW)
    got = host(net.params), host(net.arena["velocity"]), host(net.arena["second_moment"])
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert opt.last_grad_norm == norm  # measured whether or not it clips
    if clip == "does not bind":
        unclipped = optim.adamw_ref(params, grads, first, second, n_decay=net.num_decayed, lr=1e-3,
                                    iteration=iteration, **ADAMW)
        assert all(np.array_equal(a, b) for a, b in zip(want, unclipped))


def test_measuring_the_norm_leaves_sgd_as_it_was(rng):
    """A net compiled with grad_norm=True logs the norm, and SGD without clip_norm steps as the plain kernel."""
    net = _compiled()
    params, grads, velocity, _ = _random_state(net, rng)
    opt = SGD(net)
    assert opt.last_grad_norm is None  # no step yet
    opt.step(lr=0.1, iteration=3)
    want_p, _ = optim.sgd_momentum_ref(params, grads, velocity, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                       weight_decay=2e-4)
    assert np.array_equal(host(net.params), want_p)
    assert opt.last_grad_norm == optim.grad_norm_ref(grads)
    net.compile(pass_images=2, bits="4", grad_norm=True)  # a new arena: its norm is not measured yet
    assert opt.last_grad_norm is None
    assert SGD(_compiled(grad_norm=False)).last_grad_norm is None


def test_sgd_takes_an_iteration_and_ignores_it(rng):
    finals = []
    for iteration in (None, 0, 7):
        net = _net()
        net.grads[...] = device(np.random.default_rng(3).standard_normal(net.num_parameters).astype(np.float32))
        SGD(net).step(lr=0.1, iteration=iteration)
        finals.append(host(net.params))
    assert all(np.array_equal(finals[0], f) for f in finals)
    with pytest.raises(ValueError, match="iteration must be a whole number >= 0, got -1"):
        SGD(_net()).step(lr=0.1, iteration=-1)


def test_adamw_decays_weights_only():
    net = small_net().compile(pass_images=2, bits="4", optimizer="adamw")
    net.params[...] = 1
    net.grads[...] = 0  # m = v = 0: the update is the decay alone
    AdamW(net, weight_decay=0.5).step(lr=0.1, iteration=0)
    for name, _, param in net.parameter_table():
        assert np.all(host(net.param_views[name]) == np.float32(1) - np.float32(0.1) * np.float32(0.5)
                      if param.decayed else host(net.param_views[name]) == 1), name


@pytest.mark.parametrize("iteration,error,match", [
    (None, ValueError, "iteration must be a whole number >= 0, got None"),
    (-1, ValueError, "iteration must be a whole number >= 0, got -1"),
    (1.0, ValueError, "iteration must be a whole number >= 0, got 1.0"),
    (True, ValueError, "iteration must be a whole number >= 0, got True"),
])
def test_adamw_needs_the_iteration(iteration, error, match):
    net = _compiled("adamw")
    before = host(net.params).copy()
    with pytest.raises(error, match=re.escape(match)):
        AdamW(net).step(lr=1e-3, iteration=iteration)
    with pytest.raises(TypeError, match="iteration"):
        AdamW(net).step(lr=1e-3)
    assert np.array_equal(host(net.params), before)


@pytest.mark.parametrize("options,error,match", [
    (dict(beta1=1.0), ValueError, r"beta1 must be in \[0, 1\), got 1.0"),
    (dict(beta2=-0.1), ValueError, r"beta2 must be in \[0, 1\), got -0.1"),
    (dict(beta2="0.999"), TypeError, "beta2 must be a real number"),
    (dict(eps=0), ValueError, "eps must be finite and > 0, got 0"),
    (dict(eps=float("inf")), ValueError, "eps must be finite and > 0, got inf"),
    (dict(weight_decay=-0.05), ValueError, "weight_decay must be finite and >= 0"),
    (dict(clip_norm=0), ValueError, "clip_norm must be finite and > 0, got 0"),
    (dict(clip_norm=float("nan")), ValueError, "clip_norm must be finite and > 0, got nan"),
    (dict(clip_norm=float("inf")), ValueError, "clip_norm must be finite and > 0, got inf"),
    (dict(clip_norm=True), TypeError, "clip_norm must be a real number, got True"),
])
def test_adamw_refuses_hyperparameters_that_are_not_numbers_in_range(options, error, match):
    with pytest.raises(error, match=match):
        AdamW(_compiled("adamw"), **options)


def test_the_optimizers_need_their_buffers():
    with pytest.raises(RuntimeError, match="compile the net with optimizer='adamw'"):
        AdamW(_compiled("sgd"))
    for make in (SGD, AdamW):
        with pytest.raises(RuntimeError, match="clip_norm needs .*grad_norm=True"):
            make(_compiled("adamw", grad_norm=False), clip_norm=1.0)
        with pytest.raises(ValueError, match="clip_norm must be finite and > 0"):
            make(_compiled("adamw"), clip_norm=-1.0)
    net = _compiled("adamw")
    opt = AdamW(net, clip_norm=1.0)
    net.compile(pass_images=2, bits="4")  # an SGD arena now: a step says what is missing
    with pytest.raises(RuntimeError, match="optimizer='adamw'"):
        opt.step(lr=1e-3, iteration=0)
    net.compile(pass_images=2, bits="4", optimizer="adamw", training=False)
    with pytest.raises(RuntimeError, match="compiled for evaluation"):
        opt.step(lr=1e-3, iteration=0)


def _adamw_steps(net, opt, batches, first_iteration, *, lr=3e-3):
    losses = []
    for i, (x, y) in enumerate(batches):
        net.zero_grad()
        losses.append(net.forward(x, y)[0])
        net.backward()
        opt.step(lr=lr, iteration=first_iteration + i)
    return losses


def test_adamw_trains_a_tiny_net(rng):
    net = tiny_net().compile(pass_images=8, bits="4", seed=0, optimizer="adamw", grad_norm=True)
    opt = AdamW(net, clip_norm=5.0)
    x, y = tiny_batch(rng, 8)
    losses = _adamw_steps(net, opt, [(x, y)] * 30, 0, lr=3e-2)  # one batch, learnt by heart
    assert losses[-1] < 0.5 * losses[0] and all(b < a for a, b in zip(losses[:10], losses[1:10])), losses
    assert np.isfinite(opt.last_grad_norm) and opt.last_grad_norm > 0


def test_adamw_with_clipping_continues_bit_for_bit_from_its_state(rng):
    """The state (params, momentum = first moment, second moment, running statistics) and the iteration are all
    an AdamW run needs: a fresh compile loading it takes the uninterrupted run's steps exactly."""
    batches = [tiny_batch(rng, 4) for _ in range(6)]
    compile_options = dict(pass_images=4, bits="4", optimizer="adamw", grad_norm=True)
    options = dict(beta1=0.8, beta2=0.99, weight_decay=0.1, clip_norm=0.3)
    run = tiny_net().compile(**compile_options, seed=0)
    run_opt = AdamW(run, **options)
    _adamw_steps(run, run_opt, batches[:3], 0)
    state = run.state()
    assert any(k.startswith("second_moment/") for k in state) and any(k.startswith("momentum/") for k in state)
    assert max(np.abs(v).max() for k, v in state.items() if k.startswith("second_moment/")) > 0
    resumed = tiny_net().compile(**compile_options, seed=7)
    resumed.load_state(state)
    resumed_opt = AdamW(resumed, **options)
    norms = []
    for net, opt in ((run, run_opt), (resumed, resumed_opt)):
        _adamw_steps(net, opt, batches[3:], 3)
        norms.append(opt.last_grad_norm)
    assert norms[0] == norms[1] and norms[0] > options["clip_norm"]  # the last step clipped
    a, b = run.state(), resumed.state()
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_frozen_units_stay_exactly_as_they_were(rng, optimizer):
    """frozen=[...]: those units' parameters, momentum and second moment are left bit for bit; the others step as
    the reference steps them, clipped by the norm of their gradients alone (the frozen ones' cleared first)."""
    net = _compiled(optimizer)
    params, grads, first, second = _random_state(net, rng, scale=0.1)
    frozen = (0, len(net.units) - 1)  # the first unit and the classifier: stretches at both ends
    opt = (SGD(net, momentum=0.9, weight_decay=2e-4, clip_norm=1e-3, frozen=frozen) if optimizer == "sgd" else
           AdamW(net, **ADAMW, clip_norm=1e-3, frozen=frozen))
    trained, stopped = opt.stretches()
    mask = np.zeros(params.shape, bool)
    for part in stopped:
        mask[part] = True
    assert mask.any() and not mask.all() and len(stopped) == 3  # weights of both, then the classifier's bias ...
    assert sum(p.stop - p.start for p in trained + stopped) == net.num_parameters
    trained_grads = np.where(mask, 0, grads)
    opt.step(lr=0.1, iteration=3)
    if optimizer == "sgd":
        want = optim.sgd_momentum_ref(params, trained_grads, first, n_decay=net.num_decayed, lr=0.1, momentum=0.9,
                                      weight_decay=2e-4, clip_norm=1e-3)
        got = host(net.params), host(net.arena["velocity"])
        before = params, first
    else:
        want = optim.adamw_ref(params, trained_grads, first, second, n_decay=net.num_decayed, lr=0.1, iteration=3,
                               clip_norm=1e-3, **ADAMW)
        got = host(net.params), host(net.arena["velocity"]), host(net.arena["second_moment"])
        before = params, first, second
    for g, w, b in zip(got, want, before):
        assert np.array_equal(g[~mask], w[~mask]) and np.array_equal(g[mask], b[mask])
    assert opt.last_grad_norm == optim.grad_norm_ref(trained_grads)


def test_frozen_names_units_of_the_net():
    net = _net()
    with pytest.raises(ValueError, match="units 0 to 2"):
        SGD(net, frozen=[3])
    with pytest.raises(TypeError, match="list of unit indices"):
        SGD(net, frozen="0-1")
    assert SGD(net, frozen=[1, 0, 1]).frozen == (0, 1)
    assert SGD(net).stretches() == ([slice(0, net.num_parameters)], [])
