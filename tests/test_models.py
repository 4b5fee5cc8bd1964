"""The ResNets by name: the CIFAR family (both shortcut kinds) and the ImageNet bottleneck family (shapes and
parameters against their description, gradients of a small one, names that would mislead refused). (Your own
net by FILE.py:FUNCTION: tests/test_own_net.py.)"""
import numpy as np
import pytest

from minibp import models
from minibp.models import preact_resnet
from minibp.optim import SGD
from conftest import device, host
from gradcheck import relative_error
from nets import tiny_batch


# ----------------------------------------------------------------------------- the CIFAR family

@pytest.mark.parametrize("depth", [11, 20])
def test_projection_resnets_train(rng, depth):
    net = preact_resnet(depth, input_shape=(8, 8, 3), classes=3, shortcut="projection").compile(pass_images=4, bits="4")
    opt = SGD(net)
    x, y = tiny_batch(rng)
    losses = []
    for _ in range(3):
        net.zero_grad()
        losses.append(net.forward(x, y)[0])
        net.backward()
        opt.step(lr=0.05)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


# ----------------------------------------------------------------------------- the ImageNet family

TORCHVISION = {50: 25_557_032, 101: 44_549_160, 152: 60_192_808}  # its v1 ResNets' parameters: a sanity check
WIDTHS = (64, 128, 256, 512)


def expected_architecture(blocks, size=224):
    """(parameters, batch-normalised unit inputs (H, W, C)) of the pre-activation bottleneck ResNet,
    counted from its description: the 7x7/2 stem, max pool, bottlenecks, projections, classifier."""
    parameters, inputs = 7 * 7 * 3 * 64, []
    channels, side = 64, size // 2                     # the stem's output
    for stage, (count, width) in enumerate(zip(blocks, WIDTHS)):
        half = side // 2  # stage 1: the first unit's max pool; later stages: the first block's 3x3 conv
        for block in range(count):
            unit1 = side if block == 0 else half           # a stage's first block reads the previous size
            unit2 = side if block == 0 and stage > 0 else half
            inputs += [(unit1, unit1, channels), (unit2, unit2, width), (half, half, width)]
            parameters += 2 * channels + channels * width        # BN-ReLU-conv1x1
            parameters += 2 * width + 9 * width * width          # BN-ReLU-conv3x3
            parameters += 2 * width + width * 4 * width          # BN-ReLU-conv1x1 to 4x the width
            if block == 0:
                parameters += channels * 4 * width        # the projection, a 1x1 conv
            channels = 4 * width
        side = half
    inputs.append((side, side, channels))
    return parameters + 2 * channels + channels * 1000 + 1000, inputs


@pytest.mark.parametrize("depth", [50, 101, 152])
def test_imagenet_resnets_have_the_standard_shapes_and_parameters(depth):
    net = models.by_name(f"resnet{depth}", imagenet=True)
    blocks = models.IMAGENET_BLOCKS[depth]
    parameters, inputs = expected_architecture(blocks)
    assert len(net.units) == depth == 3 * sum(blocks) + 2
    assert net.num_parameters == parameters
    assert abs(parameters / TORCHVISION[depth] - 1) < 1e-3  # BN on unit inputs instead of conv outputs
    stem, first = net.units[0], net.units[1]
    assert (stem.conv.kh, stem.conv.stride, stem.out_shape, stem.batchnorm) == (7, 2, (112, 112, 64), False)
    assert first.conv_in_shape == (56, 56, 64)  # BN-ReLU, then the 3x3/2 max pool
    assert [u.in_shape for u in net.units if u.batchnorm] == inputs
    ends = [u.out_shape for u in net.units[1:-1]]
    assert [ends[3 * sum(blocks[:s + 1]) - 1] for s in range(4)] == [(56, 56, 256), (28, 28, 512), (14, 14, 1024),
                                                                    (7, 7, 2048)]
    projected = [u.index for u in net.units if u.projection is not None]
    assert projected == [1 + 3 * sum(blocks[:s]) for s in range(4)]
    assert [net.units[i].projection.stride for i in projected] == [1, 2, 2, 2]
    assert net.units[-1].in_shape == (7, 7, 2048) and net.classes == 1000
    stores = net.plan(pass_images=256, bits="4", window="range").bytes_by_category()["activation stores"]  # planned
    assert stores == sum(256 * h * w * c // 2 for h, w, c in inputs)


def test_resnet101_keeps_its_cifar_meaning_and_misused_names_are_refused():
    cifar, ours = models.by_name("resnet101"), models.by_name("resnet101", imagenet=True)
    assert (cifar.input_shape, cifar.units[0].conv.kh, cifar.classes) == ((32, 32, 3), 3, 10)
    assert (ours.input_shape, ours.units[0].conv.kh, ours.classes) == ((224, 224, 3), 7, 1000)
    with pytest.raises(ValueError, match="needs ImageNet data, --data imagenet"):
        models.by_name("resnet152")
    with pytest.raises(ValueError, match="not an ImageNet ResNet: on ImageNet use resnet50, resnet101, resnet152"):
        models.by_name("resnet164", imagenet=True)


def test_a_tiny_imagenet_resnet_matches_finite_differences_in_float64(rng):
    """The ImageNet builder's path (7x7/2 stem, max pool, projections, identity blocks) at 16x16."""
    net = models.bottleneck_resnet((2, 1), (4, 8), stem=4, input_shape=(16, 16, 3), classes=3, dtype=np.float64)
    net.compile(pass_images=2, bits="exact", seed=5, input_grad=True)
    x, y = device(rng.standard_normal((2, 16, 16, 3))), rng.integers(0, 3, 2)
    net.forward(x, y)
    net.backward()
    loss = lambda: net.forward(x, y)[0]  # noqa: E731
    h = 1e-5
    for name, analytic in list(net.grad_views.items()) + [("input", net.arena["input_grad"])]:
        values = net.param_views[name] if name != "input" else x
        flat, picks = values.reshape(-1), rng.choice(values.size, min(values.size, 8), replace=False)
        numeric = []
        for i in picks:
            old = float(flat[i])
            flat[i] = old + h
            plus = loss()
            flat[i] = old - h
            numeric.append((plus - loss()) / (2 * h))
            flat[i] = old
        analytic = host(analytic).reshape(-1)[picks]  # (some are 0: a shift the next BN takes out again)
        assert relative_error(analytic, numeric) < 1e-6 or np.abs(analytic - numeric).max() < 1e-9, name
