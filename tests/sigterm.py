"""pytest plugin: SIGTERM stops a test run the way Ctrl-C does, so pytest tears down every fixture first.

Without it SIGTERM ends the process at once and every Ray cluster, storage emulator and API server a fixture
started keeps running (tests/test_sigterm_teardown.py)."""

from __future__ import annotations

import signal


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # pytest's own interrupt path: teardown, then exit 2


def pytest_configure(config: object) -> None:
    signal.signal(signal.SIGTERM, _stop)
