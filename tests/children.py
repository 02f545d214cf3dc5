"""Running a program that owns processes (a demo run with its Ray head, the elastic drill with its Ray cluster)
from a test: a stop of the test run reaches the program, which is waited for while it stops what it owns.

subprocess.run would SIGKILL it 0.25 s after the test run's KeyboardInterrupt (tests/sigterm.py turns CI's
SIGTERM into one): seen, an interrupted run left a demo's Ray head (its `ray start`, GCS and raylet) running.
"""

from __future__ import annotations

import subprocess

from e2e.proc import run_child


def run(argv: list[str], *, timeout: float, cwd=None, env=None) -> subprocess.CompletedProcess[str]:
    """Like subprocess.run(argv, capture_output=True, text=True, timeout=...); on an interrupt the program gets
    the signal (in a session of its own) and is waited for while it cleans up, then the interrupt goes on."""
    return run_child(argv, timeout=timeout, cwd=cwd, env=env)
