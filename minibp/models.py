"""The pre-activation bottleneck ResNets of the paper's recipe (docs/method.md), by name.

    resnet164 = preact_resnet(164)          # 9n+2 layers, n = 18 bottleneck blocks a stage
    net = by_name("resnet1001", classes=100)
    net = by_name("resnet20", input_shape=(28, 28, 1))

Stages of (bottleneck width, output channels) = (16, 64), (32, 128), (64, 256) at spatial sizes
H, H/2, H/4: a 3x3 conv to 16 channels on the data, then n blocks a stage of
BN-ReLU-conv1x1 -> BN-ReLU-conv3x3 (stride 2 in the first block of stages 2 and 3) ->
BN-ReLU-conv1x1, each block adding its input through the parameter-free shortcut, then
BN-ReLU -> global average pool -> fully connected.
"""
import re

import numpy as np

from .net import Net

STAGES = ((16, 64), (32, 128), (64, 256))  # (bottleneck width, block output channels)


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


def depth_of(name):
    """'resnet<9n+2>' -> 9n+2, or a ValueError that says which names exist."""
    match = re.fullmatch(r"resnet(\d+)", str(name))
    if not match or int(match.group(1)) < 11 or (int(match.group(1)) - 2) % 9:
        raise ValueError(f"unknown model {name!r}: use resnet<depth> with depth = 9n+2 (resnet11, resnet20, "
                         "resnet164, resnet1001, ...)")
    return int(match.group(1))


def by_name(name, **options):
    """'resnet<9n+2>' (resnet20, resnet164, resnet1001, ...) -> preact_resnet(9n+2, **options)."""
    return preact_resnet(depth_of(name), **options)
