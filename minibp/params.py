"""The parameter table: every parameter of a net, named once, and the state built on it.

Each unit declares its parameters by role (Param, below); `key(index, role)` names them
("unit3.w", "unit3.gamma", ...), and that name is what the plan's views, the gradients, the state and
the checkpoints use. The table lays the parameters out in one flat vector, conv and FC weights first
(so SGD decays exactly the first `num_decayed` entries), then BN gamma/beta and biases:

    params, grads, velocity   (P,)     flat, in table order (velocity: SGD's momentum, AdamW's first moment)
    second_moment             (P,)     AdamW's, in table order (a net compiled with optimizer="adamw")
    running                   (2, S)   every BN unit's running mean and variance, channels in unit order

A net's state is a dict of named host arrays: "params/<name>", "momentum/<name>" (a training net's: the
velocity buffer, whichever optimizer), "second_moment/<name>" (an AdamW net's) and "running/<unit>.bn"
(2, C). The optimizer's arrays are optional both ways: a state without them loads as zeros, and a net
without their buffers (an evaluation net, an SGD net) leaves them out, as momentum always was, so any net
reads any state of its architecture (whether a resume may change the optimizer is the trainer's to say).
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import backend


# the buffers a unit may own (Own): its store (x_copy exact, else codes), the codes' windows, its statistics
OWN_ROLES = ("x_copy", "codes", "windows", "stats")
OPTIMIZER_STATE = {"momentum/": "velocity", "second_moment/": "second_moment"}  # state prefix -> arena buffer


@dataclass(frozen=True)
class Param:
    """A parameter a unit declares (units.py's parameters())."""
    role: str
    shape: tuple
    decayed: bool     # weight decay applies (conv and FC weights)
    init: str         # "he": N(0, 2/fan_in); "fan_in": N(0, 1/fan_in); "one"; "zero"


@dataclass(frozen=True)
class Own:
    """A buffer a unit owns (units.py's own_buffers()): its role (one of OWN_ROLES), shape, dtype (None: the
    net's) and the plan's category for it."""
    role: str
    shape: tuple
    dtype: object
    category: str


def elements(n, shape):
    """Values in n arrays of this shape (a pass of n images)."""
    return n * int(np.prod(shape))


def key(index, role):
    """The one place a unit's parameter or buffer gets its name in the plan, the state and checkpoints."""
    return f"unit{index}.{role}"


def parameter_table(units):
    """[(name, unit, Param)]: every conv/FC weight (decayed) first, then BN gamma/beta and biases."""
    rows = [(key(u.index, p.role), u, p) for u in units for p in u.parameters()]
    return [r for r in rows if r[2].decayed] + [r for r in rows if not r[2].decayed]


def slices(units):
    """(name, unit, Param, slice of the flat vector) in table order: where each parameter sits in params and grads."""
    offset, out = 0, []
    for name, u, p in parameter_table(units):
        size = int(np.prod(p.shape))
        out.append((name, u, p, slice(offset, offset + size)))
        offset += size
    return out


class Running(NamedTuple):
    """A unit's share of the running statistics: the net's (2, S) array and the first of its channels there
    (the kernels update them in place: kernels/bn.cu's batchnorm_finish)."""
    array: object
    offset: int


def bind(units, arena):
    """Hand every unit its views (parameters and gradients by role, own buffers, its Running share); returns
    {name: parameter view} and {name: gradient view}."""
    params, grads, by_unit = {}, {}, {u.index: ({}, {}) for u in units}
    for name, u, p, where in slices(units):
        params[name] = by_unit[u.index][0][p.role] = arena["params"][where].reshape(p.shape)
        if "grads" in arena:
            grads[name] = by_unit[u.index][1][p.role] = arena["grads"][where].reshape(p.shape)
    layout = running_layout(units)
    for u in units:
        own = {role: arena[key(u.index, role)] for role in OWN_ROLES if key(u.index, role) in arena}
        u.bind(p=by_unit[u.index][0], g=by_unit[u.index][1], own=own,
               running=Running(arena["running"], layout[u.index].start))
    return params, grads


def running_layout(units):
    """{unit index: the slice of its channels in the running statistics (2, S)}, the units' channels in order."""
    layout, channel = {}, 0
    for u in units:
        layout[u.index] = slice(channel, channel + u.bn_channels)
        channel += u.bn_channels
    return layout


def _running(units, arena):
    """{unit index: its (2, bn_channels) view of the running statistics}."""
    return {index: arena["running"][:, where] for index, where in running_layout(units).items()}


def initialize(units, arena, *, seed, dtype):
    """He-normal conv weights, N(0, 1/fan_in) classifier weights, gamma 1, beta 0, bias 0 (Param.init);
    running statistics (0, 1); zero gradients, momentum and second moment."""
    rng = np.random.default_rng(seed)
    host = np.empty(arena["params"].size, dtype)
    for _, _, p, where in slices(units):
        fan_in = int(np.prod(p.shape[1:]))  # weights are (Cout, kh, kw, Cin)
        size = where.stop - where.start
        host[where] = {"he": lambda: rng.standard_normal(size) * np.sqrt(2.0 / fan_in),
                       "fan_in": lambda: rng.standard_normal(size) * np.sqrt(1.0 / fan_in),
                       "one": lambda: 1.0, "zero": lambda: 0.0}[p.init]()
    arena["params"][...] = backend.xp.asarray(host)
    arena["running"][0], arena["running"][1] = 0, 1
    for name in ("grads", "velocity", "second_moment"):
        if name in arena:
            arena[name][...] = 0


def _state_views(units, arena):
    """{state name: device view} of everything a state holds."""
    views = {}
    for name, _, p, where in slices(units):
        views["params/" + name] = arena["params"][where].reshape(p.shape)
        for prefix, buffer in OPTIMIZER_STATE.items():
            if buffer in arena:
                views[prefix + name] = arena[buffer][where].reshape(p.shape)
    running = _running(units, arena)
    views.update({"running/" + key(u.index, "bn"): running[u.index] for u in units if u.bn_channels})
    return views


def get_state(units, arena, *, copy=True):
    """The state as named host arrays: copies, or (copy=False) the arena's own views on the CPU, read-only (a
    checkpoint's write, which reads them while nothing steps: no second copy of the state beside the arena). A GPU's
    state comes to the host as one copy either way."""
    state = {}
    for name, view in _state_views(units, arena).items():
        host = backend.to_host(view)
        if host is view:  # the CPU's arena itself
            host = host.copy() if copy else host.view()
            host.flags.writeable = bool(copy)
        state[name] = host
    return state


def set_state(units, arena, state, *, require_finite=True):
    """Copy named arrays into the arena; the optimizer's (momentum, second moment) may be absent (then zero) or
    have no buffer here (then left out), all else must fit. Every array is checked (shape, numbers, finite in
    the net's dtype) before any is copied, so a refused state leaves the net as it was. require_finite=False:
    the net's own state, which a recompile keeps as it is."""
    views = _state_views(units, arena)
    optional = tuple(OPTIMIZER_STATE)
    missing = [n for n in views if n not in state and not n.startswith(optional)]
    unknown = [n for n in state if n not in views and not n.startswith(optional)]
    if missing or unknown:
        raise ValueError(f"the state does not fit this net: missing {missing[:3]}, unknown {unknown[:3]}")
    values = {}
    for name, view in views.items():
        value = np.asarray(state[name]) if name in state else np.zeros(view.shape)
        if value.dtype.kind not in "iuf":
            raise TypeError(f"state {name!r} must be an array of numbers, got {value.dtype}")
        if value.shape != view.shape:
            raise ValueError(f"state {name!r} has shape {value.shape}, the net {view.shape}")
        with np.errstate(over="ignore"):  # a value beyond the dtype's range becomes infinite, and is refused
            values[name] = value.astype(view.dtype, copy=False)
        if require_finite and not np.isfinite(values[name]).all():
            raise ValueError(f"state {name!r} holds values that are not finite (NaN, infinite or beyond "
                             f"{view.dtype})")
    for name, view in views.items():
        view[...] = backend.xp.asarray(values[name])
