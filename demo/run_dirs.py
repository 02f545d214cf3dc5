"""The demo's run folders: one per try, the newest kept, successful runs before failed ones.

Each run keeps its checkpoints (~1 GiB), so older runs are removed when a new one starts. A failed or
interrupted try must never rotate away the run a user came for: runs holding the demo's result file
(written only after the job succeeded and its report was copied) are removed only after every failed
or interrupted one, the newest successful run never; failures rotate among themselves. A run whose
demo still runs (it holds the folder's lock for its lifetime) is never removed nor counted.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

KEEP_RUNS = 3
RESULT_FILE = "demo-result.json"
RUN_LOCK = ".in-use"
# The lock of each run this process made, held until the process ends.
_LOCKS: dict[Path, IO[str]] = {}


def is_successful(run: Path) -> bool:
    return (run / RESULT_FILE).is_file()


def in_use(run: Path) -> bool:
    """True while another process holds the run's lock (its demo still runs)."""
    if run in _LOCKS:
        return True
    try:
        with open(run / RUN_LOCK, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return False  # no lock file can be made there: an old run of an earlier demo version
    return False


def rotate(output_dir: Path, keep: int, say: Callable[[str], None]) -> list[Path]:
    """Remove runs so that, with the one about to start, ``keep`` remain; returns those removed."""
    runs = sorted(p for p in output_dir.glob("run-*") if p.is_dir() and not in_use(p))
    excess = len(runs) - (keep - 1)
    if excess <= 0:
        return []
    good = [r for r in runs if is_successful(r)]
    failed = [r for r in runs if not is_successful(r)]
    removed = (failed + good[:-1])[:excess]
    for old in removed:
        shutil.rmtree(old, ignore_errors=True)
        kind = "successful" if old in good else "failed or interrupted"
        say(f"removed an older {kind} run (keeping {keep} runs, the successful ones first): {old}")
    return removed


def new_run_dir(output_dir: Path, say: Callable[[str], None], keep: int = KEEP_RUNS) -> Path:
    """A fresh ``run-<UTC time>-<pid>`` folder, locked for this process's lifetime; ``latest`` points to it."""
    output_dir.mkdir(parents=True, exist_ok=True)
    rotate(output_dir, keep, say)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    run_dir = (output_dir / f"run-{stamp}-{os.getpid()}").resolve()
    run_dir.mkdir()
    lock = open(run_dir / RUN_LOCK, "a")  # noqa: SIM115 - held until this process ends
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _LOCKS[run_dir] = lock
    latest = output_dir / "latest"
    if latest.is_symlink() or not latest.exists():
        latest.unlink(missing_ok=True)
        latest.symlink_to(run_dir.name)
    return run_dir


def release(run_dir: Path) -> None:
    """Drop this process's lock on ``run_dir`` (its try is over)."""
    lock = _LOCKS.pop(run_dir, None)
    if lock is not None:
        lock.close()
