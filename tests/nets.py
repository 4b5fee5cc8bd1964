"""The small nets the tests build, each defined once, and the random batches and steps that go with them."""
import numpy as np

from minibp import models
from minibp.net import Net
from minibp.optim import SGD
from conftest import device


def tiny_net(*, dtype=np.float32):
    """A conv on 8x8x3 images, one identity block and a 3-class classifier."""
    net = Net((8, 8, 3), dtype=dtype)
    net.conv(8, kernel=3)
    with net.residual():
        net.conv(8, kernel=3)
    net.classifier(3)
    return net


def tiny_batch(rng, n=4):
    """n random images and labels for tiny_net, the images on the device."""
    return device(rng.standard_normal((n, 8, 8, 3)).astype(np.float32)), rng.integers(0, 3, n)


def train_steps(net, rng, steps=3, n=4):
    """steps SGD steps of net (8x8x3 images, 3 classes: tiny_net) on random batches of n."""
    opt = SGD(net)
    for _ in range(steps):
        x, y = device(rng.standard_normal((n, 8, 8, 3)).astype(np.float32)), rng.integers(0, 3, n)
        net.zero_grad()
        net.forward(x, y)
        net.backward()
        opt.step(lr=0.1)


def small_net(*, dtype=np.float32, classes=5):
    """Both shortcut kinds, a stride-2 stage, an identity block, max pooling and the loss."""
    net = Net((8, 8, 3), dtype=dtype)
    net.conv(8, kernel=3)                                  # unit 0, on the data
    with net.residual():                                   # identity shortcut
        net.conv(8, kernel=3)
    with net.residual():                                   # parameter-free, stride 2 and 8 -> 16 channels
        net.conv(4, kernel=1)
        net.conv(4, kernel=3, stride=2)
        net.conv(16, kernel=1)
    with net.residual(shortcut="projection"):              # projection, after max pooling
        net.conv(8, kernel=3, pool="max")
    net.classifier(classes)
    return net


def tiny_resnet(*, channels=3, classes=10):
    """The CIFAR family's smallest ResNet, 11 units, on 8x8 images: with channels=3, classes=4 the net that
    --model resnet11 trains on the tests' data set (runs.make_dataset)."""
    return models.preact_resnet(11, input_shape=(8, 8, channels), classes=classes)


def resnet20_16x16():
    """ResNet-20 on 16x16x3 images, 10 classes: the paper's net at a quarter of the area."""
    return models.preact_resnet(20, input_shape=(16, 16, 3))


def odd_net():
    """3 channels: no k-bit store takes them (a code byte holds 8 / k channels of a row), the exact one does."""
    net = Net((4, 4, 3))
    net.conv(3)
    net.classifier(2)
    return net
