"""The drills' faults fire only once Ray Train has registered the run's whole checkpoints
(tests/trainer/worker_callbacks.py, wait_until_registered). Before, a kill right after a checkpoint's step could
beat the controller to it (it collects reports on its next poll), and the restart, which ignores a checkpoint
Ray Train never registered, resumed from an older one or from nothing: three drills failed so once their steps got
fast (a step of 1 s instead of 12)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.trainer import worker_callbacks
from tests.trainer.job.test_checkpoint_check import register
from trainer.job.checkpoint_manifest import MANIFEST_FILE
from trainer.job.runs import CHECKPOINTS_DIR
from trainer.job.storage import Storage


def written(run: Path, *names: str, whole: bool = True) -> Path:
    checkpoints = run / CHECKPOINTS_DIR
    for name in names:
        (checkpoints / name).mkdir(parents=True)
        if whole:
            (checkpoints / name / MANIFEST_FILE).write_text("{}")
    return checkpoints


def test_returns_at_once_when_every_whole_checkpoint_is_registered(tmp_path: Path, capsys) -> None:
    checkpoints = written(tmp_path, "checkpoint-000002", "checkpoint-000004")
    written(tmp_path, "checkpoint-000006", whole=False)  # an upload cut short: no manifest, never waited for
    register(checkpoints, ["checkpoint-000002", "checkpoint-000004"])
    started = time.monotonic()
    worker_callbacks.wait_until_registered(Storage(str(tmp_path)))
    assert time.monotonic() - started < 1.0 and capsys.readouterr().out == ""


def test_waits_for_the_controller_to_register_the_newest(tmp_path: Path, capsys) -> None:
    checkpoints = written(tmp_path, "checkpoint-000002", "checkpoint-000004")
    register(checkpoints, ["checkpoint-000002"])  # the step-4 report not collected yet
    timer = threading.Timer(1.0, register, (checkpoints, ["checkpoint-000002", "checkpoint-000004"]))
    timer.start()
    started = time.monotonic()
    try:
        worker_callbacks.wait_until_registered(Storage(str(tmp_path)))
    finally:
        timer.cancel()
    assert 0.9 <= time.monotonic() - started < worker_callbacks.REGISTERED_WAIT_S
    assert capsys.readouterr().out == ""


def test_fires_anyway_after_its_wait_saying_so(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    written(tmp_path, "checkpoint-000002")  # no snapshot at all: nothing registered
    monkeypatch.setattr(worker_callbacks, "REGISTERED_WAIT_S", 0.5)
    worker_callbacks.wait_until_registered(Storage(str(tmp_path)))
    assert capsys.readouterr().out == ("[fault injection] ['checkpoint-000002'] not registered by Ray Train after 0.5 s: "
                                       "firing anyway\n")
