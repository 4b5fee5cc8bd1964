"""bash setup.sh beside other users and other runs of itself: it never clears or changes a venv it did not make for
the user who runs it, and two runs at once in one checkout make its venv once. The commands it runs are fakes on
PATH (dpkg, python3, the venv's python), so nothing is installed and nothing leaves the machine."""
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FAKE_DPKG = """#!/bin/sh
echo "Status: install ok installed"
"""
FAKE_PYTHON3 = """#!/bin/bash
case "$1" in
    -c) exit 0 ;;                       # the version check: a Python >= 3.10
    --version) echo "Python 3.11.0" ;;
    -m) [ "$2" = venv ] || exit 1
        echo "venv $$ start" >> "$FAKE_LOG"
        sleep "${FAKE_VENV_S:-0}"
        folder="${@: -1}"
        mkdir -p "$folder/bin" && cp "$FAKE_VENV_PYTHON" "$folder/bin/python"
        echo "venv $$ end" >> "$FAKE_LOG" ;;
esac
"""
# The venv's python: pip installs (logged; an install brings back what the venv had lost), the import check
# (which fails while the venv holds a file `lost`, as after pip uninstall h5py), the images extra's and the data's
# preparation.
FAKE_VENV_PYTHON = """#!/bin/bash
venv="$(dirname "$0")/.."
case "$1 $2" in
    "-m pip") [ "$3" != install ] || { echo "pip $*" >> "$FAKE_LOG"; rm -f "$venv/lost"; } ;;
    "-m minibp.prepare") mkdir -p data && touch data/fashion-mnist.h5 ;;
    "-m pytest") echo "pytest $*" ;;
    -c*) [ ! -e "$venv/lost" ] || { echo "ModuleNotFoundError: No module named '$(cat "$venv/lost")'" >&2; exit 1; }
         case "$2" in  # the images extra's check (fails while the venv holds `no-images`), and its command
             *matplotlib*) [ ! -e "$venv/no-images" ] || exit 1 ;;
             *install_command*) echo "$0 -m pip install -e '$PWD[images]'" ;;
         esac ;;
    *) exit 1 ;;
esac
"""


@pytest.fixture
def checkout():
    """A copy of setup.sh and what it reads in a folder others may read (not pytest's private tmp), with fake
    commands on PATH: (the checkout, the environment, the log of venvs made)."""
    where = Path(tempfile.mkdtemp(prefix="minibp-setup-"))
    try:
        os.chmod(where, 0o755)
        folder, fakes = where / "checkout", where / "fakes"
        folder.mkdir()
        fakes.mkdir()
        for name in ("setup.sh", "setup.cfg", "pyproject.toml"):
            shutil.copy(ROOT / name, folder / name)
        for name, text in (("dpkg", FAKE_DPKG), ("python3", FAKE_PYTHON3), ("venv-python", FAKE_VENV_PYTHON)):
            (fakes / name).write_text(text)
            (fakes / name).chmod(0o755)
        log = where / "log"
        log.write_text("")
        log.chmod(0o666)
        env = dict(PATH=f"{fakes}:/usr/bin:/bin:/usr/sbin:/sbin", HOME=str(where), FAKE_LOG=str(log),
                   FAKE_VENV_PYTHON=str(fakes / "venv-python"))
        for path in [where] + list(where.rglob("*")):  # readable by others, as a checkout usually is
            path.chmod(path.stat().st_mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0))
        yield folder, env, log
    finally:
        shutil.rmtree(where)


def setup(folder, env, *, user=None):
    command = ["bash", "setup.sh", "setup"]
    if user is not None:  # another user runs it in this checkout
        command = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + command
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's venv needs root to make (chown) or to be another user")
@pytest.mark.parametrize("who", ["another user in root's checkout", "root in another user's checkout"])
def test_a_venv_of_another_user_is_never_cleared_and_the_refusal_says_whose_it_is(checkout, who):
    # As seen: setup.sh train run by another user in root's checkout ran venv --clear over root's venv, and failed on
    # permissions without a word of whose it was
    folder, env, log = checkout
    venv = folder / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nexit 1\n")  # a venv this user cannot run (pip fails)
    (venv / "bin" / "python").chmod(0o755)
    (venv / "theirs").write_text("kept")
    if who.startswith("root in"):
        for path in [venv] + list(venv.rglob("*")):
            os.chown(path, 65534, 65534)
    done = setup(folder, env, user=65534 if who.startswith("another") else None)
    assert done.returncode == 1, done.stdout + done.stderr
    owner = "root (uid 0)" if who.startswith("another") else "nobody (uid 65534)"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"venv .venv belongs to {owner}" in lines[0] and "never" in lines[0], done.stderr
    assert (venv / "theirs").read_text() == "kept" and "venv" not in log.read_text()


def test_two_runs_at_once_make_the_venv_once_and_both_finish(checkout):
    folder, env, log = checkout
    env = dict(env, FAKE_VENV_S="1")  # the venv takes a second to make: the second run comes meanwhile
    results = [None, None]

    def run(i):
        results[i] = setup(folder, env)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.returncode == 0 for r in results), [r.stdout + r.stderr for r in results]
    assert log.read_text().count(" start") == 1, log.read_text()  # one venv made, not two over each other
    assert any("waiting for it" in r.stdout for r in results)
    assert all("main job: set up, not started" in r.stdout for r in results)


def test_a_run_folder_with_best_h5_alone_is_continued_not_started_again(checkout):
    folder, env, _ = checkout
    assert setup(folder, env).returncode == 0
    (folder / "runs" / "fm-4bit").mkdir(parents=True)
    (folder / "runs" / "fm-4bit" / "best.h5").write_text("")
    (folder / ".venv" / "bin" / "python3").symlink_to("python")
    done = subprocess.run(["bash", "setup.sh", "train"], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=60)
    assert "main job: runs/fm-4bit/best.h5 exists, continuing it: python3 -m minibp.train --out runs/fm-4bit --resume" \
        in done.stdout, done.stdout


@pytest.mark.parametrize("kind", ["setup", "test"])
def test_a_venv_that_lost_a_package_is_installed_again_not_called_up_to_date(checkout, kind):
    # With h5py uninstalled from .venv, setup.sh said "install: up to date" and the main job died with
    # ModuleNotFoundError: the stamp said what was installed once, not what the venv imports now
    folder, env, log = checkout
    command = ["bash", "setup.sh", kind] + (["--version"] if kind == "test" else [])
    run = lambda: subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=60)  # noqa: E731
    assert run().returncode == 0
    installs = log.read_text().count("pip ")
    again = run()
    assert again.returncode == 0 and "install: up to date, skipped" in again.stdout, again.stdout + again.stderr
    assert log.read_text().count("pip ") == installs  # nothing installed the second time
    (folder / ".venv" / "lost").write_text("h5py")
    done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    said = ("install: .venv does not import what the job needs (ModuleNotFoundError: No module named 'h5py'): "
            "installing again")
    assert "up to date" not in done.stdout and said in done.stdout, done.stdout
    assert log.read_text().count("pip ") > installs and not (folder / ".venv" / "lost").exists()


def test_setup_says_how_to_install_the_images_extra_where_it_is_missing(checkout):
    """The own-images flow needs the images extra beyond the main job: setup says the one command, once, where the
    venv lacks it, and nothing where it has it."""
    folder, env, _ = checkout
    done = setup(folder, env)
    assert done.returncode == 0 and "your own images" not in done.stdout
    (folder / ".venv" / "no-images").write_text("")
    done = setup(folder, env)
    assert done.returncode == 0
    assert f"your own images: .venv/bin/python -m pip install -e '{folder}[images]'" in done.stdout, done.stdout
