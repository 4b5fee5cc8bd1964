"""Checkpoints: never written from a net that is not finite, every kind of damage named by the trainer and the
evaluator (the arrays and the attributes under checksums), and old formats still read."""
import json

import h5py
import numpy as np
import pytest

from minibp import checkpoint, evaluate, integrity, train
from nets import tiny_net, tiny_resnet, train_steps
from runs import base_args, one_line_error


def test_a_checkpoint_is_never_written_from_a_net_that_is_not_finite(tmp_path, data_dir):
    assert train.main(base_args(tmp_path, iters=2, checkpoint_every=1, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    before = path.read_bytes()
    net = tiny_resnet(classes=4).compile(batch=4, bits="4")
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


def _set_attrs(f, **attrs):
    """Change attributes and their checksum, as a hand-made checkpoint would: only the content checks remain."""
    f.attrs.update(attrs)
    f.attrs["attrs_sha256"] = checkpoint.attrs_sha256(f.attrs)


def _damage(path, how):
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
            _set_attrs(f, config="{not json")
        elif how == "missing state":
            del f["state"]
        elif how == "not finite":
            running = f["state/running/unit1.bn"][...]
            running[0, 0] = np.nan
            _rewrite(f, "state/running/unit1.bn", running)
        elif how == "wrong shape":
            _rewrite(f, "state/params/unit1.gamma", np.ones(3, np.float32))


@pytest.mark.parametrize("how,match", [("flipped bit", "state/params/unit0.w fails its SHA-256"),
                                       ("order out of range", "data_order is not a permutation"),
                                       ("broken config", "not valid JSON"),
                                       ("missing state", "lacks state"),
                                       ("not finite", "running/unit1.bn hold NaN"),
                                       ("wrong shape", "the checkpoint's unit1.gamma is (3,), the net's (16,)")])
def test_a_damaged_checkpoint_is_named_by_train_and_evaluate(tmp_path, data_dir, capsys, how, match):
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    path = tmp_path / "run" / "checkpoint.h5"
    _damage(path, how)
    capsys.readouterr()
    assert train.main(["--out", str(tmp_path / "run"), "--resume", "--iters", "4"]) == 2
    line = one_line_error(capsys.readouterr().err)
    assert str(path) in line and match in line and "learning rate" not in line
    assert evaluate.main([str(tmp_path / "run")]) == 2
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
    assert evaluate.main([str(tmp_path / "run")]) == 2
    assert "fail their SHA-256 check" in one_line_error(capsys.readouterr().err)


def test_an_old_format_checkpoint_still_resumes(tmp_path, rng):
    net = tiny_net().compile(batch=4, bits=4)
    train_steps(net, rng)
    state = net.state()
    names = [n for n, _, _ in net.parameter_table()]
    path = tmp_path / "old.h5"
    with h5py.File(path, "w") as f:  # the flat layout of minibp-checkpoint-1
        f.attrs.update(format="minibp-checkpoint-1", iteration=3, config=json.dumps({}), data_epoch=0,
                       data_position=0, data_rng=json.dumps({"state": {}}))
        f["params"] = np.concatenate([state["params/" + n].ravel() for n in names])
        f["velocity"] = np.concatenate([state["momentum/" + n].ravel() for n in names])
        f["running"] = np.concatenate([state[n] for n in state if n.startswith("running/")], axis=1)
        f["data_order"] = np.arange(5)
    fresh = tiny_net().compile(batch=4, bits=4, seed=3)
    checkpoint.restore(fresh, checkpoint.load(path))
    assert all(np.array_equal(fresh.state()[k], state[k]) for k in state)
