"""minibp/export.py: a run's net as ONNX, checked with onnxruntime against predict on nets of every unit kind,
its weights as safetensors, and the command line's files and one-line errors."""
import json
import os
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

import minibp
from minibp import export, models
from minibp.constants import GAMMA_MIN
from minibp.net import Net
from minibp.units import ReluConvUnit
from runs import ROOT, make_dataset, one_line_error

ort = pytest.importorskip("onnxruntime", reason="the export extra: pip install -e '.[export]'")
onnx = pytest.importorskip("onnx", reason="the export extra: pip install -e '.[export]'")
safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the export extra: pip install -e '.[export]'")


def every_unit_net(*, input_shape=(38, 38, 1), classes=3):
    """The unit kinds a bundled ResNet lacks, at odd and even sizes: a max pool on the data, 5x5, 3x3, 2x2 and
    strided 1x1 convs, a ReLU-conv, a projection after an average pool, a unit that adds a projection and saves
    its input, a parameter-free shortcut that only adds channels, and "valid" padding."""
    net = Net(input_shape)
    net.conv(8, kernel=5, pool="max")                         # 38 -> max 3x3/2 "same" (0, 1) -> 19
    net.add(ReluConvUnit(net.units[-1].out_shape, 8, kernel=3, stride=2))   # 19 -> 10, pads (1, 1)
    with net.residual(shortcut="projection"):
        net.conv(16, kernel=3, pool="avg")                    # 10 -> avg 2x2/2 -> 5
    with net.residual():
        net.conv(24, kernel=1)                                # 16 -> 24 channels, zero-padded shortcut
    net.conv(32, kernel=3, padding="valid")                   # 5 -> 3
    net.conv(32, kernel=1, stride=2)                          # 3 -> 2
    net.classifier(classes)
    return net


def imagenet_shaped_net():
    """The ImageNet family in small: 7x7/2 stem, max pool in the first unit, projections (one strided)."""
    return models.bottleneck_resnet((1, 1), (4, 8), stem=8, input_shape=(32, 32, 3), classes=5)


def randomise(net, rng):
    """Statistics and BN parameters far from their initial values, some gammas below GAMMA_MIN (clamped)."""
    state = net.state()
    for name, array in state.items():
        if name.endswith(".gamma"):
            array[...] = rng.uniform(-0.5, 1.5, array.shape)
        elif name.endswith((".beta", ".bias")):
            array[...] = rng.normal(0, 0.5, array.shape)
        elif name.startswith("running/"):
            array[0], array[1] = rng.normal(0, 0.5, array.shape[1]), rng.uniform(0.5, 2, array.shape[1])
    net.load_state(state)
    assert any((a < GAMMA_MIN).any() for n, a in state.items() if n.endswith(".gamma"))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A resnet11 run on 8x8x3 images (4 classes), 3 iterations: best.h5 and checkpoint.h5."""
    folder = tmp_path_factory.mktemp("export")
    data = make_dataset(folder / "data", name="toy")
    minibp.fit("resnet11", data=str(data), out=folder / "run", iters=3, batch=16, val_every=3, log_every=3)
    return folder / "run"


def as_model(run, net, rng):
    """A Trained model of the run's checkpoint holding another net, compiled and randomised, and its own mean."""
    net.compile(pass_images=8, training=False)
    randomise(net, rng)
    mean = rng.uniform(0.2, 0.6, net.input_shape).astype(np.float32)
    return replace(minibp.load(run), net=net, mean=mean)


def onnx_predictions(proto, images):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(["logits", "probabilities"], {"images": images})


@pytest.mark.parametrize("build", [every_unit_net, imagenet_shaped_net, lambda: models.preact_resnet(
    20, input_shape=(16, 16, 3), classes=7)], ids=["every-unit", "imagenet-shaped", "resnet20"])
def test_onnxruntime_predicts_the_classes_and_probabilities_predict_does(run, build, rng):
    model = as_model(run, build(), rng)
    proto = export.onnx_model(model)
    for n in (1, 19):  # the batch is free: one image, and more than the net's compiled batch
        images = rng.integers(0, 256, (n,) + model.input_shape, dtype=np.uint8)
        classes, probabilities = model.predict(images)
        logits, onnx_probabilities = onnx_predictions(proto, images)
        assert np.array_equal(logits.argmax(axis=1), classes)
        assert np.abs(onnx_probabilities - probabilities).max() <= 1e-5
        assert np.allclose(logits, model.net.predict(model.preprocess(images)), rtol=1e-4, atol=1e-4)


def test_the_schedule_pads_as_tensorflow_same_with_the_extra_pixel_at_the_end():
    steps = export.schedule(imagenet_shaped_net())
    assert steps[0]["conv"]["pads"] == [2, 2, 3, 3] and steps[0]["activation"] is None    # 7x7/2 on 32
    assert steps[1]["pool"] == dict(kind="max", kernel=3, stride=2, pads=[0, 0, 1, 1])   # 3x3/2 on 16
    assert steps[5]["conv"]["pads"] == [0, 0, 1, 1] and steps[5]["conv"]["stride"] == 2  # 3x3/2 on 8
    assert steps[4]["projection"] == dict(kernel=1, stride=2, pads=[0, 0, 0, 0], **{"in": 16}, out=32, bias=False)
    assert steps[4]["add"] == {"kind": "projection"} and steps[7]["add"] == {"kind": "projection"}
    steps = export.schedule(every_unit_net())
    assert steps[1]["activation"] == "relu" and steps[1]["conv"]["pads"] == [1, 1, 1, 1]  # 3x3/2 on 19
    assert steps[3]["add"] == {"kind": "projection"} and steps[3]["save"]
    assert steps[4]["add"] == dict(kind="shortcut", stride=1, channels=[16, 24])
    assert steps[-1]["classifier"] and steps[-1]["pool"] == {"kind": "global"} and steps[-1]["conv"]["bias"]


def test_the_graph_takes_raw_images_and_states_the_preprocessing(run):
    model = minibp.load(run)
    proto = export.onnx_model(model)
    images = proto.graph.input[0].type.tensor_type
    assert images.elem_type == 2 and [d.dim_param or d.dim_value for d in images.shape.dim] == ["N", 8, 8, 3]  # uint8
    assert [o.name for o in proto.graph.output] == ["logits", "probabilities"]
    assert proto.opset_import[0].version == export.OPSET and proto.ir_version == export.IR_VERSION
    meta = {p.key: p.value for p in proto.metadata_props}
    assert "float32(pixel) * float32(1 / 255) - mean" in meta["preprocessing"]
    assert meta["model"] == "resnet11" and float(meta["eps"]) == model.net.eps
    assert meta["checkpoint"].endswith("best.h5")
    assert json.loads(meta["schedule"]) == export.schedule(model.net)
    eps = [a.f for node in proto.graph.node if node.op_type == "BatchNormalization" for a in node.attribute
           if a.name == "epsilon"]
    assert len(eps) == 10 and set(eps) == {np.float32(model.net.eps)}  # every unit but the one on the data
    assert not any(a.name == "auto_pad" for node in proto.graph.node for a in node.attribute)


def test_a_naive_run_is_refused_an_onnx_graph(run, rng):
    net = every_unit_net()
    net.compile(pass_images=4, bits="naive", training=False)
    with pytest.raises(ValueError, match="naive run, which predicts through its 4-bit codes"):
        export.onnx_model(replace(minibp.load(run), net=net))


def test_export_writes_both_files_that_load_back_into_an_equal_net(run, tmp_path):
    written = export.export(run, out=tmp_path / "out")
    assert written == {"onnx": tmp_path / "out" / "best.onnx", "safetensors": tmp_path / "out" / "best.safetensors"}
    model = minibp.load(run)
    tensors = safetensors_numpy.load_file(written["safetensors"])
    assert np.array_equal(tensors["preprocess/mean"], model.mean)
    assert tensors["params/unit1.w"].shape == (16, 1, 1, 16) and tensors["running/unit1.bn"].shape == (2, 16)
    net = models.preact_resnet(11, input_shape=(8, 8, 3), classes=4).compile(pass_images=16, training=False)
    net.load_state({name: array for name, array in tensors.items() if not name.startswith("preprocess/")})
    images = np.random.default_rng(1).integers(0, 256, (16, 8, 8, 3), dtype=np.uint8)
    assert np.array_equal(net.predict(model.preprocess(images)), model.net.predict(model.preprocess(images)))
    session = ort.InferenceSession(str(written["onnx"]), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(["probabilities"], {"images": images})[0] - model.predict(images)[1]).max() <= 1e-5
    assert onnx.load(written["onnx"]).graph.input[0].name == "images"
    with open(written["safetensors"], "rb") as f:  # the metadata the ONNX model carries too
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["__metadata__"]["gamma_min"] == repr(GAMMA_MIN)


def test_which_last_exports_the_last_checkpoint_into_one_named_file(run, tmp_path):
    out = tmp_path / "last.safetensors"
    assert export.export(run, which="last", out=out) == {"safetensors": out}
    tensors = safetensors_numpy.load_file(out)
    last = minibp.load(run, which="last").net.state()
    assert all(np.array_equal(tensors[name], array) for name, array in last.items())
    with pytest.raises(ValueError, match="is one onnx file; for onnx, safetensors give a folder"):
        export.export(run, formats=("onnx", "safetensors"), out=tmp_path / "model.onnx")


def test_the_command_line_refuses_in_one_line_and_never_overwrites_unasked(run, tmp_path, capsys):
    out = tmp_path / "model.onnx"
    assert export.main([str(run), "--out", str(out)]) == 0
    assert f"wrote {out} (opset 17" in capsys.readouterr().out
    before = out.read_bytes()
    assert export.main([str(run), "--out", str(out)]) == 2
    assert f"{out} exists: pass --overwrite" in one_line_error(capsys.readouterr().err)
    assert out.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["model.onnx"]  # no temporary left
    assert export.main([str(run), "--out", str(out), "--overwrite"]) == 0
    for argv, message in ((["--which", "newest"], "--which must be best or last, got 'newest'"),
                          (["--format", "npz"], "--format must be onnx, safetensors or all, got 'npz'"),
                          (["--format", "safetensors", "--out", str(out)], "is one onnx file"),
                          (["--out", str(tmp_path / "p.csv")], "give a folder, or a file ending in .onnx")):
        assert export.main([str(run)] + argv) == 2
        assert message in one_line_error(capsys.readouterr().err)
    capsys.readouterr()
    assert export.main([str(tmp_path / "no-run")]) == 2
    assert "no run folder or checkpoint at" in one_line_error(capsys.readouterr().err)
    (tmp_path / "a-file").write_text("")
    assert export.main([str(run), "--out", str(tmp_path / "a-file" / "sub")]) == 1
    assert "cannot write" in one_line_error(capsys.readouterr().err)


@pytest.mark.slow
def test_a_process_without_minibp_predicts_the_exported_graph_as_predict_does(run, tmp_path):
    """The issue's check: export from the command line, then onnxruntime alone, minibp unimportable."""
    done = subprocess.run([sys.executable, "-m", "minibp.export", str(run), "--format", "onnx", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    images = np.random.default_rng(2).integers(0, 256, (32, 8, 8, 3), dtype=np.uint8)
    np.save(tmp_path / "images.npy", images)
    script = ("import sys; sys.modules['minibp'] = None\n"  # an import of minibp would fail
              "import numpy as np, onnxruntime as ort\n"
              f"s = ort.InferenceSession({str(tmp_path / 'best.onnx')!r})\n"
              f"np.save({str(tmp_path / 'p.npy')!r}, s.run(['probabilities'], "
              f"{{'images': np.load({str(tmp_path / 'images.npy')!r})}})[0])\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    classes, probabilities = minibp.load(run).predict(images)
    onnx_probabilities = np.load(tmp_path / "p.npy")
    assert np.array_equal(onnx_probabilities.argmax(axis=1), classes)
    assert np.abs(onnx_probabilities - probabilities).max() <= 1e-5


@pytest.mark.slow
def test_the_pytorch_mirror_of_the_bundled_resnets_predicts_as_minibp():
    """bench/export_pytorch.py (opt-in: skipped without PyTorch): the weights export writes, in torch.nn."""
    pytest.importorskip("torch", reason="PyTorch, an opt-in for this test: pip install torch==2.13.0")
    done = subprocess.run([sys.executable, "bench/export_pytorch.py", "--images", "8"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line[:38].strip(): line[38:].split() for line in done.stdout.splitlines()[1:]}
    assert len(rows) == 6, done.stdout
    for name, (images, logits, probabilities, same) in rows.items():
        if "both sides" not in name:  # the port that pads both sides is there to differ
            assert images == "8" and float(logits) <= 1e-5 and float(probabilities) <= 1e-5 and same == "8/8", name


@pytest.mark.slow
def test_the_temporary_file_of_a_killed_export_is_removed_by_the_next_one(run, tmp_path):
    # A kill mid-write left model.onnx.<random>.tmp, which no later export removed
    out = tmp_path / "model.onnx"
    killed = ("import os, signal, sys\n"
              "from minibp import export, integrity\n"
              # the file written, not yet published
              "integrity.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
              "sys.exit(export.main(sys.argv[1:]))\n")
    done = subprocess.run([sys.executable, "-c", killed, str(run), "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == -9, done.stderr
    left = [p for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].name.startswith("model.onnx.") and left[0].name.endswith(".tmp"), left
    an_hour_ago = time.time() - 3600  # (one just left may be a writer's at work: a later export leaves it a minute)
    os.utime(left[0], (an_hour_ago, an_hour_ago))
    assert export.main([str(run), "--out", str(out)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
