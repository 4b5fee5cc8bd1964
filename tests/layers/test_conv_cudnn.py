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
        graphs = ConvGraphs(conv, pass_images=4)
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
    for name, (graph, _) in ConvGraphs(conv, pass_images=2).graphs.items():
        [node] = json.loads(str(graph))["nodes"]
        assert node["params"]["pre_padding"] == [0, 0] and node["params"]["post_padding"] == [1, 1], name
        assert node["params"]["stride"] == [2, 2]


def test_layout_helpers():
    assert nhwc(2, 3, 5, 7) == ([2, 7, 3, 5], [105, 1, 35, 7])
    assert krsc(8, 3, 3, 4) == ([8, 4, 3, 3], [36, 1, 12, 4])


def test_float32_convolutions_drop_the_tf32_plans_after_the_heuristics_and_the_opt_in_keeps_them(monkeypatch):
    """build() deselects the plans whose numerical notes say TF32 (TENSOR_CORE, DOWN_CONVERT_INPUTS), reduced
    precision or nondeterminism, between the heuristics' proposal and the support check; cudnn-tf32 keeps the TF32
    ones. (Stand-ins record the calls: validating and building plans needs a GPU.)"""
    import cudnn

    class Graph:
        def __init__(self):
            self.calls = []

        def __getattr__(self, name):
            return lambda *args: self.calls.append((name, args)) or 0

    net = models.preact_resnet(11)
    for tf32 in (False, True):
        graphs = ConvGraphs(net.units[1].conv, pass_images=2, tf32=tf32)
        graphs.graphs = {name: (Graph(), tensors) for name, (_, tensors) in graphs.graphs.items()}
        graphs.build(handle=None)
        for g, _ in graphs.graphs.values():
            names = [name for name, _ in g.calls]
            assert names.index("create_execution_plans") < names.index("deselect_numeric_notes") < \
                names.index("check_support")
            [dropped] = [args[0] for name, args in g.calls if name == "deselect_numeric_notes"]
            tensor_core = cudnn.numerical_note.TENSOR_CORE in dropped
            assert tensor_core != tf32 and cudnn.numerical_note.NONDETERMINISTIC in dropped
