"""Checkpoints: never written from a net that is not finite, every kind of damage named by the trainer and the
evaluator (the arrays and the attributes under checksums), and old formats still read."""
import json
import re

import h5py
import numpy as np
import pytest

from minibp import backend, evaluate, integrity, train
from minibp.run import checkpoint
from nets import tiny_net, tiny_resnet, train_steps
from runs import base_args, one_line_error, set_attrs


def test_a_checkpoint_is_never_written_from_a_net_that_is_not_finite(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, checkpoint_every=1, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    before = path.read_bytes()
    net = tiny_resnet(classes=4).compile(pass_images=4, bits="4")
    net.params[3] = np.inf
    with pytest.raises(checkpoint.NotFinite, match="params"):
        checkpoint.save(path, net, iteration=9, config={}, data_state=dict(epoch=0, position=0, order=np.arange(4),
                                                                            rng="{}"))
    assert path.read_bytes() == before and not integrity.stale_temporaries(path)


def _rewrite(f, name, array):
    """Replace a dataset and its checksum, so that only the content checks can catch the change."""
    del f[name]
    f[name] = array
    f[name].attrs["sha256"] = checkpoint.sha256(array)


def _damage(path, how):
    if how == "zeroed tail":  # what a disk that lost its last block leaves: HDF5 cannot parse the file
        with open(path, "r+b") as f:
            f.seek(-4096, 2)
            f.write(bytes(4096))
        return
    with h5py.File(path, "r+") as f:
        if how == "flipped bit":
            params = f["state/params/unit0.w"][...]
            params.reshape(-1).view(np.uint32)[5] ^= 1 << 3
            f["state/params/unit0.w"][...] = params
        elif how == "order out of range":
            order = f["data_order"][...]
            order[0] = 10**6
            _rewrite(f, "data_order", order)
        elif how == "broken config":
            set_attrs(f, config="{not json")
        elif how == "missing state":
            del f["state"]
        elif how == "not finite":
            running = f["state/running/unit1.bn"][...]
            running[0, 0] = np.nan
            _rewrite(f, "state/running/unit1.bn", running)
        elif how == "wrong shape":
            _rewrite(f, "state/params/unit1.gamma", np.ones(3, np.float32))
        elif how == "running of one row":
            _rewrite(f, "state/running/unit1.bn", np.ones((1, 16), np.float32))
        elif how.startswith("data_rng"):  # the generator's state, its inner state changed, the checksum recomputed
            rng = json.loads(f.attrs["data_rng"])
            if how == "data_rng without its state":
                del rng["state"]["state"]
            else:
                rng["state"]["inc"] = "7"
            set_attrs(f, data_rng=json.dumps(rng))


@pytest.mark.parametrize("how,match", [("flipped bit", "state/params/unit0.w fails its SHA-256"),
                                       ("order out of range", "data_order is not a permutation"),
                                       ("broken config", "not valid JSON"),
                                       ("missing state", "lacks state"),
                                       ("not finite", "running/unit1.bn hold NaN"),
                                       ("wrong shape", "the checkpoint's unit1.gamma is (3,), the net's (16,)"),
                                       ("zeroed tail", "is damaged: HDF5 cannot read it"),
                                       ("running of one row", "'running/unit1.bn' has shape (1, 16), the net (2, 16)"),
                                       ("data_rng without its state", "is damaged: its data_rng.state lacks state"),
                                       ("data_rng of a text inc", "its data_rng.state.inc is '7', not an integer")])
def test_a_damaged_checkpoint_is_named_by_train_and_evaluate(tmp_path, data_dir, capsys, how, match):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    _damage(path, how)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and match in line and "learning rate" not in line
    assert evaluate.main([str(tmp_path / "run"), "--which", "last"]) == 2
    assert match in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("attribute", ["iteration", "config"])
def test_a_changed_checkpoint_attribute_fails_its_checksum(tmp_path, data_dir, capsys, attribute):
    """A flipped bit in the iteration (2 -> 18) would skip 16 iterations; in the config's bits (4 -> 8) it
    would train another run: the attributes are under a checksum, as the arrays are."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(path, "r+") as f:
        if attribute == "iteration":
            f.attrs["iteration"] = f.attrs["iteration"] ^ 16
        else:
            f.attrs["config"] = f.attrs["config"].replace('"bits": "4"', '"bits": "8"')
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "20"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and "is damaged: its attributes" in line and "fail their SHA-256 check" in line
    assert evaluate.main([str(tmp_path / "run"), "--which", "last"]) == 2
    assert "fail their SHA-256 check" in one_line_error(capsys.readouterr().err)


@pytest.mark.parametrize("claimed", ["minibp-checkpoint-2", "minibp-checkpoint-1"])
def test_a_checkpoint_claiming_an_older_format_than_its_checksums_is_refused(tmp_path, data_dir, capsys, claimed):
    """3 -> 2 is one bit, and format 2 skipped the attributes' checksum with a warning: a file that carries the
    later fields is refused as damaged, by the trainer and the evaluator."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(path, "r+") as f:
        f.attrs["format"] = claimed
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert f"{path} is damaged: it says format {claimed} but holds attrs_sha256, class_names" in line
    assert evaluate.main([str(tmp_path / "run"), "--which", "last"]) == 2
    assert f"{path} is damaged: it says format {claimed}" in one_line_error(capsys.readouterr().err)


def test_an_honest_format_2_checkpoint_still_resumes(tmp_path, data_dir, capsys):
    """One written before the attributes' checksum and the class names: read, with a warning."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    with h5py.File(tmp_path / "run" / "checkpoint.h5", "r+") as f:
        del f.attrs["attrs_sha256"], f["class_names"]
        f.attrs["format"] = "minibp-checkpoint-2"
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--which", "last"]) == 0
    assert "warning: an older checkpoint" in capsys.readouterr().err
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 0


@pytest.mark.parametrize("data,rng,match", [
    ("cifar10", {"bit_generator": "PCG64", "state": {"inc": 3}, "has_uint32": 0, "uinteger": 0},
     "its data_rng.state lacks state"),
    ("cifar10", {"bit_generator": "PCG64", "state": {"state": -1, "inc": 3}, "has_uint32": 0, "uinteger": 0},
     "its data_rng.state.state is -1, not an integer in [0, 2**128)"),
    ("cifar10", {"bit_generator": "PCG64", "state": [1, 3], "has_uint32": 0, "uinteger": 0},
     "its data_rng.state is [1, 3], not a JSON object"),
    ("cifar10", {"bit_generator": "MT19937", "state": {"state": 1, "inc": 3}, "has_uint32": 0, "uinteger": 0},
     "its data_rng.bit_generator is 'MT19937', not 'PCG64'"),
    ("cifar10", {"bit_generator": "PCG64", "state": {"state": 1, "inc": 3}, "has_uint32": True, "uinteger": 0},
     "its data_rng.has_uint32 is True, not 0 or 1"),
    ("imagenet", {"reader": "minibp.imagenet", "state": {"seed": "0", "listing_sha256": "0" * 64}},
     "its data_rng.state.seed is '0', not a non-negative integer"),
    ("imagenet", {"reader": "minibp.imagenet", "state": {"seed": 0}}, "its data_rng.state lacks listing_sha256"),
    ("imagenet", {"bit_generator": "PCG64", "state": {"state": 1, "inc": 3}, "has_uint32": 0, "uinteger": 0},
     "its data_rng holds 'bit_generator'")])
def test_the_data_order_state_is_checked_field_by_field(tmp_path, data, rng, match):
    """A resume hands data_rng to the data reader as it is: under its checksum, a hand-made one is still
    checked field by field against what its reader (numpy's PCG64, or the ImageNet reader's) writes."""
    net = tiny_net().compile(pass_images=4, bits=4)
    path = checkpoint.save(tmp_path / "checkpoint.h5", net, iteration=1, config={"data": data},
                           data_state=dict(epoch=0, position=0, order=np.arange(8), rng=json.dumps(rng)))
    with pytest.raises(ValueError, match="^" + re.escape(f"{path} is damaged: {match}")):
        checkpoint.load(path)


@pytest.mark.parametrize("data,rng", [
    ("cifar10", json.dumps(np.random.default_rng(3).bit_generator.state)),
    ("imagenet", json.dumps({"reader": "minibp.imagenet", "state": {"seed": 3, "listing_sha256": "ab" * 32}}))])
def test_the_data_order_states_the_readers_write_are_read(tmp_path, data, rng):
    net = tiny_net().compile(pass_images=4, bits=4)
    path = checkpoint.save(tmp_path / "checkpoint.h5", net, iteration=1, config={"data": data},
                           data_state=dict(epoch=0, position=0, order=np.arange(8), rng=rng))
    assert checkpoint.load(path).data_state["rng"] == rng


def test_hdf5_errors_are_damage_but_memory_errors_and_interrupts_pass(tmp_path, monkeypatch):
    net = tiny_net().compile(pass_images=4, bits=4)
    path = checkpoint.save(tmp_path / "checkpoint.h5", net, iteration=1, config={"data": "cifar10"},
                           data_state=dict(epoch=0, position=0, order=np.arange(8),
                                           rng=json.dumps(np.random.default_rng(0).bit_generator.state)))
    for error, raised in ((RuntimeError("Object visitation failed"), ValueError), (MemoryError(), MemoryError),
                          (KeyboardInterrupt(), KeyboardInterrupt)):
        def visit(self, function, error=error):
            raise error
        monkeypatch.setattr(h5py.Group, "visititems", visit)
        with pytest.raises(raised) as caught:
            checkpoint.load(path)
        assert raised is not ValueError or str(caught.value) == (f"{path} is damaged: HDF5 cannot read it "
                                                                 "(Object visitation failed)")


def test_an_old_format_checkpoint_still_resumes(tmp_path, rng):
    net = tiny_net().compile(pass_images=4, bits=4)
    train_steps(net, rng)
    state = net.state()
    names = [n for n, _, _ in net.parameter_table()]
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:  # the flat layout of minibp-checkpoint-1
        f.attrs.update(format="minibp-checkpoint-1", iteration=3, config=json.dumps({}), data_epoch=0,
                       data_position=0, data_rng=json.dumps(np.random.default_rng(0).bit_generator.state))
        f["params"] = np.concatenate([state["params/" + n].ravel() for n in names])
        f["velocity"] = np.concatenate([state["momentum/" + n].ravel() for n in names])
        f["running"] = np.concatenate([state[n] for n in state if n.startswith("running/")], axis=1)
        f["data_order"] = np.arange(5)
    fresh = tiny_net().compile(pass_images=4, bits=4, seed=3)
    checkpoint.restore(fresh, checkpoint.load(path))
    assert all(np.array_equal(fresh.state()[k], state[k]) for k in state)


def test_an_old_format_checkpoint_not_in_its_flat_layout_is_named(tmp_path):
    """Format 1 carries no checksums: its arrays' shapes are checked before restore slices them."""
    net = tiny_net().compile(pass_images=4, bits=4)
    state = net.state()
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update(format="minibp-checkpoint-1", iteration=3, config=json.dumps({}), data_epoch=0,
                       data_position=0, data_rng=json.dumps(np.random.default_rng(0).bit_generator.state))
        f["params"] = f["velocity"] = np.concatenate([a.ravel() for n, a in state.items() if n.startswith("params/")])
        f["running"] = np.concatenate([state[n] for n in state if n.startswith("running/")], axis=1).ravel()
        f["data_order"] = np.arange(5)
    with pytest.raises(ValueError, match="^" + re.escape(f"{path} is damaged: its params (")
                       + r"\d+,\), velocity \(\d+,\) and running \(\d+,\) are not the flat layout's"):
        checkpoint.restore(tiny_net().compile(pass_images=4, bits=4), checkpoint.load(path))


@pytest.mark.parametrize("name", ["checkpoint.h5", "best.h5"])
def test_a_checkpoint_is_never_read_through_a_link(tmp_path, data_dir, capsys, name):
    # A link in a run folder to another checkpoint (another user's, or one the reader may read and its owner not)
    assert train.main(base_args(tmp_path, iters=2, val_every=2, checkpoint_every=2)) == 0
    assert train.main(base_args(tmp_path, out="other", iters=2, val_every=2, checkpoint_every=2)) == 0
    path = tmp_path / "run" / name
    path.unlink()
    path.symlink_to(tmp_path / "other" / name)
    with pytest.raises(ValueError, match="is a symbolic link"):
        checkpoint.load(path)
    capsys.readouterr()
    assert evaluate.main([str(tmp_path / "run"), "--which", "last" if name == "checkpoint.h5" else "best"]) == 2
    assert f"{path} is a symbolic link" in one_line_error(capsys.readouterr().err)


def test_a_checkpoint_whose_arrays_live_in_another_file_is_refused(tmp_path, data_dir):
    # HDF5's external storage reads any file the reader may; the oldest format has no checksum to stop it
    assert train.main(base_args(tmp_path, iters=2, val_every=2, checkpoint_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    secret = tmp_path / "secret.raw"
    with h5py.File(path, "r+") as f:
        order = f["data_order"][...]
        secret.write_bytes(order.tobytes())
        del f["data_order"]
        f.create_dataset("data_order", shape=order.shape, dtype=order.dtype, external=[(str(secret), 0, order.nbytes)])
        f["data_order"].attrs["sha256"] = checkpoint.sha256(order)
    with pytest.raises(ValueError, match="data_order is stored outside the file"):
        checkpoint.load(path)


def test_a_checkpoint_with_fewer_class_names_than_classes_is_damaged(tmp_path):
    # a prediction of a class past the names would fail (IndexError) where load took them
    from minibp.io import data
    rng = np.random.default_rng(0)
    pair = lambda n: (rng.integers(0, 256, (n, 8, 8, 3), dtype=np.uint8), np.arange(n) % 4)  # noqa: E731
    path = data.write(tmp_path / "d.h5", train=pair(32), test=pair(8), classes=4, class_names=list("abcd"))
    assert train.main(["--data-file", str(path), "--model", "resnet11", "--batch", "16", "--iters", "2",
                       "--lr-schedule", "0:0.05", "--val-every", "2", "--out", str(tmp_path / "run")]) == 0
    saved = tmp_path / "run" / "checkpoint.h5"
    with h5py.File(saved, "r+") as f:
        _rewrite(f, "class_names", np.frombuffer(json.dumps(["a", "b", "c"]).encode(), np.uint8))
    with pytest.raises(ValueError, match="holds 3 class names for its data's 4 classes"):
        checkpoint.load(saved)


@pytest.fixture
def no_large_reads(monkeypatch):
    """A read of more than 256 MiB from any HDF5 dataset fails the test before it allocates: a refusal must come
    before the array is read (a crafted file that declares 33.5 GiB was read whole, or tried to be)."""
    read = h5py.Dataset.__getitem__

    def guarded(self, key):
        assert self.nbytes <= 256 << 20, f"{self.name} ({self.nbytes} bytes) was read"
        return read(self, key)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", guarded)


def _declare(path, name, size, **create):
    """Replace a checkpoint's array by one of `size` float32 values, keeping its checksum attribute."""
    with h5py.File(path, "r+") as f:
        digest = f[name].attrs["sha256"]
        del f[name]
        f.create_dataset(name, shape=(size,), dtype=np.float32, **create)
        f[name].attrs["sha256"] = digest


def test_a_checkpoint_that_declares_what_it_does_not_store_is_refused_before_it_is_read(tmp_path, data_dir, capsys,
                                                                                       no_large_reads):
    # --init-from a crafted checkpoint that declared 33.5 GiB read it whole and ended in a traceback
    assert train.main(base_args(tmp_path, out="source", iters=2, val_every=2)) == 0
    run = tmp_path / "source"
    for name in ("checkpoint.h5", "best.h5"):  # 33.5 GiB of float32 each, never written: files of kilobytes
        _declare(run / name, "state/params/unit0.w", 9 << 30)
        assert (run / name).stat().st_size < 1 << 20

    def expected(name):
        return (f"{run / name} is damaged: state/params/unit0.w's values declare 9,663,676,416 values (36.00 GiB) "
                "but the file stores 0 B of them (never written, or cut short)")
    with pytest.raises(ValueError) as refused:
        checkpoint.load(run / "checkpoint.h5")
    assert str(refused.value) == expected("checkpoint.h5")
    capsys.readouterr()
    assert train.main(base_args(tmp_path, out="tuned", iters=2, init_from=str(run))) == 2
    assert expected("best.h5") in one_line_error(capsys.readouterr().err)
    assert train.main(["--out", str(run), "--resume", "--iters", "4"]) == 2
    assert expected("checkpoint.h5") in one_line_error(capsys.readouterr().err)
    assert evaluate.main([str(run), "--which", "last"]) == 2
    assert expected("checkpoint.h5") in one_line_error(capsys.readouterr().err)


def test_a_checkpoint_larger_than_the_memory_is_refused_before_it_is_read(tmp_path, monkeypatch, no_large_reads):
    net = tiny_net().compile(pass_images=4, bits=4)
    path = checkpoint.save(tmp_path / "checkpoint.h5", net, iteration=1, config={"data": "cifar10"},
                           data_state=dict(epoch=0, position=0, order=np.arange(8),
                                           rng=json.dumps(np.random.default_rng(0).bit_generator.state)))
    with h5py.File(path, "r+") as f:  # 512 MiB of zeros, stored whole but compressed: a file of a megabyte or two
        del f["state/params/unit0.w"]
        dataset = f.create_dataset("state/params/unit0.w", shape=(128 << 20,), dtype=np.float32, chunks=(1 << 20,),
                                   compression="gzip", compression_opts=1)
        zeros = np.zeros(1 << 20, np.float32)
        for start in range(0, 128 << 20, 1 << 20):
            dataset[start:start + (1 << 20)] = zeros
        dataset.attrs["sha256"] = "0" * 64
    assert path.stat().st_size < 8 << 20
    monkeypatch.setattr(backend, "host_memory", lambda: 256 << 20)
    with pytest.raises(ValueError) as refused:
        checkpoint.load(path)
    assert re.fullmatch(re.escape(f"{path} holds arrays that take ") + r"512\.\d\d MiB" +
                        re.escape(" in memory, more than the 256.00 MiB available"), str(refused.value)), refused.value
