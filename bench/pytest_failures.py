"""A pytest plugin for runs that may be cut off (bench/gpu_check.sh): each failing test's report is
appended to $FAILURES_LOG as it happens, not in a summary at the end that a time limit can lose.

    FAILURES_LOG=failures.log python3 -m pytest -p pytest_failures ...   # bench/ on PYTHONPATH
"""
import os

_worker = False  # under pytest-xdist the workers' reports reach the controller too: it alone writes


def pytest_configure(config):
    global _worker
    _worker = hasattr(config, "workerinput")


def pytest_runtest_logreport(report):
    if report.failed and not _worker:
        with open(os.environ.get("FAILURES_LOG", "failures.log"), "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[-3000:]}\n")
