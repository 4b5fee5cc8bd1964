#!/usr/bin/env bash
# A fresh Debian/Ubuntu machine, from a checkout, in one command each:
#   bash setup.sh setup           set up the main job (apt packages, venv, minibp, the data) and stop
#   bash setup.sh train           set up the main job, then run it (or continue it)
#   bash setup.sh test [ARGS...]  set up the tests, then run the whole suite (ARGS go on to pytest)
# Every step that is already done is skipped with one line, so running it again is cheap.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# The main job, the one place to change it. `python3` is the venv's (its bin/ goes first on PATH).
OUT=runs/fm-4bit
# ResNet-20, 4-bit stores, 4.3 epochs of Fashion-MNIST on a cosine schedule, no augmentation (a short run
# learns faster without it): 91.70% test accuracy in about 9 minutes on 2 cores with AVX-512
# (docs/results.md).
MAIN_JOB=(python3 -m minibp.train --data fashion-mnist --model resnet20 --bits 4 --iters 2000
          --lr-schedule cosine:0.1:warmup=100 --augment none --val-every 500 --out "$OUT")
# A run with a checkpoint continues from it instead; a finished run just says it is done.
RESUME_JOB=(python3 -m minibp.train --out "$OUT" --resume)

# g++ builds the CPU kernels; python3-venv makes the venv; dataset-fashion-mnist holds the data.
MAIN_APT=(g++ python3-venv dataset-fashion-mnist)
# The tests also build and run the direct convolutions' NEON version (tests/layers/test_conv.py): an
# aarch64 cross compiler, and qemu to run what it builds. tests/test_hosts.py links simulated machines
# (network namespaces) with iproute2's ip.
TEST_APT=("${MAIN_APT[@]}" g++-aarch64-linux-gnu qemu-user-static iproute2)
# tests/layers/test_conv_cudnn.py builds cuDNN graph descriptions on the CPU: the frontend alone, --no-deps
# leaving out its GPU-only dependencies (so it is not in the test extra).
CUDNN_FRONTEND='nvidia-cudnn-frontend==1.32.0'

VENV=.venv
STAMP=$VENV/minibp-install.stamp  # what was pip-installed, and from which setup.cfg/pyproject.toml
# What each install must import: the stamp says what was installed once, not what the venv holds now (a
# `pip uninstall h5py` leaves it in place, and the job would die on its first import).
MAIN_IMPORTS="minibp, numpy, h5py"
TEST_IMPORTS="$MAIN_IMPORTS, pytest, setuptools, wheel, cupy, matplotlib, PIL, mpi4py, onnx, onnxruntime"
TEST_IMPORTS+=", safetensors, cudnn"
DATA=data/fashion-mnist.h5

usage() { echo "usage: bash setup.sh setup | bash setup.sh train | bash setup.sh test [PYTEST ARGS...]" >&2; exit 2; }

# Two runs at once in one checkout would make the venv twice over each other, or install into it while the
# other makes it: the set-up holds a lock on the checkout's folder (flock(1), nothing written), a second run
# waits for it and then finds each step done. The job that follows runs without the lock.
lock_checkout() {
    exec 9<.
    if ! flock -n 9; then
        echo "setup.sh: another setup.sh is setting up this checkout; waiting for it to finish"
        flock 9
    fi
}
unlock_checkout() { exec 9<&-; }

# Any command that fails names the step it was in, on one line, and the script exits non-zero.
STEP=""
fail() { STEP=""; echo "$*" >&2; exit 1; }  # a failure that says its own line
trap 'rc=$?; if [ "$rc" -ne 0 ] && [ -n "$STEP" ]; then echo "setup.sh: $STEP failed (exit $rc)" >&2; fi' EXIT

apt_packages() {  # install those of "$@" that dpkg does not list as installed
    STEP="apt packages"
    command -v dpkg >/dev/null || fail "apt packages: no dpkg here (this script knows Debian/Ubuntu); install $* by hand"
    local missing=() package
    for package in "$@"; do
        [ "$(dpkg -s "$package" 2>/dev/null | sed -n 's/^Status: //p')" = "install ok installed" ] \
            || missing+=("$package")
    done
    if [ ${#missing[@]} -eq 0 ]; then echo "apt packages: present, skipped"; return; fi
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if sudo -n true 2>/dev/null; then sudo=(sudo); else
            fail "apt packages: missing ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}"
        fi
    fi
    echo "apt packages: installing ${missing[*]}"
    # noninteractive: CI has no stdin to answer a prompt
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

make_venv() {  # a system Python refuses a bare pip install: everything goes into $VENV
    STEP="venv $VENV"
    # Another user's venv (root's, in a checkout another user runs this in) is never made again or changed:
    # --clear would delete it, or fail on permissions without saying whose it is.
    if [ -e "$VENV" ] && [ "$(stat -L -c %u "$VENV")" != "$(id -u)" ]; then
        fail "venv $VENV belongs to $(stat -L -c %U "$VENV") (uid $(stat -L -c %u "$VENV")), not to you ($(id -un)):" \
             "setup.sh never makes again or changes a venv it did not make for you; run it as its owner, or in a" \
             "checkout of your own"
    fi
    if "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then echo "venv $VENV: present, skipped"; return; fi
    command -v python3 >/dev/null || fail "venv $VENV: no python3 on PATH; install Python >= 3.10"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
        || fail "venv $VENV: $(command -v python3) is $(python3 --version 2>&1); minibp needs Python >= 3.10"
    echo "venv $VENV: creating it with $(command -v python3) ($(python3 --version 2>&1))"
    # --clear: a venv left half-made (no pip: python3-venv was missing) is made again, not kept
    python3 -m venv --clear "$VENV"
}

install() {  # $1: main (pip install -e .) or test (the test extra and the cuDNN frontend)
    local kind=$1 want
    STEP="install ($kind)"
    # Redone when setup.cfg, pyproject.toml or the frontend's pin change; the test install holds
    # the main job's too, so it stands for both.
    want="$(cat setup.cfg pyproject.toml <(echo "$CUDNN_FRONTEND") | sha256sum | cut -d' ' -f1)"
    if [ -f "$STAMP" ] && { [ "$(cat "$STAMP")" = "$want $kind" ] || [ "$(cat "$STAMP")" = "$want test" ]; }; then
        local imports=$MAIN_IMPORTS missing
        [ "$kind" = main ] || imports=$TEST_IMPORTS
        if missing=$("$VENV/bin/python" -c "import $imports" 2>&1); then
            echo "install: up to date, skipped"; return
        fi
        echo "install: $VENV does not import what the job needs ($(echo "$missing" | tail -n 1)): installing again"
    fi
    rm -f "$STAMP"
    if [ "$kind" = main ]; then
        echo "install: pip install -e . into $VENV"
        "$VENV/bin/python" -m pip install -e .
    else
        echo "install: pip install -e '.[test]' and --no-deps '$CUDNN_FRONTEND' into $VENV"
        "$VENV/bin/python" -m pip install -e '.[test]'
        "$VENV/bin/python" -m pip install --no-deps "$CUDNN_FRONTEND"
    fi
    echo "$want $kind" > "$STAMP"  # written last: an interrupted install is redone
}

prepare_data() {
    STEP="data $DATA"
    if [ -f "$DATA" ]; then echo "$DATA: present, skipped"; return; fi
    # writes a temporary file and renames it, so a file that is there is whole
    "$VENV/bin/python" -m minibp.prepare fashion-mnist
}

activate() {  # what runs last sees the venv as activated: its python first on PATH (mpirun too)
    export VIRTUAL_ENV="$PWD/$VENV" PATH="$PWD/$VENV/bin:$PATH"
}

set_up_main() {  # what the main job needs, each step skipped where it is done
    lock_checkout
    apt_packages "${MAIN_APT[@]}"
    make_venv
    install main
    prepare_data
    unlock_checkout
}

case "${1:-}" in
    setup)
        [ $# -eq 1 ] || usage
        set_up_main
        STEP=""
        echo "main job: set up, not started; bash setup.sh train runs it (or, after . $VENV/bin/activate: ${MAIN_JOB[*]})"
        # Your own images (prepare folder, predict on image files, export, plots) need the images extra: said
        # once where it is missing, in the form every refusal gives it (minibp/extras.py)
        "$VENV/bin/python" -c 'import PIL, onnx, onnxruntime, safetensors, matplotlib' 2>/dev/null \
            || echo "your own images: $("$VENV/bin/python" -c 'from minibp import extras; print(extras.install_command("images"))')"
        ;;
    train)
        [ $# -eq 1 ] || usage
        set_up_main
        STEP="main job"
        activate
        saved=""  # the run's state on disk: its checkpoint, or best.h5 alone (it validated, then stopped)
        for name in checkpoint.h5 best.h5; do [ -n "$saved" ] || [ ! -f "$OUT/$name" ] || saved=$OUT/$name; done
        if [ -n "$saved" ]; then
            echo "main job: $saved exists, continuing it: ${RESUME_JOB[*]}"
            job=("${RESUME_JOB[@]}")
        else
            echo "main job: ${MAIN_JOB[*]}"
            job=("${MAIN_JOB[@]}")
        fi
        rc=0; "${job[@]}" || rc=$?
        # Ctrl-C or SIGTERM: the trainer saved a checkpoint and exits 130 or 143; not a failure of the set-up
        if [ "$rc" -eq 130 ] || [ "$rc" -eq 143 ]; then
            STEP=""; echo "main job: stopped; bash setup.sh train continues it"
        fi
        exit "$rc"
        ;;
    test)
        shift
        lock_checkout
        apt_packages "${TEST_APT[@]}"
        make_venv
        install test
        unlock_checkout
        STEP="tests"
        activate
        echo "tests: $VENV/bin/python -m pytest -q $*"
        "$VENV/bin/python" -m pytest -q "$@"
        ;;
    *) usage ;;
esac
