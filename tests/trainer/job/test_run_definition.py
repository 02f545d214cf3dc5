"""A run is what its data and flags say (#21): the driver records the run's definition at its start; a
restart with the same definition resumes (flags in RESTART_FREE may change), another one is refused naming
what changed and the two ways on; --resume_from in a new run continues with the new settings, said in its
first line. No Ray: the driver's plan, on a run with a registered checkpoint."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from localkit.sample_data import build_sample_dataset
from tests.trainer.conftest import GCS_BUCKET
from tests.trainer.job.test_checkpoint_check import register, write_checkpoint
from trainer.job import run_definition, runs
from trainer.job.arguments import parse_args
from trainer.job.flags import RESTART_FREE, TrainArguments, UsageError
from trainer.job.runs import plan_run
from trainer.job.storage import Storage, storage_for
from trainer.worker.resume import current_flags_callback

CPU = ["--use_gpu=false", "--quantization=none"]
FIRST = ["--global_batch_size=8", "--learning_rate=5e-3", "--max_steps=4"]


def plan(root: Path, data: Path, *extra: str):
    args = parse_args([*CPU, f"--storage_path={root}", f"--dataset_name={data}", "--run_name=r", *FIRST, *extra])
    return plan_run(args, storage_for(args))


@pytest.fixture
def crashed(tmp_path: Path) -> tuple[Path, Path]:
    """Run r started on 24 rows (its definition recorded, as the driver does) and crashed after its step-4
    checkpoint, registered by Ray Train."""
    data = build_sample_dataset(tmp_path / "data", n_rows=24, seed=0)
    root = tmp_path / "storage"
    first = plan(root, data)
    assert first.log_line == "fresh run r"
    run_definition.write(first.storage, first.definition)
    checkpoints = root / runs.RUNS_DIR / "r" / runs.CHECKPOINTS_DIR
    write_checkpoint(checkpoints / "checkpoint-000004", 4)
    register(checkpoints, ["checkpoint-000004"])
    return root, data


def test_the_same_definition_resumes_and_free_flags_may_change(crashed) -> None:
    root, data = crashed
    again = plan(root, data, "--logging_steps=1", "--eval_steps=3", "--save_steps=7", "--num_workers=2",
                 "--per_device_train_batch_size=2", "--max_failures=9", "--sample_rows=0")
    assert again.log_line.startswith("resuming r from step 4 (restart of this run: its newest checkpoint ")
    assert again.definition == run_definition.read(again.storage)


def test_other_data_batch_and_learning_rate_are_refused_naming_them(crashed) -> None:
    """The issue's case: 48 rows instead of 24, global batch 16 instead of 8, learning rate 1e-3 instead of
    5e-3 printed `resuming r from step 4` before #21 and trained a run that was neither."""
    root, data = crashed
    old_identity = run_definition.read(Storage(str(root / "runs" / "r")))["data"]["identity"]
    build_sample_dataset(data.parent, n_rows=48, seed=0)  # the same file, rewritten
    new_identity = run_definition.identity(run_definition.data_files(str(data)), str(data))
    with pytest.raises(UsageError) as err:
        plan(root, data, "--global_batch_size=16", "--learning_rate=1e-3")
    assert str(err.value) == (
        f"run r was started with other settings (global_batch_size 8 → 16; learning_rate 0.005 → 0.001; data "
        f"{old_identity} → {new_identity} (products.parquet changed)): start a new run with --run_name=<new name>, "
        "or continue this run's checkpoint with the new settings with --run_name=<new name> --resume_from=r")


def test_resume_from_continues_with_the_new_settings_and_says_so(crashed) -> None:
    root, data = crashed
    checkpoint = root / "runs" / "r" / "checkpoints" / "checkpoint-000004"
    cont = plan(root, data, "--run_name=r2", "--resume_from=r", "--learning_rate=1e-3")
    assert cont.resume_checkpoint == str(checkpoint)
    assert cont.log_line == (f"resuming r2 from step 4 (--resume_from=r: checkpoint {checkpoint}; with new settings: "
                             "learning_rate 0.005 → 0.001)")
    assert cont.definition["flags"]["learning_rate"] == 1e-3
    assert cont.definition["continued_from"] == {"checkpoint": str(checkpoint), "step": 4,
                                                 "changes": ["learning_rate 0.005 → 0.001"]}


def test_a_run_without_a_checkpoint_starts_again_with_new_settings(tmp_path: Path) -> None:
    data = build_sample_dataset(tmp_path / "data", n_rows=12, seed=0)
    first = plan(tmp_path / "storage", data)
    run_definition.write(first.storage, first.definition)
    again = plan(tmp_path / "storage", data, "--learning_rate=1e-3")
    assert again.log_line == ("fresh run r (its earlier attempt left no checkpoint; started again with new "
                              "settings: learning_rate 0.005 → 0.001)")


def test_restart_free_names_real_flags_and_everything_else_defines_the_run(tmp_path: Path) -> None:
    names = {f.name for f in dataclasses.fields(TrainArguments)}
    assert set(RESTART_FREE) <= names and len(set(RESTART_FREE)) == len(RESTART_FREE)
    args = parse_args([*CPU, f"--dataset_name={tmp_path}"])
    assert set(run_definition.definition(args)["flags"]) == names - set(RESTART_FREE)


def test_gcs_data_is_identified_by_its_objects_generations(fake_gcs) -> None:
    """Rewritten with the same bytes, a gs:// object has a new generation, so the data is another."""
    import pyarrow as pa

    prefix = f"gs://{GCS_BUCKET}/definition-data"
    storage = Storage(prefix, fake_gcs)
    table = pa.table({"x": [1, 2, 3]})
    fs, base = storage.fs()
    pq.write_table(table, f"{base}/train.parquet", filesystem=fs)
    first = run_definition.data_files(prefix, fake_gcs)
    assert list(first) == ["train.parquet"] and first["train.parquet"].startswith("generation:")
    assert run_definition.data_files(prefix, fake_gcs) == first
    pq.write_table(table, f"{base}/train.parquet", filesystem=fs)
    assert run_definition.data_files(prefix, fake_gcs) != first


def test_the_job_flags_win_over_the_checkpoint_state() -> None:
    """A continuation with another learning rate trains with it: the Trainer restores the optimizer's and
    the constant schedule's learning rate from the checkpoint (the old 0.005 kept before #21)."""
    from transformers import TrainerState, TrainingArguments
    from transformers.optimization import get_constant_schedule

    weight = torch.nn.Parameter(torch.zeros(2))
    saved = torch.optim.AdamW([weight], lr=5e-3)
    saved_schedule = get_constant_schedule(saved)
    optimizer = torch.optim.AdamW([weight], lr=1e-3)
    schedule = get_constant_schedule(optimizer)
    optimizer.load_state_dict(saved.state_dict())  # as Trainer._load_optimizer_and_scheduler does
    schedule.load_state_dict(saved_schedule.state_dict())
    assert optimizer.param_groups[0]["lr"] == 5e-3
    args = TrainingArguments(output_dir="unused", learning_rate=1e-3, logging_steps=1, save_steps=3, use_cpu=True)
    state = TrainerState(logging_steps=5, save_steps=100, max_steps=10)  # the checkpoint's cadence
    current_flags_callback().on_train_begin(args, state, None, optimizer=optimizer, lr_scheduler=schedule)
    optimizer.step()
    schedule.step()
    assert optimizer.param_groups[0]["lr"] == 1e-3
    assert (state.logging_steps, state.save_steps) == (1, 3)


def finish(root: Path) -> None:
    """Run r completed at step 4 (its summary.json, as the workers write it at the end)."""
    (root / runs.RUNS_DIR / "r" / runs.SUMMARY_FILE).write_text(json.dumps({"run_name": "r", "completed": True,
                                                                           "global_step": 4}))


@pytest.mark.parametrize("change", [["--learning_rate=1e-3"], ["--max_steps=8"], ["data"]])
def test_a_finished_run_restarted_with_another_definition_is_refused_too(crashed, change: list[str]) -> None:
    """#27.11: it printed `run r already finished at step 4; nothing to train` and exited 0, so a pipeline that
    reused the run name after changing the data or flags saw success."""
    root, data = crashed
    finish(root)
    if change == ["data"]:
        build_sample_dataset(data.parent, n_rows=30, seed=1)
        change = []
    with pytest.raises(UsageError, match=r"^run r was started with other settings \((learning_rate 0\.005 → 0\.001|"
                                         r"max_steps 4 → 8|data data:\w+ → data:\w+ \(products\.parquet changed\))\): "
                                         r"start a new run with --run_name=<new name>, or continue this run's "
                                         r"checkpoint with the new settings with --run_name=<new name> "
                                         r"--resume_from=r$"):
        plan(root, data, *change)


def test_a_finished_run_restarted_with_its_definition_stays_a_success_without_training(crashed) -> None:
    root, data = crashed
    finish(root)
    for again in (plan(root, data), plan(root, data, "--num_workers=2", "--logging_steps=1", "--sample_rows=0")):
        assert again.finished is not None and again.log_line == "run r already finished at step 4; nothing to train"


def test_a_finished_run_without_checkpoints_names_only_a_new_run(tmp_path: Path) -> None:
    data = build_sample_dataset(tmp_path / "data", n_rows=12, seed=0)
    first = plan(tmp_path / "storage", data, "--save_strategy=no")
    run_definition.write(first.storage, first.definition)
    finish(tmp_path / "storage")
    with pytest.raises(UsageError, match=r"^run r was started with other settings \(learning_rate 0\.005 → 0\.001\): "
                                         r"start a new run with --run_name=<new name>$"):
        plan(tmp_path / "storage", data, "--save_strategy=no", "--learning_rate=1e-3")


@pytest.mark.parametrize(("old", "new", "shown"), [
    ("/mnt/shared/models/gemma-3-4b-it/finetuned/products-2026-11-30-v1",
     "/mnt/shared/models/gemma-3-4b-it/finetuned/products-2026-11-30-v2",
     'model_id "…cts-2026-11-30-v1" → "…cts-2026-11-30-v2"'),
    ("gs://team-bucket/models/gemma-3-4b-it/run-1/merged/with/a/long/common/tail",
     "gs://team-bucket/models/gemma-3-4b-it/run-22/merged/with/a/long/common/tail",
     'model_id "…mma-3-4b-it/run-1/merged/with/a/l…" → "…mma-3-4b-it/run-22/merged/with/a/l…"'),
    ("google/gemma-3-4b-it", "google/gemma-3-12b-it", 'model_id "google/gemma-3-4b-it" → "google/gemma-3-12b-it"'),
])
def test_long_values_show_the_part_where_they_differ(old: str, new: str, shown: str) -> None:
    """#27.13: values were cut to their first 40 characters, so two long paths that differ at the end read the
    same in the refusal."""
    assert run_definition.changes({"flags": {"model_id": old}}, {"flags": {"model_id": new}}) == [shown]
