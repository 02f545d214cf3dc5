"""Shared test set-up: the repository root on sys.path (for `demo`, `localkit`, `trainer`), offline hubs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The checkout's own plugin package wins over any installed copy (the venv's editable install may
# point at another checkout of this repository).
for path in (ROOT, ROOT / "plugin"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Local test clusters are single-machine: "0" keeps every Ray server on the node address given
# (127.0.0.1). Ray reads it when `ray` is first imported, so it is set here, before any test module.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# One real kube-apiserver per session, shared by tests/plugin and tests/lifecycle (it takes ~15 s to
# start on a 2-core machine). Imported after sys.path holds the checkout.
from tests.plugin.kube_apiserver import kube_apiserver, kueue_crds  # noqa: E402, F401 - session fixtures

# SIGTERM (CI's deadline, `timeout`) stops the run as Ctrl-C does: every fixture's teardown runs first.
pytest_plugins = ["tests.sigterm"]

# `make test` runs on two processes (pytest-xdist, `-n 2`) with the scheduler below: a module's tests stay on one
# process, so its module fixtures (a Ray job, a demo run) run once; modules whose tests share a session fixture
# that runs a job are one group, so that job runs once too; the longest groups go out first.
# (xdist's own --dist loadgroup marks nothing under pytest 9.2: it renames `item._nodeid`, which pytest 9 no
# longer reads.)
SHARED_SESSION_RUNS = ("gcs_restart_run",)
# module -> the module whose group it joins; collection below checks that every user of a shared run is here.
SAME_GROUP = {"tests/trainer/test_scale.py": "tests/trainer/test_ray_job.py"}
# The longest groups first: a long one picked up last is the run's tail on one process while the other idles.
# Seconds: each module's share of a whole `-n 2` run here (2026-12-04, idle 2-core machine, 2406 s in all, with the LM
# head scoring only labelled positions on CPU); the rest keep their order.
SLOW_FIRST = {
    "tests/demo/test_demo.py": 262,
    "tests/trainer/test_ray_job.py": 240,  # with test_scale.py: one session run
    "tests/trainer/test_elastic.py": 239,
    "tests/trainer/test_run_identity.py": 221,
    "tests/trainer/data/test_streaming.py": 143,
    "tests/trainer/test_checkpoint_fallback.py": 135,
    "tests/trainer/test_usage_error_job.py": 99,
    "tests/trainer/test_batch_shape.py": 85,
    "tests/trainer/test_messy_data.py": 51,
    "tests/trainer/test_light_driver_job.py": 45,
    "tests/trainer/worker/test_samples.py": 34,  # with the Ray groups: the session's cluster stops after them
}


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return SAME_GROUP.get(module, module)


def pytest_collection_modifyitems(config, items) -> None:
    users: dict[str, set[str]] = {}
    for item in items:
        for name in SHARED_SESSION_RUNS:
            if name in getattr(item, "fixturenames", ()):
                users.setdefault(name, set()).add(group_of(item.nodeid))
    for name, groups in users.items():
        if len(groups) > 1:
            raise pytest.UsageError(f"the session fixture {name} runs a job that modules {sorted(groups)} share: put "
                                    "them in one group in SAME_GROUP of tests/conftest.py")
    rank = {m: i for i, m in enumerate(sorted(SLOW_FIRST, key=lambda m: -SLOW_FIRST[m]))}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable: the rest keep their order


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own (firstresult); a no-op without xdist
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's load-by-scope, a scope being group_of(); groups go out in collection order."""

        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return GroupScheduling(config, log)


# The run's timeline, for balancing the groups above: `G3R_TEST_TIMELINE=path make test` appends one line per
# test start and end ("<unix time> <process> start|end <node id>"), e.g. to see which process ends last.
TIMELINE_ENV = "G3R_TEST_TIMELINE"


def _timeline(event: str, nodeid: str) -> None:
    path = os.environ.get(TIMELINE_ENV)
    if path:
        import time

        with open(path, "a") as fh:
            fh.write(f"{time.time():.1f} {os.environ.get('PYTEST_XDIST_WORKER', 'main')} {event} {nodeid}\n")


def pytest_runtest_logstart(nodeid, location) -> None:
    _timeline("start", nodeid)


def pytest_runtest_logfinish(nodeid, location) -> None:
    _timeline("end", nodeid)
