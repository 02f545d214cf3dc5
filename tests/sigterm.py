"""pytest plugin: SIGTERM stops a test run the way Ctrl-C does, so pytest tears down every fixture first.

Without it SIGTERM ends the process at once and every Ray cluster, storage emulator and API server a fixture
started keeps running (tests/test_sigterm_teardown.py).

Under pytest-xdist (`make test` runs two worker processes) the fixtures live in the workers, and the controller,
once interrupted, kills its workers 10 s later (xdist's EXIT_TIMEOUT), in the middle of their teardown. So:
- a worker takes the first SIGTERM or SIGINT as Ctrl-C (teardown, then it reports the interrupt) and ignores
  the ones after it (a terminal's Ctrl-C reaches it once from the terminal and once from the controller);
- the controller, at the first SIGTERM or SIGINT, passes SIGTERM on to its workers and waits for them to report,
  as it would for a worker that stopped by itself; a second signal interrupts it at once.

A fixture may put its own handler in place: ray.init does (sys.exit, or in a process that starts the head, stop
Ray's processes and exit), and a stop then only failed the test it hit while the run went on. So this plugin's
handlers are put back after each fixture's set-up and each test body; the fixtures' teardowns stop what they started.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

_state = {"role": "single", "signalled": False}


def _workers() -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process().children()]
    return []


def _stop(signum: int, frame: object) -> None:
    first = not _state["signalled"]
    _state["signalled"] = True
    role = _state["role"]
    if role == "controller" and first:
        for pid in _workers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        return  # the workers tear down, report the interrupt, and xdist ends the run with exit code 2
    if role == "worker" and not first:
        return  # already stopping: let the teardown finish
    raise KeyboardInterrupt(f"signal {signum}")  # pytest's own interrupt path: teardown, then exit 2


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):
        _state["role"] = "worker"
    elif getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", "no") != "no":
        _state["role"] = "controller"
    for sig in _handled():
        signal.signal(sig, _stop)


def _handled() -> tuple[int, ...]:
    return (signal.SIGTERM,) if _state["role"] == "single" else (signal.SIGTERM, signal.SIGINT)


def put_back() -> None:
    """This plugin's handlers again, where something (ray.init) replaced them."""
    for sig in _handled():
        if signal.getsignal(sig) is not _stop:
            signal.signal(sig, _stop)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    try:
        return (yield)
    finally:
        put_back()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):  # a test body that starts Ray itself (a job's auto-init)
    try:
        return (yield)
    finally:
        put_back()
