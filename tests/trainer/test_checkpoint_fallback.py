"""Checkpoint fallback (issues #13, #21): the newest checkpoint of a run has a bit flipped in optimizer.pt
(same size; torch.load still reads it); the restart detects it by the checkpoint's manifest, resumes from
the next older one, retrains the step into a fresh directory, and Ray Train's registry lists only
checkpoints that exist; a torn Ray Train snapshot is set aside. Both start from one killed run (a module
fixture), each from a copy of it put back at its own path."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.faults import KillWorkerAfterStep
from tests.trainer.job.test_checkpoint_check import flip_a_bit
from tests.trainer.test_ray_job import N_ROWS, RESUME_ATOL, SAVE_STEPS, job_flags, records
from trainer import vision_train
from trainer.job.runs import checkpoint_problem, registered_checkpoints
from trainer.job.storage import Storage

pytestmark = pytest.mark.slow

STEPS = 6
KILL_AFTER = 5  # after the checkpoints of steps 2 and 4
RUN = "fallback"


def train_losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records((run / "metrics.jsonl").read_text()) if r["kind"] == "train"}


@pytest.fixture(scope="module")
def killed_run(ray_cluster, tiny_model, cache_dir, tmp_path_factory) -> dict:
    """One killed first attempt, shared by the tests of this module: rank 1 dies after step KILL_AFTER, after the
    checkpoints of steps 2 and 4 and Ray Train's snapshot of them. Each test puts this run back as it was left
    (`fresh`) at the same path (Ray's snapshot names its checkpoints by absolute path), then breaks it its own way."""
    tmp = tmp_path_factory.mktemp("fallback")
    data = build_sample_dataset(tmp / "data", n_rows=N_ROWS, seed=0)
    root = tmp / "storage"
    flags = [*job_flags(tiny_model, data, cache_dir, str(root), STEPS, run_name=RUN), "--eval_fraction=0"]
    with pytest.raises(Exception, match="(?i)fail|error"):
        vision_train.main([*flags, "--max_failures=0"], callbacks=[KillWorkerAfterStep(KILL_AFTER)])
    run = root / "runs" / RUN
    left = tmp / "as-left"
    shutil.copytree(run, left, symlinks=True)
    return {"flags": flags, "run": run, "left": left, "first_attempt": train_losses(run)}


def fresh(killed: dict) -> Path:
    """The killed run back at its own path, as the first attempt left it."""
    run = killed["run"]
    shutil.rmtree(run)
    shutil.copytree(killed["left"], run, symlinks=True)
    return run


def test_a_broken_newest_checkpoint_falls_back_to_the_older_one(killed_run, capsys) -> None:
    run, flags, first_attempt = fresh(killed_run), killed_run["flags"], killed_run["first_attempt"]
    older, newest = (run / "checkpoints" / f"checkpoint-{s:06d}" for s in (SAVE_STEPS, 2 * SAVE_STEPS))
    assert (newest / "manifest.json").is_file()  # written by the job, last
    flip_a_bit(newest / "optimizer.pt")
    capsys.readouterr()

    summary = vision_train.main(flags)
    # The driver's first line names the checkpoint the workers load: the older one, and why not the newest.
    problem = "optimizer.pt: its sha256 differs from its manifest's (the file changed after it was saved)"
    assert capsys.readouterr().out.splitlines()[0] == (
        f"resuming {RUN} from step {SAVE_STEPS} (restart of this run: its newest intact checkpoint {older}; "
        f"{newest} ({problem}) does not load)")
    assert summary["completed"] is True and summary["global_step"] == STEPS
    assert summary["resumed_from_step"] == SAVE_STEPS and summary["resumed_from"] == str(older)
    (broken,) = summary["broken_checkpoints"]
    assert broken == {"checkpoint": str(newest), "problem": problem}
    # The broken one was moved aside; the retrained steps live in their own directories, each registered
    # checkpoint exists, and every one verifies (Ray kept save_total_limit=2 of them).
    assert (run / "broken_checkpoints" / newest.name / "optimizer.pt").is_file()
    registered = registered_checkpoints(Storage(str(run)))
    assert [step for step, _ in registered] == [2 * SAVE_STEPS, STEPS]
    for _, uri in registered:
        assert checkpoint_problem(uri, None) is None, uri
    # What summary.json says of the run: its definition, each segment's batch shape, each epoch's rows.
    assert summary["definition"]["flags"]["global_batch_size"] == 8 and summary["definition"]["data"]["identity"]
    shape = {"workers": 2, "global_batch": 8, "micro_batch": 2, "accumulation": 2}
    assert summary["batch_shapes"] == [{"from_step": 0, **shape}, {"from_step": SAVE_STEPS, **shape}]
    assert (summary["train_rows"], summary["rows_per_epoch"], summary["rows_left_out_per_epoch"]) == (N_ROWS, 8, 2)
    losses = train_losses(run)
    assert sorted(losses) == list(range(1, STEPS + 1))  # every step once
    for step in range(SAVE_STEPS + 1, KILL_AFTER):  # retrained from step 2: the same losses as the first attempt
        assert losses[step] == pytest.approx(first_attempt[step], abs=RESUME_ATOL), step


def test_a_torn_ray_snapshot_restarts_without_hand_repair(killed_run, capsys) -> None:
    """#27.13: a torn checkpoint_manager_snapshot.json was a JSON traceback in the driver on every restart (and
    Ray Train's own restore fails on it). The restart sets it aside and resumes the newest intact checkpoint
    directory; Ray Train's new registry lists only the checkpoints written since."""
    run = fresh(killed_run)
    newest = 2 * SAVE_STEPS
    snapshot = run / "checkpoints" / "checkpoint_manager_snapshot.json"
    snapshot.write_bytes(snapshot.read_bytes()[: snapshot.stat().st_size // 2])
    capsys.readouterr()

    summary = vision_train.main([*killed_run["flags"], "--sample_rows=0"])  # sample_rows: restart-free
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith(f"resuming {RUN} from step {newest} (restart of this run: its newest checkpoint "
                           f"{run / 'checkpoints' / f'checkpoint-{newest:06d}'}; Ray Train's "
                           "checkpoint_manager_snapshot.json is unusable (checkpoint_manager_snapshot.json: not valid "
                           "JSON"), line
    assert summary["completed"] is True and summary["global_step"] == STEPS
    assert summary["resumed_from_step"] == newest
    assert sorted(train_losses(run)) == list(range(1, STEPS + 1))  # every step once
    assert (run / "broken_checkpoints" / snapshot.name).is_file()
    registered = registered_checkpoints(Storage(str(run)))
    assert [step for step, _ in registered] == [STEPS]
    assert all(checkpoint_problem(uri, None) is None for _, uri in registered)
