"""The drills' faults fire only once Ray Train has registered the run's newest checkpoint
(tests/trainer/worker_callbacks.py, wait_until_registered). Before, a kill right after a checkpoint's step could
beat the controller to it (it collects reports on its next poll), and the restart, which ignores a checkpoint
Ray Train never registered, resumed from an older one or from nothing: three drills failed so once their steps got
fast (a CPU step of 1 s instead of 12), and the first version of the wait, which listed checkpoints/, waited for
nothing on gs:// (a listing does not show the checkpoint prefixes there) and two more failed."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.trainer import worker_callbacks
from tests.trainer.conftest import GCS_BUCKET
from tests.trainer.job.test_checkpoint_check import register
from trainer.job.runs import CHECKPOINTS_DIR, RAY_CHECKPOINT_SNAPSHOT
from trainer.job.storage import Storage


def registering_later(storage: Storage, names: list[str], after_s: float, scratch: Path) -> threading.Timer:
    """Ray Train's controller, late: the snapshot listing `names` lands on the run's storage after `after_s`."""
    def write() -> None:
        scratch.mkdir(exist_ok=True)
        register(scratch, names)
        storage.write_bytes(f"{CHECKPOINTS_DIR}/{RAY_CHECKPOINT_SNAPSHOT}", (scratch / RAY_CHECKPOINT_SNAPSHOT).read_bytes())

    timer = threading.Timer(after_s, write)
    timer.start()
    return timer


def waited(storage: Storage, step: int) -> float:
    started = time.monotonic()
    worker_callbacks.wait_until_registered(storage, step)
    return time.monotonic() - started


@pytest.mark.parametrize(("step", "save_steps", "strategy", "newest"), [
    (5, 2, "steps", 4), (3, 2, "steps", 2), (1, 2, "steps", 0), (4, 2, "steps", 4), (5, 2, "no", 0), (5, 0, "steps", 0)])
def test_the_newest_save_follows_the_save_settings(step: int, save_steps: int, strategy: str, newest: int) -> None:
    args = SimpleNamespace(save_strategy=SimpleNamespace(value=strategy), save_steps=save_steps)
    assert worker_callbacks.newest_save(args, SimpleNamespace(global_step=step)) == newest


def test_returns_at_once_when_the_checkpoint_is_registered_or_none_was_saved(tmp_path: Path, capsys) -> None:
    (tmp_path / CHECKPOINTS_DIR).mkdir()
    register(tmp_path / CHECKPOINTS_DIR, ["checkpoint-000002", "checkpoint-000004"])
    assert waited(Storage(str(tmp_path)), 4) < 1.0
    assert waited(Storage(str(tmp_path)), 2) < 1.0  # a newer one registered counts too
    assert waited(Storage(str(tmp_path / "empty")), 0) < 1.0  # no save yet: nothing to wait for
    assert capsys.readouterr().out == ""


def test_waits_for_the_controller_to_register_it(tmp_path: Path, capsys) -> None:
    storage = Storage(str(tmp_path))
    (tmp_path / CHECKPOINTS_DIR).mkdir()
    register(tmp_path / CHECKPOINTS_DIR, ["checkpoint-000002"])  # the step-4 report not collected yet
    timer = registering_later(storage, ["checkpoint-000002", "checkpoint-000004"], 1.0, tmp_path / "controller")
    try:
        assert 0.9 <= waited(storage, 4) < worker_callbacks.REGISTERED_WAIT_S
    finally:
        timer.cancel()
    assert capsys.readouterr().out == ""


def test_waits_on_gcs_too(fake_gcs: str, tmp_path: Path, capsys) -> None:
    storage = Storage(root=f"gs://{GCS_BUCKET}/faults/run", emulator_host=fake_gcs)
    storage.write_bytes(f"{CHECKPOINTS_DIR}/checkpoint-000002/manifest.json", json.dumps({}).encode())
    timer = registering_later(storage, ["checkpoint-000002"], 1.0, tmp_path / "controller")
    try:
        assert 0.9 <= waited(storage, 2) < worker_callbacks.REGISTERED_WAIT_S
    finally:
        timer.cancel()
    assert capsys.readouterr().out == ""


def test_fires_anyway_after_its_wait_saying_so(tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_callbacks, "REGISTERED_WAIT_S", 0.5)
    assert waited(Storage(str(tmp_path)), 2) >= 0.5  # no snapshot at all: nothing registered
    assert capsys.readouterr().out == ("[fault injection] the step-2 checkpoint not registered by Ray Train after 0.5 s: "
                                       "firing anyway\n")
