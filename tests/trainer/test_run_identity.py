"""Run identity (issue #10): each run lives in <storage_path>/runs/<run_name>; a new name starts fresh on
the same storage, a restart of the same run resumes it, a finished run is never trained again (nor restarted
with another definition: refused), and
--resume_from continues another run explicitly. The driver's first line says which.

The runs share one storage root and build on each other, in file order, on the session's local Ray
cluster (2 CPU workers, the tiny Gemma 3)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.faults import KillWorkerAfterStep
from tests.trainer.test_ray_job import FAULT_AT_STEP, N_ROWS, RESUME_ATOL, SAVE_STEPS, job_flags, records
from trainer import vision_train
from trainer.job.arguments import parse_args
from trainer.job.flags import UsageError
from trainer.job.runs import plan_run
from trainer.job.storage import storage_for

pytestmark = pytest.mark.slow

FIRST_STEPS = 2  # the first run ends at its step-2 checkpoint
LONGER_STEPS = 4
UTC_NAME = re.compile(r"run-\d{8}-\d{6}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_sample_dataset(tmp_path_factory.mktemp("data"), n_rows=N_ROWS, seed=0)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The release's storage root, and what the tests below learn about its runs."""
    return {"root": tmp_path_factory.mktemp("release") / "storage"}


def flags(tiny_model: Path, data: Path, cache_dir: Path, root: Path, max_steps: int, run_name: str | None,
          *extra: str) -> list[str]:
    argv = [*job_flags(tiny_model, data, cache_dir, str(root), max_steps, run_name or ""), *extra]
    return [a for a in argv if a != "--run_name="]  # no --run_name at all: the trainer names the run


def train_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in records((run_dir / "metrics.jsonl").read_text()) if r["kind"] == "train"]


def first_line(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.splitlines()[0]


def test_a_run_without_a_name_is_named_from_the_utc_time(ray_cluster, tiny_model, data, cache_dir, release,
                                                         capsys) -> None:
    summary = vision_train.main(flags(tiny_model, data, cache_dir, release["root"], FIRST_STEPS, None))
    line = first_line(capsys)
    match = re.fullmatch(r"fresh run (\S+) \(no --run_name given: named from the UTC time\)", line)
    assert match and UTC_NAME.fullmatch(match.group(1)), line
    name = match.group(1)
    run_dir = release["root"] / "runs" / name
    assert summary["run_name"] == name and summary["completed"] is True
    assert json.loads((run_dir / "summary.json").read_text())["global_step"] == FIRST_STEPS
    assert train_steps(run_dir) == [1, 2] and summary["resumed_from_step"] is None
    release["first"] = name


def test_b_a_finished_run_is_not_trained_again(ray_cluster, tiny_model, data, cache_dir, release, capsys) -> None:
    """The same run again trains nothing (exit 0). With a larger max_steps (the issue's 30 -> 34 case) it is
    refused like an unfinished run, naming the change (#27.11: it printed `nothing to train` and exited 0)."""
    name = release["first"]
    run_dir = release["root"] / "runs" / name
    before = (run_dir / "metrics.jsonl").read_text()
    summary = vision_train.main(flags(tiny_model, data, cache_dir, release["root"], FIRST_STEPS, name))
    assert first_line(capsys) == f"run {name} already finished at step {FIRST_STEPS}; nothing to train"
    assert summary["global_step"] == FIRST_STEPS
    with pytest.raises(SystemExit) as stop:
        vision_train.main(flags(tiny_model, data, cache_dir, release["root"], LONGER_STEPS, name))
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: run {name} was started with other settings (max_steps "
                                              f"{FIRST_STEPS} → {LONGER_STEPS}): start a new run with --run_name=")
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_c_a_new_run_name_starts_fresh_on_the_same_storage(ray_cluster, tiny_model, data, cache_dir, release,
                                                           capsys) -> None:
    """Before run identity, this run resumed the first run's step-2 checkpoint. Here it starts at step 1;
    its rank 1 is killed after step 3 and no restart is allowed, so it fails after its step-2 checkpoint."""
    argv = flags(tiny_model, data, cache_dir, release["root"], LONGER_STEPS, "second", "--max_failures=0")
    with pytest.raises(Exception, match="(?i)fail|error"):
        vision_train.main(argv, callbacks=[KillWorkerAfterStep(FAULT_AT_STEP)])
    assert first_line(capsys) == "fresh run second"
    run_dir = release["root"] / "runs" / "second"
    assert train_steps(run_dir)[: FAULT_AT_STEP - 1] == [1, 2] and max(train_steps(run_dir)) <= FAULT_AT_STEP
    assert not (run_dir / "summary.json").exists()
    assert (run_dir / "checkpoints" / f"checkpoint-{SAVE_STEPS:06d}").is_dir()


def test_d_a_restart_of_the_same_run_resumes_it(ray_cluster, tiny_model, data, cache_dir, release, capsys) -> None:
    """The job again with the same run name (a KubeRay retry): it resumes from the run's step-2 checkpoint."""
    run_dir = release["root"] / "runs" / "second"
    summary = vision_train.main(flags(tiny_model, data, cache_dir, release["root"], LONGER_STEPS, "second"))
    checkpoint = run_dir / "checkpoints" / f"checkpoint-{SAVE_STEPS:06d}"
    assert first_line(capsys) == (f"resuming second from step {SAVE_STEPS} (restart of this run: its newest "
                                  f"checkpoint {checkpoint})")
    assert summary["resumed_from_step"] == SAVE_STEPS and summary["global_step"] == LONGER_STEPS
    assert train_steps(run_dir) == [1, 2, 3, 4]  # each step once


def test_e_resume_from_continues_another_run(ray_cluster, tiny_model, data, cache_dir, release, capsys) -> None:
    """A third run continues the first (finished at step 2) explicitly. The first and second runs trained
    the same steps 1-2, so the third's steps 3-4 must reproduce the second's: the weights, optimizer and
    data position came from the first run's checkpoint."""
    first = release["first"]
    root: Path = release["root"]
    first_summary = (root / "runs" / first / "summary.json").read_text()
    summary = vision_train.main(flags(tiny_model, data, cache_dir, root, LONGER_STEPS, "third", f"--resume_from={first}"))
    checkpoint = root / "runs" / first / "checkpoints" / f"checkpoint-{FIRST_STEPS:06d}"
    assert first_line(capsys) == (f"resuming third from step {FIRST_STEPS} (--resume_from={first}: checkpoint "
                                  f"{checkpoint}; with new settings: max_steps {FIRST_STEPS} → {LONGER_STEPS})")
    assert summary["resumed_from_step"] == FIRST_STEPS and summary["global_step"] == LONGER_STEPS
    third = records((root / "runs" / "third" / "metrics.jsonl").read_text())
    second = {r["step"]: r["loss"] for r in records((root / "runs" / "second" / "metrics.jsonl").read_text())
              if r["kind"] == "train"}
    assert [r["step"] for r in third if r["kind"] == "train"] == [3, 4]
    for r in (r for r in third if r["kind"] == "train"):
        assert r["loss"] == pytest.approx(second[r["step"]], abs=RESUME_ATOL), r["step"]
    assert (root / "runs" / first / "summary.json").read_text() == first_summary  # the first run is untouched


def test_f_resume_from_a_checkpoint_path_or_a_missing_run(tiny_model, data, cache_dir, release) -> None:
    """Decided on the driver before anything starts: a checkpoint path is taken as it is; an unknown run
    name fails with the runs that exist."""
    first = release["first"]
    root: Path = release["root"]
    checkpoint = root / "runs" / first / "checkpoints" / f"checkpoint-{FIRST_STEPS:06d}"
    args = parse_args(flags(tiny_model, data, cache_dir, root, LONGER_STEPS, "fourth",
                               f"--resume_from={checkpoint}"))
    plan = plan_run(args, storage_for(args))
    assert plan.resume_checkpoint == str(checkpoint) and plan.finished is None
    assert plan.log_line == (f"resuming fourth from step {FIRST_STEPS} (--resume_from={checkpoint}: checkpoint "
                             f"{checkpoint}; with new settings: max_steps {FIRST_STEPS} → {LONGER_STEPS})")
    args = parse_args(flags(tiny_model, data, cache_dir, root, LONGER_STEPS, "fifth", "--resume_from=nope"))
    with pytest.raises(UsageError, match=r"resume_from=nope: no checkpoint of that run .*runs there: \[.*'second'"):
        plan_run(args, storage_for(args))
