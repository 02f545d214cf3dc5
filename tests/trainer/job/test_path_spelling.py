"""A path spelled two ways is the same run (#27.13): a trailing `/` on --model_id or --dataset_name, `./data` vs
`data`, `gs://b/x/` vs `gs://b/x`, made a restart "another run" and was refused. parse_args gives every path
flag one spelling (flags.PATH_FLAGS), so the run definition, the data's identity and the scan key see one.
No Ray: the parser and the driver's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.job.test_checkpoint_check import register, write_checkpoint
from trainer.job import run_definition, runs
from trainer.job.arguments import parse_args
from trainer.job.runs import plan_run
from trainer.job.storage import storage_for

CPU = ["--use_gpu=false", "--quantization=none", "--global_batch_size=8", "--max_steps=4", "--run_name=r"]


def test_every_path_flag_has_one_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "r").mkdir()  # a directory named like a run: --resume_from=r still names the run
    for spelled in ("data", "./data", "data/", "./data/", f"{tmp_path}/data/", f"{tmp_path}//data", f"{tmp_path}/x/../data"):
        assert parse_args([*CPU, f"--dataset_name={spelled}"]).dataset_name == str(tmp_path / "data"), spelled
    for spelled in ("gs://b/models/gemma/", "gs://b/models/gemma", "gs://b//models/gemma", "gs://b/models/./gemma/"):
        assert parse_args([*CPU, f"--model_id={spelled}"]).model_id == "gs://b/models/gemma", spelled
    for spelled in ("google/gemma-3-4b-it/", "google/gemma-3-4b-it"):  # a hub id: never a local path
        assert parse_args([*CPU, f"--model_id={spelled}"]).model_id == "google/gemma-3-4b-it", spelled
    args = parse_args([*CPU, "--storage_path=./storage/", "--cache_dir=cache/", "--resume_from=./r/checkpoints/c-1/"])
    assert (args.storage_path, args.cache_dir, args.resume_from) == (
        str(tmp_path / "storage"), str(tmp_path / "cache"), str(tmp_path / "r" / "checkpoints" / "c-1"))
    assert parse_args([*CPU, "--run_name=r2", "--resume_from=r"]).resume_from == "r"
    assert parse_args([*CPU, "--storage_path=gs://bucket/prefix/"]).storage_path == "gs://bucket/prefix"


@pytest.mark.parametrize(("first", "again"), [
    (["--dataset_name=data", "--model_id=gs://b/models/gemma/"], ["--dataset_name=./data/", "--model_id=gs://b/models/gemma"]),
    (["--dataset_name=./data"], ["--dataset_name={root}/data/"]),
    (["--dataset_name=data/", "--model_id=google/gemma-3-4b-it"], ["--dataset_name=data", "--model_id=google/gemma-3-4b-it/"]),
])
def test_a_path_spelled_another_way_is_the_same_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    first: list[str], again: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    build_sample_dataset(tmp_path / "data", n_rows=12, seed=0)

    def plan(flags: list[str]):
        args = parse_args([*CPU, f"--storage_path={tmp_path / 'storage'}", *[f.format(root=tmp_path) for f in flags]])
        return plan_run(args, storage_for(args))

    started = plan(first)
    run_definition.write(started.storage, started.definition)
    checkpoints = tmp_path / "storage" / runs.RUNS_DIR / "r" / runs.CHECKPOINTS_DIR
    write_checkpoint(checkpoints / "checkpoint-000004", 4)
    register(checkpoints, ["checkpoint-000004"])
    restarted = plan(again)
    assert restarted.log_line.startswith("resuming r from step 4 (restart of this run: its newest checkpoint ")
    assert restarted.definition == started.definition
