"""The driver's resume line names the checkpoint the workers will load (issue #13): a checkpoint with a
file cut short (a torch.save zip, a safetensors file, a JSON) is passed over for the next older one and
said; when none is intact the job stops before anything starts. No Ray: the driver's plan only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import runs
import torch
from flags import UsageError, parse_args
from runs import checkpoint_problem, plan_run
from safetensors.torch import save_file
from storage import storage_for

CPU = ["--use_gpu=false", "--quantization=none"]
STEPS = (2, 4)


def write_checkpoint(directory: Path, step: int) -> Path:
    directory.mkdir(parents=True)
    (directory / runs.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    torch.save({"state": {0: {"exp_avg": torch.ones(256)}}}, directory / "optimizer.pt")
    save_file({"lora_A": torch.ones(16, 32)}, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({"r": 16}))
    return directory


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, dict[int, Path]]:
    """A run with two checkpoints Ray Train registered (its snapshot), both intact."""
    checkpoints = tmp_path / runs.RUNS_DIR / "r1" / runs.CHECKPOINTS_DIR
    dirs = {s: write_checkpoint(checkpoints / f"checkpoint-{s:06d}", s) for s in STEPS}
    results = [{"checkpoint_dir_name": d.name} for d in dirs.values()]
    snapshot = {"checkpoint_results": results, "latest_checkpoint_result": results[-1]}
    (checkpoints / runs.RAY_CHECKPOINT_SNAPSHOT).write_text(json.dumps(snapshot))
    return tmp_path, dirs


def plan(root: Path, *extra: str):
    args = parse_args([*CPU, f"--storage_path={root}", "--run_name=r1", *extra])
    return plan_run(args, storage_for(args))


def test_an_intact_newest_checkpoint_is_named(run) -> None:
    root, dirs = run
    assert checkpoint_problem(str(dirs[4]), None) is None
    assert plan(root).log_line == f"resuming r1 from step 4 (restart of this run: its newest checkpoint {dirs[4]})"


@pytest.mark.parametrize(("name", "problem"), [
    ("optimizer.pt", "optimizer.pt: BadZipFile: File is not a zip file"),
    ("adapter_model.safetensors", "adapter_model.safetensors: "),
    (runs.TRAINER_STATE_FILE, f"{runs.TRAINER_STATE_FILE}: JSONDecodeError: "),
])
def test_a_newest_checkpoint_with_a_file_cut_short_is_passed_over_and_said(run, name: str, problem: str) -> None:
    root, dirs = run
    cut_short(dirs[4] / name)
    assert (checkpoint_problem(str(dirs[4]), None) or "").startswith(problem)
    line = plan(root).log_line
    assert line.startswith(f"resuming r1 from step 2 (restart of this run: its newest intact checkpoint {dirs[2]}; "
                           f"{dirs[4]} ({problem}"), line
    assert line.endswith(") does not load)")


def test_no_intact_checkpoint_stops_before_anything_starts(run) -> None:
    root, dirs = run
    for d in dirs.values():
        cut_short(d / "optimizer.pt")
    with pytest.raises(UsageError, match=rf"no checkpoint of run r1 loads: {dirs[4]} \(optimizer.pt: .*; {dirs[2]} "
                                         r"\(optimizer.pt: .*--resume_from=<checkpoint path> in a new run"):
        plan(root)


def test_resume_from_a_broken_checkpoint_path_is_refused(run) -> None:
    root, dirs = run
    cut_short(dirs[4] / "adapter_model.safetensors")
    with pytest.raises(UsageError, match=rf"resume_from: checkpoint {dirs[4]} does not load \(adapter_model"):
        plan(root, "--run_name=r2", f"--resume_from={dirs[4]}")
    assert plan(root, "--run_name=r2", f"--resume_from={dirs[2]}").resume_checkpoint == str(dirs[2])
