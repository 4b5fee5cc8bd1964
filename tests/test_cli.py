"""minibp/cli.py: the printing commands end quietly, with SIGPIPE's status, when their reader stops reading
(`python3 -m minibp.evaluate RUN | head`)."""
import signal
import subprocess
import sys

import pytest

from minibp import cli, train
from runs import ROOT, base_args


def commands(tmp_path, data_dir):
    """{command: argv} of each printing command, on a 2-iteration run and its data file."""
    run, data_file = str(tmp_path / "run"), str(data_dir / "cifar10.h5")
    return {"plan": ["minibp.plan", "--model", "resnet20", "--units"],
            "evaluate": ["minibp.evaluate", run, "--per-class"],
            "predict": ["minibp.predict", run, data_file],
            "export": ["minibp.export", run, "--format", "safetensors"]}


@pytest.mark.slow
def test_a_command_stops_quietly_when_its_reader_does(tmp_path, data_dir):
    """The pipe closes before the first line is printed: status 141 and nothing on stderr (it was a
    BrokenPipeError traceback from evaluate, predict and export), as a program killed by SIGPIPE ends."""
    assert train.main(base_args(tmp_path, iters=2, val_every=2)) == 0
    for name, argv in commands(tmp_path, data_dir).items():
        done = subprocess.Popen([sys.executable, "-m", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        done.stdout.close()  # the reader has gone before the first line
        err = done.stderr.read().decode()
        assert (name, done.wait(), err) == (name, 128 + signal.SIGPIPE, "")


def test_ctrl_c_is_one_line_and_130(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert cli.run(interrupted) == 128 + signal.SIGINT
    assert capsys.readouterr().err == "stopped: no file is left half written\n"
