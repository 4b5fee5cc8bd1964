"""Export a trained run to the ecosystem's formats: its net as an ONNX graph, to predict anywhere, and its
weights as safetensors, under the names its checkpoints use (docs/using.md: "Export" and "The weight layout").

    python3 -m minibp.export runs/mine                    # runs/mine/best.onnx and runs/mine/best.safetensors
    python3 -m minibp.export runs/mine --which last       # from checkpoint.h5: checkpoint.onnx, .safetensors
    python3 -m minibp.export runs/mine --out model.onnx   # one file, of the format its suffix names
    python3 -m minibp.export runs/mine --format safetensors --out exported/   # into a folder

    from minibp.export import export
    written = export("runs/mine", formats=("onnx",), out="model.onnx")       # {format: path}

The checkpoint is the one minibp.load takes (run/trained.py): best.h5 where the run has one, else
checkpoint.h5. The ONNX graph is fed what predict is fed, raw uint8 images (N, H, W, C), N free: it applies the
run's preprocessing itself and gives "logits" and "probabilities" (N, classes). Before it is written,
onnxruntime runs it beside the run's net on CHECK_IMAGES random images, and their probabilities must agree
within TOLERANCE. The safetensors file holds net.state()'s arrays (what net.load_state takes) and the
preprocessing's mean. Both carry the same metadata (metadata()): where they come from, the preprocessing,
eps, gamma's floor, the padding rule and the net's forward pass as JSON (schedule()).

Files are written whole (integrity.atomic_file), over an existing one only with --overwrite. Needs the export
extra (onnx, onnxruntime, safetensors; the images extra holds them too). Exit status: 0 done, 1 a write failed or
the graph disagreed with the run's net, 2 a bad option or input, 130 stopped by Ctrl-C.
"""
import argparse
import importlib
import json
import os
import sys
from pathlib import Path

import numpy as np

from . import cli, extras
from .layers.pool import GlobalAvgPool, MaxPool
from .constants import GAMMA_MIN
from .integrity import write_atomic
from .kernels import KernelError
from .run import modelspec
from .run.checkpoint import checkpoint_path
from .run.trained import load
from .units import ConvUnit, ReluConvUnit
from .version import VERSION

FORMATS = {"onnx": ".onnx", "safetensors": ".safetensors"}  # format -> its files' suffix
WHICH = ("best", "last")
# Opset 17 (ONNX 1.12, 2022): onnxruntime reads it from 1.12 on, and every operator used here has had its
# present form since opset 15 or earlier. IR version 8 is that opset's, so runtimes of that age load the file.
OPSET, IR_VERSION = 17, 8
CHECK_IMAGES = 16       # random images onnxruntime and the run's net both predict before the graph is written
TOLERANCE = 1e-5        # the largest difference of a probability allowed between the two
PREPROCESSING = ("raw uint8 images (N, H, W, C), as the data file holds them, become the net's input "
                 "x = float32(pixel) * float32(1 / 255) - mean, where mean (H, W, C) float32 is the training "
                 "images' mean in [0, 1] units (preprocess/mean); the ONNX graph does this itself")
PADDING = ("TensorFlow's 'same': out = ceil(size / stride), the total padding max((out - 1) * stride + kernel "
           "- size, 0) split as total // 2 before and the rest after (an odd total's extra pixel at the end); "
           "'valid': none. pads are [top, left, bottom, right]")
LAYOUT = ("activations NHWC; params/unitI.w and params/unitI.projection (Cout, kh, kw, Cin); gamma, beta, bias "
          "(C,); running/unitI.bn (2, C): running mean and unbiased variance; batch norm at inference: "
          "max(gamma, gamma_min) * (x - mean) / sqrt(var + eps) + beta")


class Failed(RuntimeError):
    """A file could not be written, or the ONNX graph disagreed with the run's net: exit status 1."""


def _library(name):
    """The module of an export extra's package, or an ImportError of one line saying how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ImportError(extras.missing("export", f"exporting needs {name.split('.')[0]}, which is not installed")) \
            from None


# ---------------------------------------------------------------------- the net as plain data


def _pads(layer, kernel):
    """[top, left, bottom, right] of a conv or pool layer: its padding before, and what "same" leaves after."""
    after = lambda size, out, before: max(0, (out - 1) * layer.stride + kernel - size - before)
    return [layer.pad_top, layer.pad_left, after(layer.H, layer.Ho, layer.pad_top),
            after(layer.W, layer.Wo, layer.pad_left)]


def _pool(pool):
    if pool is None:
        return None
    if isinstance(pool, GlobalAvgPool):
        return {"kind": "global"}
    return {"kind": "max" if isinstance(pool, MaxPool) else "avg", "kernel": pool.size,
            "stride": pool.stride, "pads": _pads(pool, pool.size)}


def _conv(conv):
    return {"kernel": conv.kh, "stride": conv.stride, "pads": _pads(conv, conv.kh), "in": conv.cin,
            "out": conv.cout, "bias": bool(conv.has_bias)}


def _step(unit):
    """One unit of schedule()."""
    if not isinstance(unit, (ConvUnit, ReluConvUnit)):
        raise ValueError(f"unit {unit.index} is a {type(unit).__name__}: export knows ConvUnit and ReluConvUnit")
    add = None
    if unit.shortcut is not None:
        add = {"kind": "shortcut", "stride": unit.shortcut.stride,
               "channels": [unit.shortcut.in_shape[2], unit.in_shape[2]]}
    elif unit.adds_projection:
        add = {"kind": "projection"}
    own = isinstance(unit, ConvUnit)  # a ReluConvUnit: ReLU -> conv + bias, no batch norm, no pool
    projection = unit.projection if own else None
    return {"unit": unit.index, "in_shape": list(unit.in_shape), "out_shape": list(unit.out_shape), "add": add,
            "save": bool(unit.saves_input),
            "activation": ("bn-relu" if unit.bn is not None else None) if own else "relu",
            "pool": _pool(unit.pool) if own else None, "conv": _conv(unit.conv),
            "projection": None if projection is None else _conv(projection), "classifier": bool(unit.is_classifier)}


def schedule(net):
    """The net's forward pass as plain data, one dict a unit in order: what the ONNX graph is built from, and
    what a port of an own net reads (docs/using.md, "The weight layout"). The one place this module reads the
    units' layers.

        unit, in_shape, out_shape   its index (params/unit<index>.w, ...) and (H, W, C) shapes
        add         added to its input first: None; {"kind": "projection"}, the residual a projection wrote;
                    or {"kind": "shortcut", "stride": s, "channels": [C, Co]}, the residual a unit saved,
                    average-pooled s x s at stride s (s > 1) and zero-padded from C to Co channels
        save        its input, after the add, becomes the residual
        activation  "bn-relu" (batch norm with the running statistics, then ReLU), "relu" or None
        pool        None, {"kind": "global"} or {"kind": "max" | "avg", "kernel", "stride", "pads"}
        conv        {"kernel", "stride", "pads", "in", "out", "bias"}, pads [top, left, bottom, right]
        projection  None, or a 1x1 conv as conv (no bias) of the conv's input: its output becomes the residual
        classifier  its output (1, 1, classes) is the logits
    """
    return [_step(unit) for unit in net.units]


def weights(model):
    """{name: C-contiguous float32 array}: the net's state (params/unit3.w, ..., running/unit3.bn: what
    net.load_state takes) and preprocess/mean (H, W, C)."""
    tensors = {name: np.ascontiguousarray(array, np.float32) for name, array in model.net.state().items()}
    tensors["preprocess/mean"] = np.ascontiguousarray(model.mean, np.float32)
    return tensors


def metadata(model):
    """{key: text} that both files carry."""
    net, config = model.net, model.config
    names = list(model.class_names) if model.class_names else None
    return {"producer": f"minibp {VERSION}", "model": modelspec.describe(config.model, config.model_args),
            "checkpoint": str(model.path), "iteration": str(model.iteration),
            "input_shape": json.dumps(list(net.input_shape)), "classes": str(net.classes),
            "class_names": json.dumps(names), "preprocessing": PREPROCESSING, "eps": repr(float(net.eps)),
            "gamma_min": repr(GAMMA_MIN), "padding": PADDING, "layout": LAYOUT, "schedule": json.dumps(schedule(net))}


# ---------------------------------------------------------------------- ONNX


class _Graph:
    """The nodes and initializers of a graph being built; a node's one output is named as the node."""

    def __init__(self, onnx):
        self.onnx, self.nodes, self.initializers = onnx, [], []

    def constant(self, name, array):
        array = np.asarray(array)
        array = array.astype(np.float32 if array.dtype.kind == "f" else np.int64)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op, inputs, name, **attributes):
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [name], name=name, **attributes))
        return name

    def conv(self, name, x, w, pads, stride, bias=None):
        """A conv of NCHW x by minibp's (Cout, kh, kw, Cin) weights w, transposed to ONNX's (Cout, Cin, kh, kw)."""
        inputs = [x, self.constant(name, w.transpose(0, 3, 1, 2))] + ([] if bias is None else [bias])
        return self.node("Conv", inputs, f"{name}:out", kernel_shape=list(w.shape[1:3]), strides=[stride, stride],
                         pads=pads)


def _preprocess(g, mean):
    """Raw uint8 images (N, H, W, C) -> the net's input, NCHW: as Trained.preprocess, then transposed."""
    x = g.node("Cast", ["images"], "preprocess/float", to=g.onnx.TensorProto.FLOAT)
    x = g.node("Mul", [x, g.constant("preprocess/scale", np.float32(1 / 255))], "preprocess/scaled")
    x = g.node("Sub", [x, g.constant("preprocess/mean", mean)], "preprocess/normalised")
    return g.node("Transpose", [x], "preprocess/nchw", perm=[0, 3, 1, 2])


def _residual(g, step, residual):
    """What the unit of step adds to its input: the projection's output, or the saved input through the
    parameter-free shortcut (identity, or average pool by the stride and zero channels)."""
    add, name = step["add"], f"unit{step['unit']}.shortcut"
    if add["kind"] == "projection":
        return residual
    stride, (channels, out) = add["stride"], add["channels"]
    if stride > 1:
        residual = g.node("AveragePool", [residual], f"{name}.pool", kernel_shape=[stride, stride],
                          strides=[stride, stride])
    if out > channels:  # NCHW pads: [begin of N, C, H, W, end of N, C, H, W]
        pads = g.constant(f"{name}.pads", np.array([0, 0, 0, 0, 0, out - channels, 0, 0]))
        residual = g.node("Pad", [residual, pads], f"{name}.pad")
    return residual


def _pool_node(g, pool, x, name):
    if pool is None:
        return x
    if pool["kind"] == "global":
        return g.node("GlobalAveragePool", [x], f"{name}.pool")
    size, stride = [pool["kernel"]] * 2, [pool["stride"]] * 2
    if pool["kind"] == "max":  # padded taps are ignored, as minibp's
        return g.node("MaxPool", [x], f"{name}.pool", kernel_shape=size, strides=stride, pads=pool["pads"])
    return g.node("AveragePool", [x], f"{name}.pool", kernel_shape=size, strides=stride, pads=pool["pads"],
                  count_include_pad=1)  # minibp always divides by size^2


def _unit_nodes(g, step, state, eps, x):
    """(output, projection output or None) of a unit's nodes on x."""
    name = f"unit{step['unit']}"
    param = lambda role: state[f"params/{name}.{role}"]
    if step["activation"] == "bn-relu":  # the kernels' clamp of gamma (kernels/bn.cu batchnorm_finish)
        mean, var = state[f"running/{name}.bn"]
        inputs = [x] + [g.constant(f"{name}.{role}", value) for role, value in (
            ("gamma", np.maximum(param("gamma"), np.float32(GAMMA_MIN))), ("beta", param("beta")),
            ("running_mean", mean), ("running_var", var))]
        x = g.node("BatchNormalization", inputs, f"{name}.bn", epsilon=eps)
    if step["activation"]:
        x = g.node("Relu", [x], f"{name}.relu")
    x = _pool_node(g, step["pool"], x, name)
    conv, projection = step["conv"], step["projection"]
    bias = g.constant(f"{name}.bias", param("bias")) if conv["bias"] else None
    y = g.conv(f"{name}.w", x, param("w"), conv["pads"], conv["stride"], bias)
    if projection is not None:
        projection = g.conv(f"{name}.projection", x, param("projection"), projection["pads"], projection["stride"])
    return y, projection


def onnx_model(model):
    """The ONNX ModelProto of a Trained model (minibp.load): raw images in, "logits" and "probabilities" out,
    batch norm with the running statistics, the net's eps and gamma clamped as the kernels clamp it."""
    onnx = _library("onnx")
    _library("onnx.numpy_helper")
    net = model.net
    if net.naive:
        raise ValueError(f"{model.path} is a naive run, which predicts through its 4-bit codes: an ONNX graph "
                         "would not compute what it does (export its weights: --format safetensors)")
    g, state, residual = _Graph(onnx), net.state(), None
    x = _preprocess(g, model.mean)
    for step in schedule(net):  # as Net._run: add the residual, save the input, run the unit
        if step["add"] is not None:
            x = g.node("Add", [x, _residual(g, step, residual)], f"unit{step['unit']}.add")
        if step["save"]:
            residual = x
        x, projection = _unit_nodes(g, step, state, float(net.eps), x)
        residual = projection or residual
    logits = g.node("Flatten", [x], "logits", axis=1)
    g.node("Softmax", [logits], "probabilities", axis=1)
    helper, FLOAT = onnx.helper, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        g.nodes, "minibp", [helper.make_tensor_value_info("images", onnx.TensorProto.UINT8, ["N", *net.input_shape])],
        [helper.make_tensor_value_info(name, FLOAT, ["N", net.classes]) for name in ("logits", "probabilities")],
        initializer=g.initializers)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="minibp", producer_version=VERSION)
    helper.set_model_props(proto, metadata(model))
    onnx.checker.check_model(proto)
    return proto


def check_onnx(model, proto):
    """The largest difference between onnxruntime's probabilities and predict's on CHECK_IMAGES random images;
    Failed where it is over TOLERANCE."""
    ort = _library("onnxruntime")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    images = np.random.default_rng(0).integers(0, 256, (CHECK_IMAGES,) + model.input_shape, dtype=np.uint8)
    _, expected = model.predict(images)
    difference = float(np.abs(session.run(["probabilities"], {"images": images})[0] - expected).max())
    if not difference <= TOLERANCE:
        raise Failed(f"the ONNX graph of {model.path} disagrees with its net: probabilities differ by up to "
                     f"{difference:.3g} (at most {TOLERANCE:g} allowed); nothing written")
    return difference


# ---------------------------------------------------------------------- files


def _formats(formats, out):
    """The formats asked for (None: the one out's suffix names, or all), checked against out."""
    suffix = Path(out).suffix if out is not None else ""
    named = [f for f, s in FORMATS.items() if s == suffix]
    if formats is None:
        formats = tuple(named or FORMATS)
    formats = (formats,) if isinstance(formats, str) else tuple(formats)
    if not formats or any(f not in FORMATS for f in formats) or len(set(formats)) != len(formats):
        raise ValueError(f"formats are some of {', '.join(FORMATS)}, got {formats!r}")
    if named and formats != tuple(named):
        raise ValueError(f"--out {out} is one {named[0]} file; for {', '.join(formats)} give a folder as --out")
    return formats


def targets(checkpoint, formats, out):
    """{format: path}: out itself where it names a file (its suffix), else <folder>/<checkpoint's stem><suffix>
    in out, or beside the checkpoint."""
    if out is not None and Path(out).suffix in FORMATS.values():
        return {formats[0]: Path(out)}
    folder = Path(checkpoint).parent if out is None else Path(out)
    if out is not None and not folder.is_dir() and (folder.exists() or folder.suffix):
        raise ValueError(f"--out {out}: give a folder, or a file ending in .onnx or .safetensors")
    return {f: folder / (Path(checkpoint).stem + FORMATS[f]) for f in formats}


def _write(path, data, *, overwrite):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data, replace=overwrite)  # a file that appeared meanwhile is never replaced
    except OSError as e:
        raise Failed(f"cannot write {path} ({e.strerror or e})") from None


def export(run, *, which=None, formats=None, out=None, overwrite=False, report=None, model=None):
    """Write a run's net as ONNX and its weights as safetensors; returns {format: path}. run: a run folder or a
    checkpoint file; which: "best", "last" or None (as minibp.load); formats: one of FORMATS or a tuple of
    them (None: the one out's suffix names, else both); out: a file (.onnx or .safetensors) or a folder
    (None: the checkpoint's); overwrite: replace existing files; report: called with each line of progress
    (the command line's print); model: a moved model file's place for a run saved before checkpoints kept their
    net (minibp.load's model=).
    A bad option or input is a ValueError (FileNotFoundError, ImportError) before anything is written; a
    failed write or a graph that disagrees with the net is Failed."""
    formats = _formats(formats, out)
    checkpoint = checkpoint_path(run, which)  # chosen once: the files are named after what they hold
    paths = targets(checkpoint, formats, out)
    existing = [str(p) for p in paths.values() if os.path.lexists(p)]
    if existing and not overwrite:
        raise ValueError(f"{' and '.join(existing)} {'exist' if len(existing) > 1 else 'exists'}: pass --overwrite "
                         "to replace, or choose another --out")
    for name in ("onnx", "onnxruntime") if "onnx" in formats else ():
        _library(name)
    serialize = _library("safetensors.numpy").save if "safetensors" in formats else None
    report = report or (lambda line: None)
    model = load(checkpoint, batch=CHECK_IMAGES, model=model)  # (from here on, the loaded run)
    built = modelspec.describe(model.config.model, model.config.model_args)
    report(f"{model.path} (iteration {model.iteration}): {built}, {len(model.net.units)} units, "
           f"{model.net.num_parameters:,} parameters")
    files = {}
    if "onnx" in formats:
        proto = onnx_model(model)
        difference = check_onnx(model, proto)
        files["onnx"] = (proto.SerializeToString(), f"opset {OPSET}; onnxruntime's probabilities within "
                                                    f"{difference:.2g} of predict's on {CHECK_IMAGES} random images")
    if "safetensors" in formats:
        tensors = weights(model)
        files["safetensors"] = (serialize(tensors, metadata=metadata(model)), f"{len(tensors)} arrays")
    for name, (data, what) in files.items():
        _write(paths[name], data, overwrite=overwrite)
        report(f"wrote {paths[name]} ({what})")
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m minibp.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a run folder, or a checkpoint file")
    parser.add_argument("--which", help="best (best.h5) or last (checkpoint.h5); default: best.h5 where the run "
                                        "has one")
    parser.add_argument("--format", help="onnx, safetensors or all (default: the format --out's suffix names, "
                                         "else all)")
    parser.add_argument("--out", help="a file (.onnx or .safetensors) or a folder (default: the checkpoint's folder); "
                                      "files are named after the checkpoint: best.onnx, checkpoint.safetensors")
    parser.add_argument("--overwrite", action="store_true", help="replace files that exist")
    parser.add_argument("--model", metavar="SPEC", help=modelspec.MODEL_HELP)
    args = parser.parse_args(argv)
    try:
        if args.which is not None and args.which not in WHICH:
            raise ValueError(f"--which must be best or last, got {args.which!r}")
        if args.format is not None and args.format not in (*FORMATS, "all"):
            raise ValueError(f"--format must be onnx, safetensors or all, got {args.format!r}")
        formats = None if args.format is None else tuple(FORMATS) if args.format == "all" else (args.format,)
        export(args.run, which=args.which, formats=formats, out=args.out, overwrite=args.overwrite, report=print,
               model=args.model)
    except (ValueError, FileNotFoundError, ImportError, KernelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Failed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
