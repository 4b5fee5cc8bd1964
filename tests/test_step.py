"""The training step: eager execution equals the hand-written loop; the replayed step (graph=True: a CUDA graph on a
GPU, its stand-in on the CPU) equals eager steps bit for bit on the CPU, whatever the optimizer and rounding. The
optimizer's step takes the run's iteration (AdamW's bias correction)."""
import numpy as np
import pytest

from minibp import backend, quant, train
from minibp.run import checkpoint
from minibp.optim import SGD, AdamW
from minibp.step import TrainStep, graph_capture_refused
from conftest import device, host
from nets import tiny_resnet
from runs import base_args, make_dataset


def net_and_opt(pass_images=4, seed=1):
    net = tiny_resnet(classes=3).compile(pass_images=pass_images, bits=4, seed=seed)
    return net, SGD(net, momentum=0.9, weight_decay=2e-4)


def batches(rng, count, n):
    return [(device(rng.standard_normal((n, 8, 8, 3)).astype(np.float32)), rng.integers(0, 3, n))
            for _ in range(count)]


def test_an_eager_step_is_the_hand_written_loop(rng):
    data = batches(rng, 4, 8)
    net, opt = net_and_opt()
    step = TrainStep(net, opt, sub_batches=2)
    results = []
    for images, labels in data:
        step.run(images, labels, lr=0.05)
        results.append(step.result())
    ref, ref_opt = net_and_opt()
    ref_results = []
    for images, labels in data:
        ref.zero_grad()
        halves = []
        for i in (0, 4):
            halves.append(ref.forward(images[i:i + 4], labels[i:i + 4]))
            ref.backward(loss_scale=0.5)
        ref_opt.step(lr=0.05)
        ref_results.append(tuple(np.mean(halves, axis=0)))
    assert np.array_equal(host(net.params), host(ref.params))
    assert results == ref_results


def needs_graphs():
    """Skips a test of graph replay where this CuPy cannot capture a step (graph_capture_refused says why)."""
    if backend.device == "gpu" and graph_capture_refused():
        pytest.skip(f"this CuPy cannot capture a step as a CUDA graph: {graph_capture_refused()}")


def _stores(net):
    """Every unit's store, windows and statistics, as host bytes."""
    kept = (".x_copy", ".codes", ".windows", ".stats")
    return {name: host(view).copy() for name, view in net.arena.views.items() if name.endswith(kept)}


@pytest.mark.parametrize("optimizer,rounding,sub_batches", [("sgd", "nearest", 1), ("sgd-clip", "stochastic", 2),
                                                           ("adamw", "nearest", 2), ("adamw", "stochastic", 1)])
def test_a_replayed_step_is_the_eager_step_bit_for_bit(rng, optimizer, rounding, sub_batches):
    """The whole step recorded once and replayed (graph=True: a CUDA graph on a GPU, on the CPU its stand-in)
    gives eager steps' losses, weights, optimizer state, running statistics and stores, bit for bit, through a
    learning-rate change, AdamW's bias corrections and stochastic rounding's draws, all read on the device."""
    needs_graphs()
    data = batches(rng, 4, 4 * sub_batches)
    finals = []
    for graph in (False, True):
        net = tiny_resnet(classes=3).compile(pass_images=4, bits=2 if rounding == "stochastic" else 4,
                                             rounding=rounding, seed=1,
                                             optimizer="adamw" if optimizer == "adamw" else "sgd",
                                             grad_norm=optimizer != "sgd")
        opt = AdamW(net, clip_norm=0.5) if optimizer == "adamw" else SGD(net, clip_norm=0.5 if optimizer == "sgd-clip"
                                                                          else None)
        step = TrainStep(net, opt, sub_batches=sub_batches, graph=graph)
        assert step.replay == graph and step.graph == (graph and backend.device == "gpu")
        losses = []
        for iteration, (images, labels) in enumerate(data, start=3):
            step.run(images, labels, lr=0.05 if iteration < 5 else 0.01, iteration=iteration)
            losses.append(step.result())
        finals.append((losses, net.state(), _stores(net), opt.last_grad_norm))
    (losses, state, stores, norm), (losses_r, state_r, stores_r, norm_r) = finals
    if backend.device == "cpu":
        assert losses == losses_r and norm == norm_r
        assert all(np.array_equal(state[k], state_r[k]) for k in state)
        assert all(np.array_equal(stores[k], stores_r[k]) for k in stores)
    else:
        np.testing.assert_allclose(losses_r, losses, rtol=1e-5)


def test_a_replayed_step_of_a_mix_is_the_eager_step_bit_for_bit(rng):
    """A store a unit (a memory budget's mix: exact, 8, 4 and 2 bits, rounding at random): replayed as eager."""
    needs_graphs()
    data = batches(rng, 3, 8)
    finals = []
    for graph in (False, True):
        units = len(tiny_resnet(classes=3).units)
        mix = [quant.Store(("exact", "8", "4", "2")[i % 4], rounding="nearest" if i % 4 == 0 else "stochastic")
               for i in range(units)]
        net = tiny_resnet(classes=3).compile(pass_images=4, store=mix, seed=1)
        step = TrainStep(net, SGD(net), sub_batches=2, graph=graph)
        for iteration, (images, labels) in enumerate(data):
            step.run(images, labels, lr=0.05, iteration=iteration)
        finals.append((step.result(), net.state(), _stores(net)))
    (loss, state, stores), (loss_r, state_r, stores_r) = finals
    if backend.device == "cpu":
        assert loss == loss_r
        assert all(np.array_equal(state[k], state_r[k]) for k in state)
        assert all(np.array_equal(stores[k], stores_r[k]) for k in stores)
    else:
        np.testing.assert_allclose(loss_r, loss, rtol=1e-5)


@pytest.mark.gpu
def test_graph_mode_is_refused_in_one_line_where_this_cupy_cannot_capture_a_step():
    if not graph_capture_refused():
        pytest.skip("this CuPy captures a step: the graph tests run")
    net, opt = net_and_opt()
    with pytest.raises(ValueError, match=r"cannot capture a training step as a CUDA graph .*: train without --graph"):
        TrainStep(net, opt, graph=True)


def test_a_step_refuses_a_batch_of_the_wrong_size(rng):
    net, opt = net_and_opt()
    with pytest.raises(ValueError, match="2 x 4 images"):
        TrainStep(net, opt, sub_batches=2).run(*batches(rng, 1, 4)[0], lr=0.1)


@pytest.mark.parametrize("shape,dtype", [((4, 1, 8, 3), np.float32), ((4, 8, 1, 3), np.float32),
                                         ((4, 8, 8, 1), np.float32), ((4, 8, 8, 3), np.float64)])
def test_a_replayed_step_refuses_images_of_another_shape_as_the_eager_step_does(rng, shape, dtype):
    # The replayed step copied them into its staging buffer, which broadcast an image of 1 x 8 pixels, say
    needs_graphs()
    images, labels = device(rng.standard_normal(shape).astype(dtype)), rng.integers(0, 3, shape[0])
    refusals = []
    for graph in (False, True):
        net, opt = net_and_opt()
        before = host(net.params).copy()
        with pytest.raises(ValueError) as refused:
            TrainStep(net, opt, graph=graph).run(images, labels, lr=0.1)
        refusals.append(str(refused.value))
        assert np.array_equal(host(net.params), before)  # nothing ran
    assert refusals[0] == refusals[1] and refusals[0].startswith("images must be "), refusals


def test_a_step_goes_on_after_its_net_is_compiled_again(rng):
    # A replayed step kept its staging buffers and program of the old arena: NumPy's broadcast error, or a replay
    # of buffers the net no longer uses
    needs_graphs()
    first, later = batches(rng, 1, 4), batches(rng, 2, 8)
    params = []
    for graph in (False, True):
        net, opt = net_and_opt()
        step = TrainStep(net, opt, graph=graph)
        step.run(*first[0], lr=0.1, iteration=0)
        net.compile(pass_images=8, bits=4)
        for i, (images, labels) in enumerate(later):
            step.run(images, labels, lr=0.1, iteration=1 + i)
        params.append(host(net.params).copy())
        net.compile(pass_images=8, bits=4, training=False)
        with pytest.raises(RuntimeError, match="TrainStep needs a net compiled for training"):
            step.run(*later[0], lr=0.1)
    assert np.array_equal(*params)


def test_forward_without_sync_leaves_the_loss_on_the_device(rng):
    net, _ = net_and_opt()
    (images, labels), = batches(rng, 1, 4)
    loss, accuracy = net.forward(images, labels, sync=False)
    assert np.ndim(loss) == 0 and (backend.device == "cpu" or backend.is_device_array(loss))
    net.backward()
    assert float(loss) == net.forward(images, labels)[0]


def test_the_trainer_with_graph_gives_the_same_run(tmp_path):
    needs_graphs()
    make_dataset(tmp_path / "data")
    assert train.main(base_args(tmp_path, out="eager", iters=4, val_every=4)) == 0
    assert train.main(base_args(tmp_path, out="graph", iters=4, val_every=4) + ["--graph"]) == 0
    a, b = (checkpoint.load(tmp_path / run / "checkpoint.h5") for run in ("eager", "graph"))
    assert b.config["graph"] is True
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [1, 2])
def test_graph_replay_gives_the_losses_of_eager_execution(rng, split):
    """20 steps through one learning-rate change: the graph's losses are eager execution's, to rounding."""
    needs_graphs()
    data = batches(rng, 20, 4 * split)
    losses = {}
    for graph in (False, True):
        net, opt = net_and_opt()
        step = TrainStep(net, opt, sub_batches=split, graph=graph)
        losses[graph] = []
        for i, (images, labels) in enumerate(data):
            step.run(images, labels, lr=0.05 if i < 10 else 0.01)
            losses[graph].append(step.result())
        assert step.graph == graph
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)


def adamw_net_and_opt(pass_images=4, seed=1):
    net = tiny_resnet(classes=3).compile(pass_images=pass_images, bits=4, seed=seed, optimizer="adamw", grad_norm=True)
    return net, AdamW(net, clip_norm=1.0)


def test_an_adamw_step_takes_the_runs_iteration(rng):
    data = batches(rng, 3, 8)
    net, opt = adamw_net_and_opt()
    step = TrainStep(net, opt, sub_batches=2)
    for iteration, (images, labels) in enumerate(data, start=5):  # a run resumed at iteration 5
        step.run(images, labels, lr=1e-3, iteration=iteration)
    ref, ref_opt = adamw_net_and_opt()
    for iteration, (images, labels) in enumerate(data, start=5):
        ref.zero_grad()
        for i in (0, 4):
            ref.forward(images[i:i + 4], labels[i:i + 4], draw=iteration * 2 + i // 4)
            ref.backward(loss_scale=0.5)
        ref_opt.step(lr=1e-3, iteration=iteration)
    assert np.array_equal(host(net.params), host(ref.params))
    assert opt.last_grad_norm == ref_opt.last_grad_norm


def test_an_adamw_step_without_its_iteration_is_refused_before_it_runs(rng):
    net, opt = adamw_net_and_opt()
    before = net.state()
    with pytest.raises(ValueError, match=r"AdamW needs run\(..., iteration=\)"):
        TrainStep(net, opt, sub_batches=2).run(*batches(rng, 1, 8)[0], lr=1e-3)
    after = net.state()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_the_default_replays_where_a_gpu_can_capture_and_ranks_step_eagerly():
    net, opt = net_and_opt()
    default = TrainStep(net, opt)
    assert default.graph == default.replay == (backend.device == "gpu" and not graph_capture_refused())
    assert not TrainStep(net, opt, graph=False).replay
    with pytest.raises(TypeError, match="graph must be True, False or None"):
        TrainStep(net, opt, graph="yes")


@pytest.mark.gpu
def test_a_graph_replays_a_clipped_sgd_step(rng):
    """The norm is computed and read on the device, so a captured step clips as eager execution does."""
    needs_graphs()
    data = batches(rng, 6, 4)
    results = {}
    for graph in (False, True):
        net = tiny_resnet(classes=3).compile(pass_images=4, bits=4, seed=1, grad_norm=True)
        opt = SGD(net, clip_norm=0.5)
        step = TrainStep(net, opt, graph=graph)
        for images, labels in data:
            step.run(images, labels, lr=0.05)
        results[graph] = (*step.result(), opt.last_grad_norm)
        assert step.graph == graph
    np.testing.assert_allclose(results[True], results[False], rtol=1e-5)
