"""Training across machines, simulated by namespaces on this one (tests/hosts.py): MPICH's mpiexec on host0 starts
ranks on the others through a launcher in ssh's place. Ranks spread over 2 or 3 hosts give one process's
--sub-batches run bit for bit and resume on other hosts; rank 0's host alone holds the run folder; each host reads
its own copy of the data (a host whose copy differs, or that has none, is refused before the first step); and a host
cut off from the network, a rank killed on another host or a host whose kernel cache is on a full disk ends the job
in one line."""
import os
import re
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="the tests of several ranks need mpi4py and mpich: pip install -e '.[dist]'")

import hosts  # noqa: E402
from hosts import ENV, Hosts, errors, rank_pid, same_state, train, without_timing  # noqa: E402
from minibp import build, dist, integrity  # noqa: E402
from minibp.run import checkpoint  # noqa: E402
from minibp.run.folder import RunDir  # noqa: E402
from runs import base_args, make_dataset, read_metrics, wait_for_lines  # noqa: E402

pytestmark = pytest.mark.slow  # every test starts trainers under mpiexec

if hosts.unavailable():
    pytest.skip(hosts.unavailable(), allow_module_level=True)

# Each host's kernel cache is its own: the same path, in each host's own /tmp.
HOST_ENV = dict(ENV, XDG_CACHE_HOME="/tmp/cache")
STORES = {"block": {}, "stochastic": dict(bits=2, rounding="stochastic")}  # the 4-bit block window, the default
FOUR_ON_TWO, THREE_ON_THREE = (2, 2, 0), (1, 1, 1)  # ranks on host0, host1, host2


def options(out, **overrides):
    """Batch 24 (4 or 3 ranks of 6 or 8 images), 6 iterations; the data at /tmp/data (each host's own)."""
    overrides = dict(dict(data_dir="/tmp/data", batch=24, iters=6, log_every=1, val_every=3, checkpoint_every=3),
                     **overrides)
    return base_args(Path("/"), out=out, **overrides)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The data set and the runs of one process the hosts' runs must equal: --sub-batches 4 and 3, in each store (they
    also build the kernels, which every host's cache starts with)."""
    tmp = tmp_path_factory.mktemp("hosts")
    make_dataset(tmp / "data")
    for split in (4, 3):
        for store, store_options in STORES.items():
            result = train(options(str(tmp / f"one-{split}-{store}"), data_dir=str(tmp / "data"), sub_batches=split,
                                   **store_options))
            assert result.returncode == 0, result.stderr
    return tmp


@pytest.fixture
def cluster(work, tmp_path):
    """3 hosts, each with the data in /tmp/data and a copy of this machine's kernel cache in /tmp/cache."""
    with Hosts(tmp_path / "hosts", 3) as made:
        for host in made:
            host.path("/tmp/data").mkdir()
            shutil.copy(work / "data" / "cifar10.h5", host.path("/tmp/data"))
            cache = host.path("/tmp/cache/minibp/kernels")
            shutil.copytree(build.cache_dir(), cache, ignore=shutil.ignore_patterns("build-*"))
            for folder in (cache.parent, cache):  # private, as minibp makes them (copytree's follow the umask)
                folder.chmod(0o700)
        yield made


def run_on(cluster, ranks, argv, *, env=HOST_ENV, timeout=180):
    """The trainer under mpiexec, ranks[i] ranks on host i: a CompletedProcess whose stdout and stderr both hold
    the merged output."""
    process = cluster.mpiexec(ranks, argv, env=env)
    try:
        output = process.communicate(timeout=timeout)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, output, output)


def one_error(result):
    """The one error line of a job that failed cleanly: non-zero, no traceback."""
    assert result.returncode != 0 and "Traceback" not in result.stdout, result.stdout
    lines = set(errors(result))  # (the launcher may forward a line twice as the job ends)
    assert len(lines) == 1, result.stdout
    return lines.pop()


@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("ranks", [FOUR_ON_TWO, THREE_ON_THREE], ids=["4-ranks-on-2-hosts", "3-ranks-on-3-hosts"])
def test_ranks_on_several_hosts_train_bit_for_bit_as_one_process(work, cluster, ranks, store):
    """On 2 hosts each has its own kernel cache; the 3 share this machine's (the same path on each, as a shared
    home folder would be). Rank 0's host alone has the run folder."""
    env = HOST_ENV if ranks == FOUR_ON_TWO else ENV
    result = run_on(cluster, ranks, options("/tmp/runs/run", **STORES[store]), env=env)
    assert result.returncode == 0, result.stdout
    assert result.stdout.count("done: 6 iterations") == 1  # rank 0 alone prints
    run, reference = cluster[0].path("/tmp/runs/run"), work / f"one-{sum(ranks)}-{store}"
    assert same_state(reference, run)  # weights, momentum and every running statistic
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(reference))
    assert sorted(p.name for p in run.iterdir()) == ["best.h5", "checkpoint.h5", "lock", "metrics.jsonl"]
    assert not any(host.path("/tmp/runs").exists() for host in cluster[1:])


def test_a_run_resumes_bit_for_bit_on_one_host_and_on_another_number_of_hosts(work, cluster):
    for first, then in ((FOUR_ON_TWO, (4, 0, 0)), (THREE_ON_THREE, (2, 1, 0))):
        out = f"/tmp/runs/from-{sum(first)}"
        result = run_on(cluster, first, options(out, iters=3))
        assert result.returncode == 0, result.stdout
        result = run_on(cluster, then, ["--out", out, "--resume", "--iters", "6"])
        assert result.returncode == 0, result.stdout
        run, reference = cluster[0].path(out), work / f"one-{sum(first)}-block"
        assert same_state(reference, run), then
        for kind, key in (("train", "loss"), ("val", "accuracy")):
            assert [(r["iter"], r[key]) for r in read_metrics(run) if r["kind"] == kind] == \
                [(r["iter"], r[key]) for r in read_metrics(reference) if r["kind"] == kind], (then, kind)


@pytest.mark.parametrize("how", ["other", "missing"])
def test_a_host_without_rank_0s_data_is_refused_before_the_first_step(cluster, how):
    data = cluster[1].path("/tmp/data/cifar10.h5")
    if how == "other":
        make_dataset(data.parent, seed=1)  # the same shapes, other images
    else:
        data.unlink()
    result = run_on(cluster, FOUR_ON_TWO, options("/tmp/runs/refused"))
    line = one_error(result)
    if how == "other":
        assert result.returncode == 2
        assert re.fullmatch(r"error: rank 2 on host1 reads other data than rank 0 on host0: its /tmp/data/cifar10.h5 "
                            r"has SHA-256 [0-9a-f]{16}\.\.\., rank 0's [0-9a-f]{16}\.\.\.; every rank needs the same "
                            r"data at the same path", line), line
    else:
        assert re.fullmatch(r"error: rank [23] on host1: .*/tmp/data/cifar10\.h5.*", line), line
    assert "iter " not in result.stdout
    assert not (cluster[0].path("/tmp/runs/refused") / "checkpoint.h5").exists()


def start_long_run(cluster, *, tag, timeout):
    argv = options("/tmp/runs/long", iters=100000, checkpoint_every=2, val_every=100000) + ["--rank-timeout",
                                                                                            str(timeout)]
    process = cluster.mpiexec(FOUR_ON_TWO, argv, env=dict(HOST_ENV, MINIBP_TEST_TAG=tag))
    wait_for_lines(cluster[0].path("/tmp/runs/long/metrics.jsonl"), 5)
    assert process.poll() is None, process.communicate()[0]
    return process


@pytest.mark.parametrize("how", ["cut off", "killed"])
def test_a_host_that_fails_mid_run_ends_the_job_and_keeps_the_checkpoint(cluster, how):
    """Cut off (its link down): the ranks on host0 wait --rank-timeout, find that those on host1 do not answer
    and say so in one line. Killed (a rank on host1): host1's MPI proxy sees it and mpiexec ends the job at once."""
    tag, timeout = uuid.uuid4().hex, 3
    process = start_long_run(cluster, tag=tag, timeout=timeout)
    try:
        started = time.time()
        if how == "cut off":
            cluster[1].link("down")
        else:
            os.kill(rank_pid(tag, 3), signal.SIGKILL)
        output = process.communicate(timeout=60)[0]
        took = time.time() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    result = subprocess.CompletedProcess(process.args, process.returncode, output, output)
    if how == "cut off":
        line = one_error(result)
        assert took < timeout + 2 * dist.GRACE_S + 5, took
        assert re.fullmatch(r"error: rank [01] of 4 waited 3 s for the others at a [a-z ]+: ranks 2, 3 on host1 do "
                            r"not answer: died, stopped, hung or cut off from the network \(an error of their own, if "
                            r"any, is above\); --rank-timeout sets the wait", line), line
    else:
        assert result.returncode != 0 and "Traceback" not in output and took < 10, output
        assert "BAD TERMINATION" in output
        assert re.search(rf"RUNNING AT {re.escape(cluster[1].address)}\s", output), output
    run = cluster[0].path("/tmp/runs/long")
    saved = checkpoint.load(run / "checkpoint.h5")  # whole (load checks every array)
    assert saved.iteration >= 4 and saved.iteration % 2 == 0
    # Cut off, rank 0 ends by itself, so no write is left half done. Killed, mpiexec SIGKILLs rank 0 too, which may
    # be in the middle of a checkpoint (one every 2 iterations): its temporary stays beside the whole checkpoint
    # until the next start claims the folder and removes it.
    assert len(integrity.stale_temporaries(run / "checkpoint.h5")) <= (0 if how == "cut off" else 1)
    hosts.wait_for_rank_to_exit(tag, 0)  # the next start would refuse the folder while a dying rank 0 holds it
    RunDir.claim(run, fresh=False).release()
    assert not integrity.stale_temporaries(run / "checkpoint.h5")


def test_a_host_whose_kernel_cache_is_on_a_full_disk_ends_the_job_in_one_line(work, cluster):
    """host1's cache is a tmpfs of 64 KiB: its ranks must build the kernels there, and the linker finds the disk
    full. The run resumed (one process's, at iteration 6) keeps its checkpoint."""
    run = cluster[0].path("/tmp/runs/full")
    shutil.copytree(work / "one-4-block", run)
    before = integrity.file_digest(run / "checkpoint.h5")
    cluster[1].mount_tmpfs("/tmp/cache", size="64k")
    result = run_on(cluster, FOUR_ON_TWO, ["--out", "/tmp/runs/full", "--resume", "--iters", "7",
                                           "--data-dir", "/tmp/data"])  # (the run's own was this machine's)
    line = one_error(result)
    assert result.returncode == 2
    assert re.fullmatch(r"error: rank [23] on host1: g\+\+ could not compile \S+\.cu \(real_t=float\): "
                        r".*No space left on device.*", line), line
    assert integrity.file_digest(run / "checkpoint.h5") == before
    assert checkpoint.load(run / "checkpoint.h5").iteration == 6
