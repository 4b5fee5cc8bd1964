from minibp.net import Net


def build(*, input_shape, classes, width=16):
    net = Net(input_shape)
    net.conv(width, kernel=3)
    net.conv(width, kernel=3, stride=2)
    net.conv(width, kernel=3)
    net.classifier(classes)
    return net
