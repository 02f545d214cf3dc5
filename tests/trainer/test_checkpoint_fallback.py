"""Checkpoint fallback (issue #13): the newest checkpoint of a run has a truncated optimizer.pt; the
restart reports it and resumes from the next older one instead of failing on it again and again."""

from __future__ import annotations

from pathlib import Path

import pytest
import vision_train

from demo.sample_data import build_sample_dataset
from tests.trainer.faults import KillWorkerAfterStep
from tests.trainer.test_ray_job import N_ROWS, RESUME_ATOL, SAVE_STEPS, job_flags, records

pytestmark = pytest.mark.slow

STEPS = 6
KILL_AFTER = 5  # after the checkpoints of steps 2 and 4


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records((run / "metrics.jsonl").read_text()) if r["kind"] == "train"}


def test_a_broken_newest_checkpoint_falls_back_to_the_older_one(ray_cluster, tiny_model, cache_dir, tmp_path,
                                                                capsys) -> None:
    data = build_sample_dataset(tmp_path / "data", n_rows=N_ROWS, seed=0)
    root = tmp_path / "storage"
    flags = [*job_flags(tiny_model, data, cache_dir, str(root), STEPS, run_name="fallback"), "--eval_fraction=0"]
    with pytest.raises(Exception, match="(?i)fail|error"):
        vision_train.main([*flags, "--max_failures=0"], callbacks=[KillWorkerAfterStep(KILL_AFTER)])
    run = root / "runs" / "fallback"
    first_attempt = train_losses(run)
    older, newest = (run / "checkpoints" / f"checkpoint-{s:06d}" for s in (SAVE_STEPS, 2 * SAVE_STEPS))
    optimizer = newest / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[: optimizer.stat().st_size // 2])
    capsys.readouterr()

    summary = vision_train.main(flags)
    # The driver's first line names the checkpoint the workers load: the older one, and why not the newest.
    assert capsys.readouterr().out.splitlines()[0] == (
        f"resuming fallback from step {SAVE_STEPS} (restart of this run: its newest intact checkpoint {older}; "
        f"{newest} (optimizer.pt: BadZipFile: File is not a zip file) does not load)")
    assert summary["completed"] is True and summary["global_step"] == STEPS
    assert summary["resumed_from_step"] == SAVE_STEPS and summary["resumed_from"] == str(older)
    (broken,) = summary["broken_checkpoints"]
    assert broken["checkpoint"] == str(newest) and broken["problem"].startswith("optimizer.pt: ")
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, STEPS + 1))  # every step once
    for step in range(SAVE_STEPS + 1, KILL_AFTER):  # retrained from step 2: the same losses as the first attempt
        assert losses[step] == pytest.approx(first_attempt[step], abs=RESUME_ATOL), step
