"""The PyTorch mirror of an exported run: minibp's pre-activation ResNets (minibp/models.py) as torch.nn modules,
loaded from the safetensors file python3 -m minibp.export writes, beside minibp's own predictions.

    python bench/export_pytorch.py                 # resnet20 and the ImageNet family in small, 64 images each
    python bench/export_pytorch.py --images 8      # a smoke test

Needs PyTorch (torch==2.13.0, the CPU build: pip install -e '.[bench]') and the export extra
(pip install -e '.[export]'). For each family it trains a run for a few iterations on random images (a data
file in a temporary folder), exports its weights with minibp.export, loads them into the torch module by
the names and layouts docs/using.md gives ("The weight layout"), and prints the largest difference of the
logits and of the probabilities on random raw images, and how many classes agree. The second row of each
net pads every conv and pool on both sides ((kernel - 1) // 2, as nn.Conv2d(padding=1) pads a 3x3): the
port that is wrong at stride 2. The third moves the batch-norm statistics, gammas (some below the clamp)
and betas away from their trained values first, written through the functions export writes with
(export.weights, export.metadata).

The module mirrors minibp's conventions: a unit is [BN -> ReLU] -> [3x3/2 max pool] -> conv, every conv
and pool padded as TensorFlow's "same" (F.pad with the extra pixel after, then padding 0), the residual
added at the next unit's input, the classifier a unit of its own (BN -> ReLU -> global average pool -> a
1x1 conv with bias).
"""
import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np

import minibp
from minibp import export
from minibp.constants import GAMMA_MIN
from minibp.io import data
from minibp.models import STAGES

INSTALL_HINT = "PyTorch is not installed: pip install torch==2.13.0 (or pip install -e '.[bench]')"
# (name, model spec, model_args, image shape, classes): the two families of minibp/models.py
NETS = (("resnet20", "resnet20", {}, (32, 32, 3), 10),
        ("imagenet family", "minibp.models:bottleneck_resnet", dict(blocks=[1, 2], widths=[8, 16], stem=16),
         (64, 64, 3), 5))


def torch_resnet(torch, model_args, *, model, channels, classes, eps, symmetric=False):
    """minibp.models' net of this spec as a torch.nn module whose units[i] is minibp's unit i. symmetric: pad
    (kernel - 1) // 2 on every side instead, as nn.Conv2d(padding=1) would (the port that is wrong)."""
    nn, F = torch.nn, torch.nn.functional

    def same(x, kernel, stride):
        """F.pad's (left, right, top, bottom) for TensorFlow's "same": total // 2 before, the rest after."""
        if symmetric:
            return [(kernel - 1) // 2] * 4
        pads = []
        for size in (x.shape[3], x.shape[2]):
            total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
            pads += [total // 2, total - total // 2]
        return pads

    class Unit(nn.Module):
        def __init__(self, cin, cout, kernel, stride=1, *, bn=True, pool=None, projection=None, bias=False):
            super().__init__()
            self.bn, self.pool = nn.BatchNorm2d(cin, eps=eps) if bn else None, pool
            self.conv = nn.Conv2d(cin, cout, kernel, stride, bias=bias)  # padding 0: same() pads first
            if projection is not None:  # (channels, stride): the block's output from this unit's conv input
                projection = nn.Conv2d(cin, projection[0], 1, projection[1], bias=False)
            self.projection = projection

        def forward(self, x):
            if self.bn is not None:
                x = F.relu(self.bn(x))
            if self.pool == "max":  # padded taps ignored, as minibp's
                x = F.max_pool2d(F.pad(x, same(x, 3, 2), value=float("-inf")), 3, 2)
            elif self.pool == "global":
                x = x.mean(dim=(2, 3), keepdim=True)
            y = self.conv(F.pad(x, same(x, self.conv.kernel_size[0], self.conv.stride[0])))
            return y, None if self.projection is None else self.projection(x)

    class PreactResNet(nn.Module):
        def __init__(self, stem, stages, imagenet):
            super().__init__()
            units = [Unit(channels, stem, 7 if imagenet else 3, 2 if imagenet else 1, bn=False)]  # on the data
            self.blocks, cin = [], stem
            for s, (count, width, cout) in enumerate(stages):
                for b in range(count):
                    stride, projection = 2 if s > 0 and b == 0 else 1, imagenet and b == 0
                    self.blocks.append((projection, stride, cin, cout))
                    units += [Unit(cin, width, 1, pool="max" if imagenet and s == b == 0 else None,
                                   projection=(cout, stride) if projection else None),
                              Unit(width, width, 3, stride), Unit(width, cout, 1)]
                    cin = cout
            self.units = nn.ModuleList(units + [Unit(cin, classes, 1, pool="global", bias=True)])

        def forward(self, x):  # x: (N, C, H, W), preprocessed
            x, _ = self.units[0](x)
            for i, (projection, stride, cin, cout) in enumerate(self.blocks):
                saved = x
                x, residual = self.units[1 + 3 * i](x)
                x = self.units[3 + 3 * i](self.units[2 + 3 * i](x)[0])[0]
                if not projection:  # the parameter-free shortcut: average pool by the stride, zero channels
                    residual = F.pad(F.avg_pool2d(saved, stride) if stride > 1 else saved, (0, 0, 0, 0, 0, cout - cin))
                x = x + residual
            return self.units[-1](x)[0].flatten(1)

    if model == "resnet20":
        return PreactResNet(16, [(2, width, cout) for width, cout in STAGES], imagenet=False)
    return PreactResNet(model_args["stem"], [(n, w, 4 * w) for n, w in zip(model_args["blocks"], model_args["widths"])],
                        imagenet=True)


def load_minibp(torch, module, tensors):
    """Set the module's units from minibp's arrays (docs/using.md, "The weight layout"); every array is used."""
    used = set()

    def take(name):
        used.add(name)
        return torch.from_numpy(tensors[name])
    with torch.no_grad():
        for i, unit in enumerate(module.units):
            unit.conv.weight.copy_(take(f"params/unit{i}.w").permute(0, 3, 1, 2))  # (Cout, kh, kw, Cin) -> OIHW
            if unit.conv.bias is not None:
                unit.conv.bias.copy_(take(f"params/unit{i}.bias"))
            if unit.projection is not None:
                unit.projection.weight.copy_(take(f"params/unit{i}.projection").permute(0, 3, 1, 2))
            if unit.bn is not None:
                unit.bn.weight.copy_(take(f"params/unit{i}.gamma").clamp(min=GAMMA_MIN))  # the kernels' clamp
                unit.bn.bias.copy_(take(f"params/unit{i}.beta"))
                running = take(f"running/unit{i}.bn")  # (2, C): mean, unbiased variance
                unit.bn.running_mean.copy_(running[0])
                unit.bn.running_var.copy_(running[1])
    unused = set(tensors) - used - {"preprocess/mean"}
    if unused:
        raise ValueError(f"arrays the module did not take: {sorted(unused)[:3]}")


def move_statistics(net, rng):
    """Running statistics, gammas and betas moved away from their trained values."""
    state = net.state()
    for name, array in state.items():
        if name.startswith("running/"):
            array += rng.uniform(0, 0.5, array.shape)  # the variances stay positive
        elif name.endswith((".gamma", ".beta")):
            array += rng.normal(0, 0.5, array.shape)
    net.load_state(state)


def train_run(folder, spec, model_args, shape, classes, rng):
    images = rng.integers(0, 256, (64,) + shape, dtype=np.uint8)
    split = (images, rng.integers(0, classes, 64))
    data.write(folder / "data.h5", train=split, test=split, classes=classes)
    with contextlib.redirect_stdout(io.StringIO()):  # the trainer's header and progress
        minibp.fit(spec, data=str(folder / "data.h5"), out=folder / "run", model_args=model_args, iters=3,
                   batch=16, log_every=3, val_every=3, lr_schedule="0:0.1")
    return minibp.load(folder / "run")


def compare(torch, safetensors_numpy, model, path, images, spec, model_args, *, symmetric=False):
    """(max |logits difference|, max |probabilities difference|, classes that agree) of the module loaded from
    path against the run's net."""
    tensors = safetensors_numpy.load_file(path)
    classes, probabilities = model.predict(images)
    module = torch_resnet(torch, model_args, model=spec, channels=model.input_shape[2], classes=model.net.classes,
                          eps=model.net.eps, symmetric=symmetric).eval()
    load_minibp(torch, module, tensors)
    x = (images.astype(np.float32) * np.float32(1 / 255) - tensors["preprocess/mean"]).transpose(0, 3, 1, 2)
    with torch.no_grad():
        logits = module(torch.from_numpy(np.ascontiguousarray(x)))
    theirs = torch.softmax(logits.double(), dim=1).numpy()
    ours = model.net.predict(model.preprocess(images))
    return (float(np.abs(logits.numpy() - ours).max()), float(np.abs(theirs - probabilities).max()),
            int((logits.numpy().argmax(axis=1) == classes).sum()))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=64, help="random raw images each net predicts (default 64)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.images < 1:
        print(f"error: --images must be positive, got {args.images}", file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        return 2
    try:
        safetensors_numpy = export._library("safetensors.numpy")
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # deterministic sums; the nets are small
    rng = np.random.default_rng(args.seed)
    print(f"{'net':<38} {'images':>6}  {'max |logits diff|':>17}  {'max |prob diff|':>15}  same classes")
    for name, spec, model_args, shape, classes in NETS:
        with tempfile.TemporaryDirectory() as folder:
            model = train_run(Path(folder), spec, model_args, shape, classes, rng)
            images = rng.integers(0, 256, (args.images,) + model.input_shape, dtype=np.uint8)
            for label in ("as trained", "padded on both sides", "statistics moved"):
                if label == "as trained":  # the file python3 -m minibp.export writes
                    path = export.export(Path(folder) / "run", formats=("safetensors",))["safetensors"]
                elif label == "statistics moved":
                    move_statistics(model.net, rng)
                    path = Path(folder) / "moved.safetensors"
                    safetensors_numpy.save_file(export.weights(model), path, metadata=export.metadata(model))
                logits, probabilities, same = compare(torch, safetensors_numpy, model, path, images, spec, model_args,
                                                      symmetric=label == "padded on both sides")
                print(f"{name + ', ' + label:<38} {args.images:>6}  {logits:>17.2e}  {probabilities:>15.2e}  "
                      f"{same}/{args.images}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
