"""The cuDNN path's graph descriptions, built on the CPU as far as the frontend allows without a GPU
(validating and planning them needs a device: tests/test_gpu.py)."""
import json

import pytest

from minibp import models
from minibp.layers.conv_cudnn import ConvGraphs, krsc, nhwc
from nets import small_net

pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend is not installed (.ci/run installs it)")


def described(tensor):
    return tensor.get_dim(), tensor.get_stride()


def every_conv(net):
    convs = [u.conv for u in net.units if not u.is_classifier]
    return convs + [u.projection for u in net.units if u.projection is not None]


@pytest.mark.parametrize("make", [lambda: models.preact_resnet(20), lambda: models.preact_resnet(
    11, input_shape=(28, 28, 1)), small_net])
def test_every_graph_of_a_net_describes_nhwc_tensors(make):
    net = make()
    for conv in every_conv(net):
        graphs = ConvGraphs(conv, batch=4)
        g, t = graphs.graphs["fprop"]
        assert list(described(t["y"])) == list(nhwc(4, conv.Ho, conv.Wo, conv.cout))
        assert list(described(t["x"])) == list(nhwc(4, conv.H, conv.W, conv.cin))
        assert list(described(t["w"])) == list(krsc(conv.cout, conv.kh, conv.kw, conv.cin))
        g, t = graphs.graphs["dgrad"]
        assert list(described(t["dx"])) == list(nhwc(4, conv.H, conv.W, conv.cin))
        g, t = graphs.graphs["wgrad"]
        assert list(described(t["dw"])) == list(krsc(conv.cout, conv.kh, conv.kw, conv.cin))


def test_padding_is_tensorflows_same():
    """A stride-2 3x3 'same' conv of an even size pads 0 before and 1 after, as the GEMM path does."""
    net = models.preact_resnet(20)
    conv = next(u.conv for u in net.units if u.conv.stride == 2)
    assert (conv.pad_top, conv.pad_left) == (0, 0)
    for name, (graph, _) in ConvGraphs(conv, batch=2).graphs.items():
        [node] = json.loads(str(graph))["nodes"]
        assert node["params"]["pre_padding"] == [0, 0] and node["params"]["post_padding"] == [1, 1], name
        assert node["params"]["stride"] == [2, 2]


def test_layout_helpers():
    assert nhwc(2, 3, 5, 7) == ([2, 7, 3, 5], [105, 1, 35, 7])
    assert krsc(8, 3, 3, 4) == ([8, 4, 3, 3], [36, 1, 12, 4])
