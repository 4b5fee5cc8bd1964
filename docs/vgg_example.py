"""A net of your own under the trainer: a small VGG-style chain, no residuals, max pooling between stages.

    python3 -m minibp.train --data fashion-mnist --model docs/vgg_example.py:build --model-arg width=16 \\
        --iters 800 --lr-schedule cosine:0.05:warmup=50 --val-every 200 --out runs/fm-vgg
    python3 -m minibp.evaluate runs/fm-vgg

The trainer calls build(input_shape=..., classes=..., width=16) with the data's image shape and class
count and the --model-arg values, and compiles, trains, checkpoints and resumes the net it returns.
Each unit is BN -> ReLU -> [3x3/2 max pool] -> 3x3 conv (README, The API); the first, on the data, is a
bare conv; a stage's first unit pools and doubles the width:

    stage 0   conv w, conv w              28x28 (Fashion-MNIST)
    stage 1   pool, conv 2w, conv 2w      14x14
    stage 2   pool, conv 4w, conv 4w      7x7
    classifier: BN -> ReLU -> global average pool -> fully connected
"""
from minibp.net import Net


def build(*, input_shape, classes, width=16, stages=3, convs=2):
    """The VGG-style net for images of input_shape (H, W, C) and `classes` classes, uncompiled. width: the
    first stage's channels (a multiple of 4, which the 2-bit store needs); stages: stages of `convs` 3x3
    convolutions, each stage after the first halving the image with a max pool and doubling the width."""
    if width < 1 or stages < 1 or convs < 1:
        raise ValueError(f"width, stages and convs must be positive, got {width}, {stages}, {convs}")
    net = Net(input_shape)
    net.conv(width, kernel=3)  # unit 0, on the data: no batch norm
    for stage in range(stages):
        for i in range(1 if stage == 0 else 0, convs):  # stage 0's first conv is unit 0
            net.conv(width * 2 ** stage, kernel=3, pool="max" if stage > 0 and i == 0 else None)
    net.classifier(classes)
    return net
