"""Building a net's chain (net.py's Net is a Chain): units appended in order from the input to the
classifier, each taking the shape the chain gives, and residual blocks wired into them.

A residual block sets one of the attributes every unit declares (units.py's Unit) on the units around it,
which the schedule (Net._run and Net.backward) reads to keep the one outstanding residual in the `residual`
buffer:

    first.saves_input       parameter-free shortcut: the block's first unit copies its input there
    after.shortcut          ... and the unit after the block adds it (a ParameterFreeShortcut) to its input
    first.add_projection()  projection shortcut: the first unit's strided 1x1 conv writes it there
    after.adds_projection   ... and the unit after the block adds it to its input
"""
import contextlib

from . import layers
from .checks import positive_int
from .units import ConvUnit


class Chain:
    """Units in order, with their residual blocks; Net adds the buffers and the schedule through them."""

    def __init__(self, input_shape):
        self.units, self.classes = [], None
        self._shape = input_shape   # the output shape of the chain so far
        self._block = None          # the open residual block's shortcut kind
        self._pending = None        # ("shortcut", layer) or ("projection", None) for the next unit

    def conv(self, channels, *, kernel=3, stride=1, padding="same", pool=None):
        """Append a unit: [BN-ReLU] -> [pool: None, 'max' (3x3/2), 'avg' (2x2/2)] -> conv. Returns it."""
        if pool not in (None, "max", "avg"):
            raise ValueError(f"pool must be None, 'max' or 'avg', got {pool!r}")
        return self.add(ConvUnit(self._shape, channels, kernel=kernel, stride=stride, padding=padding, pool=pool,
                                 batchnorm=bool(self.units)))

    def classifier(self, classes):
        """End the net: BN-ReLU -> global average pool -> fully connected -> softmax cross-entropy."""
        if self.classes is not None:
            raise ValueError("the net already has a classifier")
        if self._block is not None:
            raise ValueError("close the residual block before the classifier")
        if positive_int(classes, "a classifier's classes") < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {classes}")
        self.add(ConvUnit(self._shape, int(classes), kernel=1, pool="global", bias=True))
        self.classes = int(classes)

    def add(self, unit):
        """Append any unit (units.py) whose input shape is the chain's output shape."""
        if self.classes is not None:
            raise ValueError("the classifier ends the net: add units before it")
        if unit.in_shape != self._shape:
            raise ValueError(f"the unit takes {unit.in_shape}, the chain gives {self._shape}")
        unit.index, unit.saves_input = len(self.units), False
        kind, layer = self._pending or (None, None)
        unit.shortcut, unit.adds_projection = layer, kind == "projection"  # x += residual at the unit's input
        self._pending = None
        self.units.append(unit)
        self._shape = unit.out_shape
        return unit

    @contextlib.contextmanager
    def residual(self, *, shortcut="parameter-free"):
        """A residual block: the input of its first unit is added to the input of the unit after it, through
        the "parameter-free" shortcut (the paper's) or a "projection" (a strided 1x1 conv of the first
        unit's pre-activated input)."""
        if shortcut not in ("parameter-free", "projection"):
            raise ValueError(f"shortcut must be 'parameter-free' or 'projection', got {shortcut!r}")
        if self._block is not None:
            raise ValueError("residual blocks cannot nest: minibp keeps one outstanding residual")
        if not self.units:
            raise ValueError("a residual block needs a unit on the data before it")
        first_index, in_shape = len(self.units), self._shape
        self._block = shortcut
        yield
        self._block = None
        if len(self.units) == first_index:
            raise ValueError("a residual block needs at least one unit")
        first = self.units[first_index]
        if shortcut == "projection":
            first.add_projection(self._shape)
            self._pending = ("projection", None)
        else:
            self._pending = ("shortcut", layers.ParameterFreeShortcut(in_shape, self._shape))
            first.saves_input = True
