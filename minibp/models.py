"""The pre-activation bottleneck ResNets of the paper's experiments, by name: the CIFAR-shaped family
(the paper's recipe, docs/method.md) and the ImageNet family (its third experiment).

    resnet164 = preact_resnet(164)          # 9n+2 layers, n = 18 bottleneck blocks a stage
    net = by_name("resnet1001", classes=100)
    net = by_name("resnet20", input_shape=(28, 28, 1))
    net = by_name("resnet152", imagenet=True)   # 224x224x3, 1000 classes: imagenet_resnet(152)

CIFAR-shaped, resnet<9n+2>: stages of (bottleneck width, output channels) = (16, 64), (32, 128),
(64, 256) at spatial sizes H, H/2, H/4: a 3x3 conv to 16 channels on the data, then n blocks a stage
of BN-ReLU-conv1x1 -> BN-ReLU-conv3x3 (stride 2 in the first block of stages 2 and 3) ->
BN-ReLU-conv1x1, each block adding its input through the parameter-free shortcut, then
BN-ReLU -> global average pool -> fully connected.

ImageNet, resnet50/101/152 (He et al.'s bottleneck ResNets in pre-activation form): a 7x7 stride-2
conv to 64 channels on the data; the first block's first unit is BN-ReLU -> 3x3 stride-2 max pool ->
conv1x1; four stages of (3, 4, 6, 3), (3, 4, 23, 3) or (3, 8, 36, 3) blocks of widths 64, 128, 256,
512 with 4x wider outputs (256 ... 2048 channels), at 56, 28, 14, 7 pixels for a 224x224 input.
The stride 2 of stages 2-4 is on the first block's 3x3 conv (ResNet v1.5, torchvision's placement);
the first block of every stage changes the shape and adds a projection (a strided 1x1 conv of its
pre-activated input), the other blocks the identity.

The two families share the name resnet101 (9n+2 with n = 11): `imagenet=True` (the command lines'
--data imagenet) selects the ImageNet one, otherwise the name keeps its CIFAR meaning.

Your own net, by a model spec "FILE.py:FUNCTION", is minibp/run/modelspec.py's: a run records the
spec and builds the net again from it.
"""
import re

import numpy as np

from .net import Net

# The input shape and classes of each named data set's net, to plan it without the data (plan, plot, benches).
DATA_SHAPES = {"cifar10": ((32, 32, 3), 10), "cifar100": ((32, 32, 3), 100), "fashion-mnist": ((28, 28, 1), 10),
               "imagenet": ((224, 224, 3), 1000)}
STAGES = ((16, 64), (32, 128), (64, 256))  # (bottleneck width, block output channels)
IMAGENET_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}  # blocks a stage
IMAGENET_WIDTHS = (64, 128, 256, 512)  # bottleneck widths; each block outputs 4x as many channels
IMAGENET_NAMES = ", ".join(f"resnet{d}" for d in IMAGENET_BLOCKS)


def preact_resnet(depth, *, input_shape=(32, 32, 3), classes=10, dtype=np.float32, shortcut="parameter-free"):
    """The pre-activation bottleneck ResNet of depth 9n+2 as a minibp Net (not yet compiled)."""
    if depth < 11 or (depth - 2) % 9:
        raise ValueError(f"a bottleneck ResNet has depth 9n+2 with n >= 1 (11, 20, ..., 164, 1001), got {depth}")
    blocks = (depth - 2) // 9
    net = Net(input_shape, dtype=dtype)
    net.conv(16, kernel=3)
    for stage, (width, channels) in enumerate(STAGES):
        for block in range(blocks):
            with net.residual(shortcut=shortcut):
                net.conv(width, kernel=1)
                net.conv(width, kernel=3, stride=2 if stage > 0 and block == 0 else 1)
                net.conv(channels, kernel=1)
    net.classifier(classes)
    return net


def bottleneck_resnet(blocks, widths, *, stem=64, input_shape=(224, 224, 3), classes=1000, dtype=np.float32):
    """The ImageNet-shaped pre-activation bottleneck ResNet: a 7x7/2 conv to `stem` channels, a 3x3/2 max
    pool in the first unit, then blocks[s] bottleneck blocks of width widths[s] (outputs 4 * widths[s])
    a stage, stride 2 on the 3x3 conv of each later stage's first block, a projection shortcut in the
    first block of every stage and the identity elsewhere. imagenet_resnet() gives the standard sizes;
    small ones serve the gradient checks."""
    if len(blocks) != len(widths) or not blocks or min(blocks) < 1:
        raise ValueError(f"give one positive block count per stage width, got blocks {blocks}, widths {widths}")
    net = Net(input_shape, dtype=dtype)
    net.conv(stem, kernel=7, stride=2)
    for stage, (count, width) in enumerate(zip(blocks, widths)):
        for block in range(count):
            with net.residual(shortcut="projection" if block == 0 else "parameter-free"):
                net.conv(width, kernel=1, pool="max" if stage == block == 0 else None)
                net.conv(width, kernel=3, stride=2 if stage > 0 and block == 0 else 1)
                net.conv(4 * width, kernel=1)
    net.classifier(classes)
    return net


def imagenet_resnet(depth, *, input_shape=(224, 224, 3), classes=1000, dtype=np.float32):
    """ResNet-50, -101 or -152 for ImageNet, in pre-activation form (see the module docstring)."""
    if depth not in IMAGENET_BLOCKS:
        raise ValueError(f"the ImageNet ResNets have depth 50, 101 or 152, got {depth}")
    return bottleneck_resnet(IMAGENET_BLOCKS[depth], IMAGENET_WIDTHS, input_shape=input_shape, classes=classes,
                             dtype=dtype)


def depth_of(name, *, imagenet=False):
    """The depth a model name gives (resnet<9n+2>, or with imagenet=True resnet50/101/152), or a ValueError
    that says which names exist for this kind of data."""
    match = re.fullmatch(r"resnet(\d+)", str(name))
    depth = int(match.group(1)) if match else None
    cifar = depth is not None and depth >= 11 and (depth - 2) % 9 == 0
    if imagenet and depth not in IMAGENET_BLOCKS:
        also = " (a CIFAR-shaped ResNet)" if cifar else ""
        raise ValueError(f"model {name!r}{also} is not an ImageNet ResNet: on ImageNet use {IMAGENET_NAMES}")
    if not imagenet and not cifar:
        also = (f" ({name} is an ImageNet ResNet: it needs ImageNet data, --data imagenet)"
                if depth in IMAGENET_BLOCKS else "")
        raise ValueError(f"unknown model {name!r}: use resnet<depth> with depth = 9n+2 (resnet11, resnet20, "
                         f"resnet164, resnet1001, ...){also}")
    return depth


def by_name(name, *, imagenet=False, **options):
    """'resnet<9n+2>' (resnet20, resnet164, resnet1001, ...) -> preact_resnet(9n+2, **options); with
    imagenet=True, 'resnet50', 'resnet101' or 'resnet152' -> imagenet_resnet(depth, **options)."""
    depth = depth_of(name, imagenet=imagenet)
    return imagenet_resnet(depth, **options) if imagenet else preact_resnet(depth, **options)
