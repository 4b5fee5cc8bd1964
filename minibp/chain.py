"""Building a net's chain (net.py's Net is a Chain): units appended in order from the input to the
classifier, each taking the shape the chain gives, and residual blocks wired into them.

A residual block sets one of the attributes every unit declares (units.py's Unit) on the units around it,
which the schedule (Net._run and Net.backward) reads to keep the one outstanding residual in the `residual`
buffer:

    first.saves_input       parameter-free shortcut: the block's first unit copies its input there
    after.shortcut          ... and the unit after the block adds it (a ParameterFreeShortcut) to its input
    first.add_projection()  projection shortcut: the first unit's strided 1x1 conv writes it there
    after.adds_projection   ... and the unit after the block adds it to its input

The chain also keeps the calls that built it as plain data, its recipe, which replay() builds again: what a
checkpoint keeps of a net, so that a trained run is loaded without running any code of its own (Net.structure):

    [{"conv": {"channels": 16, "kernel": 3, "stride": 1, "padding": "same", "pool": None}},
     {"residual": "parameter-free", "units": [{"conv": {...}}, ...]},
     {"relu_conv": {"channels": 8, "kernel": 3, "stride": 1, "padding": "same"}},    (net.add(ReluConvUnit(...)))
     {"classifier": 10}]

A unit of another kind, added with add(), has no recipe: such a net's recipe is None.
"""
import contextlib

from .layers.pool import ParameterFreeShortcut
from .checks import positive_int
from .units import ConvUnit, ReluConvUnit

RECIPE_KEYS = {"conv": ("channels", "kernel", "stride", "padding", "pool"),  # an op's arguments, by its kind
               "relu_conv": ("channels", "kernel", "stride", "padding")}


class Chain:
    """Units in order, with their residual blocks; Net adds the buffers and the schedule through them."""

    def __init__(self, input_shape):
        self.units, self.classes = [], None
        self._shape = input_shape   # the output shape of the chain so far
        self._block = None          # the open residual block's shortcut kind
        self._pending = None        # ("shortcut", layer) or ("projection", None) for the next unit
        self.recipe = []            # the calls that built the chain, as data (the module docstring); None: not data
        self._ops = self.recipe     # where the next call goes: the recipe, or an open block's units
    def conv(self, channels, *, kernel=3, stride=1, padding="same", pool=None):
        """Append a unit: [BN-ReLU] -> [pool: None, 'max' (3x3/2), 'avg' (2x2/2)] -> conv. Returns it."""
        if pool not in (None, "max", "avg"):
            raise ValueError(f"pool must be None, 'max' or 'avg', got {pool!r}")
        unit = self._append(ConvUnit(self._shape, channels, kernel=kernel, stride=stride, padding=padding, pool=pool,
                                     batchnorm=bool(self.units)))
        self._record({"conv": dict(channels=channels, kernel=kernel, stride=stride, padding=padding, pool=pool)})
        return unit

    def classifier(self, classes):
        """End the net: BN-ReLU -> global average pool -> fully connected -> softmax cross-entropy."""
        if self.classes is not None:
            raise ValueError("the net already has a classifier")
        if self._block is not None:
            raise ValueError("close the residual block before the classifier")
        if positive_int(classes, "a classifier's classes") < 2:
            raise ValueError(f"a classifier needs at least 2 classes, got {classes}")
        self._append(ConvUnit(self._shape, int(classes), kernel=1, pool="global", bias=True))
        self.classes = int(classes)
        self._record({"classifier": int(classes)})

    def add(self, unit):
        """Append any unit (units.py) whose input shape is the chain's output shape. A ReluConvUnit is kept in the
        recipe; a unit of another kind leaves the chain without one (its run loads through its model file)."""
        self._append(unit)
        if type(unit) is ReluConvUnit:
            conv = unit.conv
            self._record({"relu_conv": dict(channels=conv.cout, kernel=conv.kh, stride=conv.stride,
                                            padding=conv.padding)})
        else:
            self.recipe = self._ops = None
        return unit

    def _append(self, unit):
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
        self._block, outer = shortcut, self._ops
        block = {"residual": shortcut, "units": []}
        self._record(block)
        self._ops = block["units"] if outer is not None else None
        yield
        self._block, self._ops = None, outer if self.recipe is not None else None
        if len(self.units) == first_index:
            raise ValueError("a residual block needs at least one unit")
        first = self.units[first_index]
        if shortcut == "projection":
            first.add_projection(self._shape)
            self._pending = ("projection", None)
        else:
            self._pending = ("shortcut", ParameterFreeShortcut(in_shape, self._shape))
            first.saves_input = True

    def _record(self, op):
        if self._ops is not None:
            self._ops.append(op)

    def replay(self, recipe):
        """Build the chain a recipe describes (the module docstring) onto this one; a ValueError naming the first
        call that is not one, or that the chain refuses. Nothing but these calls runs: a recipe is data."""
        if not isinstance(recipe, list):
            raise ValueError(f"a recipe is a list of calls, got {type(recipe).__name__}")
        for op in recipe:
            kind = next(iter(op), None) if isinstance(op, dict) and len(op) in (1, 2) else None
            if kind == "residual" and set(op) == {"residual", "units"}:
                with self.residual(shortcut=op["residual"]):
                    self.replay(op["units"])
            elif kind == "classifier" and len(op) == 1:
                self.classifier(op["classifier"])
            elif kind in RECIPE_KEYS and len(op) == 1 and isinstance(op[kind], dict) and set(op[kind]) <= set(
                    RECIPE_KEYS[kind]):
                if kind == "conv":
                    self.conv(**op[kind])
                else:
                    self.add(ReluConvUnit(self._shape, **op[kind]))
            else:
                raise ValueError(f"a recipe's call must be one of conv, residual, relu_conv, classifier, got {op!r}")
