"""Every file the trainer reads back is checked as a whole before use (#27.10): a summary.json, run definition,
batch_shapes.json or Ray snapshot that is torn, or parses but is not what the trainer wrote, is said in one
sentence and passed over (the run restarts without hand repair), never a KeyError or JSON traceback on every
retry. No Ray: the driver's plan and the workers' read-back functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.job.test_checkpoint_check import register, write_checkpoint
from trainer.job import run_definition, runs, startup_timing
from trainer.job.arguments import parse_args
from trainer.job.runs import plan_run
from trainer.job.storage import Storage, storage_for

CPU = ["--use_gpu=false", "--quantization=none", "--global_batch_size=8", "--max_steps=4"]
TORN = {"cut short": lambda raw: raw[: len(raw) // 2], "a list": lambda raw: b"[1, 2]",
        "not UTF-8": lambda raw: b"\xff\xfe" + raw}


def plan(root: Path, data: Path, *extra: str):
    args = parse_args([*CPU, f"--storage_path={root}", f"--dataset_name={data}", "--run_name=r", *extra])
    return plan_run(args, storage_for(args))


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Run r (its definition recorded) with a step-4 checkpoint Ray Train registered: (root, data, run dir)."""
    data = build_sample_dataset(tmp_path / "data", n_rows=12, seed=0)
    root = tmp_path / "storage"
    first = plan(root, data)
    run_definition.write(first.storage, first.definition)
    checkpoints = root / runs.RUNS_DIR / "r" / runs.CHECKPOINTS_DIR
    write_checkpoint(checkpoints / "checkpoint-000004", 4)
    register(checkpoints, ["checkpoint-000004"])
    return root, data, root / runs.RUNS_DIR / "r"


def finish(run: Path, summary: dict) -> None:
    (run / runs.SUMMARY_FILE).write_text(json.dumps(summary))


@pytest.mark.parametrize("damage", TORN)
def test_a_torn_summary_is_not_taken_as_finished_and_the_run_resumes(crashed, damage: str) -> None:
    root, data, run = crashed
    finish(run, {"run_name": "r", "completed": True, "global_step": 4})
    (run / runs.SUMMARY_FILE).write_bytes(TORN[damage]((run / runs.SUMMARY_FILE).read_bytes()))
    again = plan(root, data)
    assert again.finished is None
    assert again.log_line.startswith("resuming r from step 4 (restart of this run: its newest checkpoint "), again.log_line
    assert "; its summary.json is unusable (summary.json: " in again.log_line
    assert again.log_line.endswith("): not taken as finished)")


@pytest.mark.parametrize("summary", [{"completed": "yes", "global_step": 4}, {"completed": True, "global_step": "4"},
                                     {"completed": True}])
def test_a_summary_with_wrong_entries_is_not_taken_as_finished(crashed, summary: dict) -> None:
    root, data, run = crashed
    finish(run, summary)
    again = plan(root, data)
    assert again.finished is None and "its summary.json is unusable (summary.json: " in again.log_line


@pytest.mark.parametrize("definition", [b'{"format": 1, "flags": [], "data": {}}', b'{"format": 1, "fla',
                                        b'{"format": 1, "flags": {}, "data": {"identity": 7, "files": {}}}', b"[]"])
def test_an_unusable_run_definition_is_said_and_recorded_again(crashed, definition: bytes) -> None:
    """Before: `'list' object has no attribute 'get'` on every restart, or a silent 'no definition'."""
    root, data, run = crashed
    (run / run_definition.DEFINITION_FILE).write_bytes(definition)
    again = plan(root, data)
    assert again.log_line.startswith("resuming r from step 4 (restart of this run: its newest checkpoint "), again.log_line
    assert f"; its {run_definition.DEFINITION_FILE} is unusable ({run_definition.DEFINITION_FILE}: " in again.log_line
    assert again.log_line.endswith("): recorded again from this job's settings)")
    assert again.definition == run_definition.definition(parse_args([*CPU, f"--storage_path={root}",
                                                                      f"--dataset_name={data}", "--run_name=r"]))


@pytest.mark.parametrize("damage", TORN)
def test_a_torn_batch_shapes_file_is_started_again(tmp_path: Path, damage: str, capsys) -> None:
    from trainer.job.elastic import BatchShape
    from trainer.worker.worker import BATCH_SHAPES_FILE, record_segment

    storage = Storage(str(tmp_path))
    shape = BatchShape(8, 2, 2)
    record_segment(storage, 0, 2, shape)
    (tmp_path / BATCH_SHAPES_FILE).write_bytes(TORN[damage]((tmp_path / BATCH_SHAPES_FILE).read_bytes()))
    assert record_segment(storage, 2, 2, shape) == [{"from_step": 2, "workers": 2, "global_batch": 8,
                                                     "micro_batch": 2, "accumulation": 2}]
    assert f"[batch] {BATCH_SHAPES_FILE} is unusable ({BATCH_SHAPES_FILE}: " in capsys.readouterr().out


def test_the_startup_split_of_a_torn_summary_is_one_sentence(tmp_path: Path, capsys) -> None:
    path = tmp_path / "summary.json"
    path.write_text('{"startup": {"driver_')
    assert startup_timing.main([str(path)]) == 2
    assert capsys.readouterr().err.startswith(f"{path}: summary.json: not valid JSON")


@pytest.mark.parametrize("manifest", ["as saved", "rewritten to match"])
def test_a_torn_trainer_state_in_a_resume_from_directory_is_one_sentence(crashed, manifest: str) -> None:
    """#27.13: a JSON traceback, and the run could not restart without hand repair. Torn after the save (its
    manifest disagrees) or before (the manifest lists the torn bytes): either way the checkpoint does not load."""
    from trainer.job import checkpoint_manifest
    from trainer.job.flags import UsageError

    root, data, run = crashed
    directory = run / runs.CHECKPOINTS_DIR / "checkpoint-000004"
    state = directory / runs.TRAINER_STATE_FILE
    state.write_bytes(state.read_bytes()[:9])
    if manifest == "rewritten to match":
        (directory / checkpoint_manifest.MANIFEST_FILE).unlink()
        (directory / checkpoint_manifest.MANIFEST_FILE).write_bytes(
            checkpoint_manifest.manifest([checkpoint_manifest.entries(directory)], 4))
        problem = f"{runs.TRAINER_STATE_FILE}: not valid JSON (torn or overwritten: "
    else:
        problem = f"{runs.TRAINER_STATE_FILE}: 9 bytes, its manifest says "
    with pytest.raises(UsageError) as err:
        plan(root, data, "--run_name=r2", f"--resume_from={directory}")
    assert str(err.value).startswith(f"resume_from: checkpoint {directory} does not load ({problem}"), err.value
    assert str(err.value).endswith("); name an intact one")


def tear(snapshot: Path, damage: str) -> None:
    raw = snapshot.read_bytes()
    if damage == "cut short":
        snapshot.write_bytes(raw[: len(raw) // 2])
    else:  # JSON, but Ray's own load would fail: a result without its directory name
        value = json.loads(raw)
        del value["checkpoint_results"][0]["checkpoint_dir_name"]
        snapshot.write_text(json.dumps(value))


@pytest.mark.parametrize("damage", ["cut short", "a result without its name"])
def test_a_torn_ray_snapshot_falls_back_to_the_checkpoints_listed_and_is_set_aside(crashed, damage: str) -> None:
    """#27.13: a JSON traceback in the driver on every restart (and Ray's own restore fails on it too). The
    driver lists the run's checkpoint directories instead, resumes the newest intact one, and sets the snapshot
    aside so that Ray Train starts a new registry."""
    root, data, run = crashed
    checkpoints = run / runs.CHECKPOINTS_DIR
    write_checkpoint(checkpoints / "checkpoint-000002", 2)
    write_checkpoint(checkpoints / "checkpoint-000006", 6)
    (checkpoints / "checkpoint-000006" / "optimizer.pt").unlink()  # broken: passed over
    snapshot = checkpoints / runs.RAY_CHECKPOINT_SNAPSHOT
    tear(snapshot, damage)
    again = plan(root, data)
    newest = checkpoints / "checkpoint-000004"
    assert again.resume_checkpoint == str(newest)
    assert again.log_line.startswith(
        f"resuming r from step 4 (restart of this run: its newest intact checkpoint {newest}; "
        f"{checkpoints / 'checkpoint-000006'} (optimizer.pt: missing (its manifest lists it)) does not load; Ray "
        f"Train's {runs.RAY_CHECKPOINT_SNAPSHOT} is unusable ({runs.RAY_CHECKPOINT_SNAPSHOT}: "), again.log_line
    assert again.log_line.endswith("): set aside, the run's checkpoint directories listed instead)")
    runs.set_aside(again.storage, again)  # the driver, before Ray Train restores the run
    assert not snapshot.exists() and (run / runs.BROKEN_DIR / runs.RAY_CHECKPOINT_SNAPSHOT).is_file()
    assert not (checkpoints / "checkpoint-000006").exists()
    assert runs.registered_checkpoints(again.storage) == []  # Ray Train starts a new registry


def test_a_torn_ray_snapshot_without_any_checkpoint_directory_is_set_aside_too(crashed) -> None:
    """Nothing to resume: the run starts fresh, and Ray Train must not restore (and fail on) the torn snapshot."""
    import shutil

    root, data, run = crashed
    shutil.rmtree(run / runs.CHECKPOINTS_DIR / "checkpoint-000004")
    snapshot = run / runs.CHECKPOINTS_DIR / runs.RAY_CHECKPOINT_SNAPSHOT
    tear(snapshot, "cut short")
    again = plan(root, data)
    assert again.log_line.startswith(f"fresh run r (Ray Train's {runs.RAY_CHECKPOINT_SNAPSHOT} is unusable (")
    runs.set_aside(again.storage, again)
    assert not snapshot.exists() and (run / runs.BROKEN_DIR / runs.RAY_CHECKPOINT_SNAPSHOT).is_file()
