"""chain.py: what building a net leaves on its units for the schedule (the attributes units.Unit declares),
and every way of building one wrongly, refused with a ValueError that says why. (The schedule that reads the
attributes is tested through gradients in tests/test_net.py.)"""
import pytest

from minibp.net import Net
from nets import small_net


def wiring(net):
    return [(u.index, u.saves_input, type(u.shortcut).__name__ if u.shortcut else None, u.adds_projection,
             getattr(u, "projection", None) is not None) for u in net.units]


def test_each_block_marks_its_first_unit_and_the_unit_after_it():
    net = small_net()
    assert wiring(net) == [
        (0, False, None, False, False),                       # on the data
        (1, True, None, False, False),                        # identity block: saves its input ...
        (2, True, "ParameterFreeShortcut", False, False),     # ... which this unit adds; and starts the next
        (3, False, None, False, False),
        (4, False, None, False, False),
        (5, False, "ParameterFreeShortcut", False, True),     # adds the stride-2 residual; starts a projection
        (6, False, None, True, False),                        # the classifier adds the projection
    ]
    assert net.units[2].shortcut.is_identity and not net.units[5].shortcut.is_identity
    assert net.units[5].shortcut.stride == 2 and net.classes == 5


def test_the_chain_passes_each_unit_the_shape_before_it():
    net = small_net()
    for before, after in zip(net.units, net.units[1:]):
        assert after.in_shape == before.out_shape
    assert net.units[0].in_shape == (8, 8, 3)


def started(*, units=1):
    net = Net((8, 8, 3))
    for _ in range(units):
        net.conv(4)
    return net


def test_a_bad_chain_is_refused_where_it_goes_wrong():
    with pytest.raises(ValueError, match="a residual block needs a unit on the data before it"):
        with Net((8, 8, 3)).residual():
            pass
    with pytest.raises(ValueError, match="a residual block needs at least one unit"):
        with started().residual():
            pass
    net = started()
    with pytest.raises(ValueError, match="residual blocks cannot nest"):
        with net.residual():
            with net.residual():
                pass
    with pytest.raises(ValueError, match="shortcut must be 'parameter-free' or 'projection', got 'dense'"):
        with started().residual(shortcut="dense"):
            pass
    net = started()
    with pytest.raises(ValueError, match="the channels must not shrink"):
        with net.residual():
            net.conv(2)
    with pytest.raises(ValueError, match="pool must be None, 'max' or 'avg', got 'min'"):
        started().conv(4, pool="min")
    net = started()
    with pytest.raises(ValueError, match="close the residual block before the classifier"):
        with net.residual():
            net.conv(4)
            net.classifier(3)
    with pytest.raises(ValueError, match="a classifier needs at least 2 classes, got 1"):
        started().classifier(1)
    net = started()
    net.classifier(3)
    with pytest.raises(ValueError, match="the net already has a classifier"):
        net.classifier(3)
    with pytest.raises(ValueError, match="the classifier ends the net"):
        net.conv(4)


def test_a_unit_built_for_another_shape_is_refused():
    other = Net((4, 4, 3))
    unit = other.conv(4)
    with pytest.raises(ValueError, match=r"the unit takes \(4, 4, 3\), the chain gives \(8, 8, 4\)"):
        started().add(unit)


@pytest.mark.parametrize("bad", [8.5, True, 0, "8"])
def test_a_channel_count_must_be_a_whole_number(bad):
    # int() made conv(8.5) a conv of 8 channels while the caller recorded 8.5
    net = Net(input_shape=(8, 8, 3))
    with pytest.raises(ValueError, match=f"a conv's channels must be a positive integer, got {bad!r}"):
        net.conv(bad)
    net.conv(8)
    with pytest.raises(ValueError, match="kernel must be a positive integer, got 2.5"):
        net.conv(8, kernel=2.5)
    with pytest.raises(ValueError, match="classes must be a positive integer, got 3.5"):
        net.classifier(3.5)


def test_a_nets_recipe_builds_the_same_net_and_a_custom_unit_has_none(rng):
    """Net.structure() keeps the calls that built a net as data and Net.from_structure() builds it again: both
    shortcut kinds, max pooling, a stride, a ReluConvUnit; the same parameter table and, with the same weights, the
    same logits. Another classifier or input shape (a fine-tune's) changes only those. A unit of a kind the recipe
    cannot hold leaves the net without a structure."""
    import json
    import numpy as np
    from minibp.units import ReluConvUnit, Unit
    net = small_net()
    net2 = Net((8, 8, 3))
    net2.conv(8)
    net2.add(ReluConvUnit((8, 8, 8), 8))
    net2.classifier(3)
    for original in (net, net2):
        rebuilt = Net.from_structure(json.loads(json.dumps(original.structure())))
        assert rebuilt.structure() == original.structure() and wiring(rebuilt) == wiring(original)
        assert [(n, p.shape) for n, _, p in rebuilt.parameter_table()] == \
            [(n, p.shape) for n, _, p in original.parameter_table()]
        original.compile(pass_images=2, bits="exact", seed=4, training=False)
        rebuilt.compile(pass_images=2, bits="exact", seed=4, training=False)
        x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
        assert np.array_equal(original.predict(x), rebuilt.predict(x))
    other = Net.from_structure(net.structure(), input_shape=(16, 16, 3), classes=7)
    assert other.classes == 7 and other.input_shape == (16, 16, 3)

    class Custom(Unit):
        def __init__(self, shape):
            self.in_shape = self.out_shape = shape
    custom = Net((8, 8, 3))
    custom.conv(8)
    custom.add(Custom((8, 8, 8)))
    assert custom.structure() is None


@pytest.mark.parametrize("structure,match", [
    ("resnet20", "not a net's structure"),
    (dict(input_shape=[8, 8, 3], dtype="float32", eps=1e-5, bn_momentum=0.9, recipe=[{"conv": {"channels": 8}},
                                                                                      {"exec": "print(1)"}]),
     "a recipe's call must be one of conv, residual, relu_conv, classifier"),
    (dict(input_shape=[8, 8, 3], dtype="float32", eps=1e-5, bn_momentum=0.9,
          recipe=[{"conv": {"channels": 8, "__class__": "x"}}]), "a recipe's call must be one of"),
    (dict(input_shape=[8, 8, 3], dtype="float32", eps=1e-5, bn_momentum=0.9, recipe=[{"conv": {"channels": 8}}]),
     "ends in no classifier"),
    (dict(input_shape=[8, 8, 3], dtype="float16", eps=1e-5, bn_momentum=0.9, recipe=[]), "dtype 'float16'"),
])
def test_a_structure_that_is_not_a_nets_is_refused_in_one_line(structure, match):
    with pytest.raises(ValueError, match=match):
        Net.from_structure(structure)
