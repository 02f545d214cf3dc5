"""The worker's scratch directory never outlives the worker (trainer/worker/scratch.py).

The defect this holds: every training run left its rank's scratch (local checkpoints, TensorBoard files,
~0.5 GB for the tiny model) in the tempfile directory: 248 of them, 25 GB, filled this machine's disk
in a day of test runs, and on the chart's pods the /tmp emptyDir keeps one per retried attempt.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from trainer.worker import scratch


@pytest.fixture
def tmp_root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_removed_on_return(tmp_root) -> None:
    with scratch.scratch_dir(0) as d:
        (d / "checkpoint-1").mkdir()
        (d / "checkpoint-1" / "adapter.bin").write_bytes(b"x" * 100)
        assert d.parent == tmp_root
    assert not d.exists()
    assert list(tmp_root.iterdir()) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_removed_on_an_exception_or_interrupt(tmp_root, exc) -> None:
    with pytest.raises(type(exc)), scratch.scratch_dir(1) as d:
        (d / "f").write_text("x")
        raise exc
    assert not d.exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_workers_scratch_is_removed_by_the_next_worker(tmp_root) -> None:
    dead = tmp_root / f"{scratch.PREFIX}0-pid{dead_pid()}-abc"
    (dead / "checkpoint-4").mkdir(parents=True)
    live = tmp_root / f"{scratch.PREFIX}1-pid1-abc"  # pid 1 is alive
    live.mkdir()
    other = tmp_root / f"{scratch.PREFIX}0-abc"  # not ours by name (no pid): left alone
    other.mkdir()
    unrelated = tmp_root / "someone-else"
    unrelated.mkdir()
    with scratch.scratch_dir(0) as d:
        assert not dead.exists()
        assert live.is_dir() and other.is_dir() and unrelated.is_dir() and d.is_dir()
    assert sorted(p.name for p in tmp_root.iterdir()) == sorted([live.name, other.name, unrelated.name])
