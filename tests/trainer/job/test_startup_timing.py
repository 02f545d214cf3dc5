"""trainer/job/startup_timing.py: the job-start split (submission -> first optimizer step), light on the driver."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainer.job import startup_timing as st

ROOT = Path(__file__).resolve().parents[3]  # holds the trainer package
IMPORT = "from trainer.job import startup_timing as s"

BLOCKED = ("ray", "torch", "transformers", "trl", "peft", "datasets", "PIL")


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    blocker = f"import sys\nfor m in {BLOCKED!r}: sys.modules[m] = None\n"
    return subprocess.run([sys.executable, "-c", blocker + code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_imports_and_driver_marks_need_only_the_standard_library() -> None:
    env = {k: "" for k in (st.SUBMITTED_AT_ENV, st.RAY_JOB_CONFIG_ENV)}
    out = run_python(f"import json; {IMPORT}; print(json.dumps(s.driver_marks()))", env)
    assert out.returncode == 0, out.stderr
    marks = json.loads(out.stdout)
    assert marks["submitted"] is None and marks["source"] == "not submitted through the Ray Jobs API"


def test_process_start_time_is_when_the_process_started() -> None:
    before = time.time()
    out = run_python(f"import time; time.sleep(1.0); {IMPORT}; print(repr(s.process_start_time()))")
    after = time.time()
    started = float(out.stdout)
    # Started before the 1 s sleep, so it is not the import time; within the clock tick (10 ms) of the spawn.
    assert before - 0.05 <= started <= after - 1.0, (before, started, after)


def test_submission_time_from_the_environment_and_unreadable_records(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(st.SUBMITTED_AT_ENV, "1796000000.5")
    assert st.submitted_at() == (1796000000.5, st.SUBMITTED_AT_ENV)
    monkeypatch.setenv(st.SUBMITTED_AT_ENV, "yesterday")
    assert st.submitted_at()[0] is None and "is not a Unix time" in st.submitted_at()[1]
    monkeypatch.delenv(st.SUBMITTED_AT_ENV)
    # A Jobs API job whose record cannot be read (no Ray cluster here): no time, a reason, no exception.
    out = run_python(f"{IMPORT}; print(s.submitted_at())",
                     {st.SUBMITTED_AT_ENV: "", st.RAY_JOB_CONFIG_ENV: json.dumps({"metadata": {"job_submission_id": "raysubmit_x"}})})
    assert out.returncode == 0, out.stderr
    assert "(None, " in out.stdout and "raysubmit_x" in out.stdout and "unreadable" in out.stdout


def test_split_adds_up_from_submission_to_the_first_step() -> None:
    t0 = 1_800_000_000.0
    clock = st.StartupClock({"submitted": t0, "source": "test", "driver_start": t0 + 100.0})
    clock.mark("workers_start", t0 + 130.0)
    clock.phases = {st.MODEL: 40.0, st.DATA: 25.0}
    clock.mark("train_start", t0 + 200.0)
    clock.mark("first_step_end", t0 + 212.5)
    s = clock.split()
    assert s["runtime_env_s"] == 100.0 and s["workers_s"] == 30.0
    assert s["model_load_s"] == 40.0 and s["data_s"] == 25.0
    assert s["setup_other_s"] == 70.0 - 65.0 and s["first_step_s"] == 12.5
    assert s["total_s"] == 212.5 == sum(s[k] for k, _ in st.ROWS)
    assert s["from"] == "submission"
    block = clock.block()
    assert block.splitlines()[0] == "gemma3-ray job start: 212.5 s from submission to the end of the first optimizer step"
    assert len(block.splitlines()) == 1 + len(st.ROWS)
    assert "100.0 s   47%" in block  # the runtime env's share of 212.5 s


def test_split_without_a_submission_starts_at_the_driver() -> None:
    clock = st.StartupClock({"submitted": None, "source": "not submitted through the Ray Jobs API", "driver_start": 10.0})
    clock.mark("workers_start", 12.0)
    with clock.phase(st.MODEL):
        time.sleep(0.05)
    clock.mark("train_start", 15.0)
    clock.mark("first_step_end", 16.0)
    s = clock.split()
    assert s["runtime_env_s"] is None and s["total_s"] == 6.0 and s["from"] == "driver start"
    assert 0.05 <= s["model_load_s"] < 1.0 and s["data_s"] is None
    assert "n/a (not submitted through the Ray Jobs API)" in clock.block()


def test_rank_zero_prints_the_block_once_at_its_first_step(capsys: pytest.CaptureFixture[str]) -> None:
    for rank in (1, 0):
        st.begin({"submitted": None, "source": "x", "driver_start": time.time() - 1})
        st.CLOCK.mark("train_start")
        st.first_step_done(rank)
        st.first_step_done(rank)  # later steps change nothing
        printed = capsys.readouterr().out
        assert printed.count("gemma3-ray job start:") == (1 if rank == 0 else 0), printed
    assert st.split()["first_step_s"] is not None


@pytest.mark.slow
def test_the_callback_marks_the_training_start_and_first_step() -> None:
    from trainer.worker.metrics import first_step_callback  # the transformers side of the split

    st.begin({"submitted": None, "source": "x", "driver_start": time.time() - 1})
    cb = first_step_callback(rank=1)
    cb.on_train_begin(None, None, None)
    cb.on_step_end(None, None, None)
    assert {"workers_start", "train_start", "first_step_end"} <= set(st.CLOCK.marks)


@pytest.mark.slow
def test_the_submission_time_is_rays_record_of_the_job(tmp_path: Path) -> None:
    """A real Jobs API job: the driver reads its own submission time from Ray and starts after it."""
    from ray.job_submission import JobSubmissionClient

    from localkit.local_cluster import remove_temp_dir, start_ray_head

    head = start_ray_head(1, tmp_path / "head.log")
    try:
        client = JobSubmissionClient(head.dashboard_url, headers=head.headers)
        code = f"import json; {IMPORT}; print('MARKS', json.dumps(s.driver_marks()))"
        work = tmp_path / "work"  # the job's working_dir holds the package, as the chart's does
        shutil.copytree(ROOT / "trainer", work / "trainer", ignore=shutil.ignore_patterns("__pycache__", "docs"))
        sid = client.submit_job(entrypoint=f"python -c {json.dumps(code)}",
                                runtime_env={"working_dir": str(work), "env_vars": {"RAY_ADDRESS": head.gcs_address}})
        deadline = time.time() + 120
        while str(client.get_job_status(sid)) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.time() < deadline:
            time.sleep(0.5)
        logs = client.get_job_logs(sid)
        info = client.get_job_info(sid)
    finally:
        head.stop()
        remove_temp_dir(head.temp_dir)
    assert str(info.status) == "SUCCEEDED", logs
    marks = json.loads(logs.split("MARKS ", 1)[1].splitlines()[0])
    assert marks["source"] == f"Ray Jobs API, job {sid}"
    assert marks["submitted"] == info.start_time / 1000.0
    assert marks["submitted"] < marks["driver_start"] < info.end_time / 1000.0


def test_the_block_prints_from_a_summary_json(tmp_path: Path) -> None:
    clock = st.StartupClock({"submitted": 0.0, "source": "t", "driver_start": 5.0})
    for name, at in (("workers_start", 9.0), ("train_start", 20.0), ("first_step_end", 24.0)):
        clock.mark(name, at)
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"global_step": 3, "startup": clock.split()}))
    out = subprocess.run([sys.executable, "-m", "trainer.job.startup_timing", str(summary)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.strip() == clock.block(), out.stderr
    summary.write_text("{}")
    out = subprocess.run([sys.executable, "-m", "trainer.job.startup_timing", str(summary)], cwd=ROOT, capture_output=True,
                         text=True)
    assert out.returncode == 1 and "no startup split" in out.stderr


def test_the_demo_summary_shows_every_part_of_the_split() -> None:
    from demo.report import STARTUP_PARTS, summary_lines

    assert [k for k, _ in STARTUP_PARTS] == [k for k, _ in st.ROWS]
    clock = st.StartupClock({"submitted": 0.0, "source": "t", "driver_start": 3.0})
    for name, at in (("workers_start", 9.0), ("train_start", 20.0), ("first_step_end", 24.0)):
        clock.mark(name, at)
    lines = summary_lines({"global_step": 1, "startup": clock.split()}, Path, Path("loss.png"), 30.0, None, "")
    (line,) = [ln for ln in lines if "job start" in ln]
    assert "24.0 s from submission to step 1 (runtime env 3.0, workers 6.0, set-up 11.0, first step 4.0 s)" in line


def test_the_workers_row_splits_into_ray_start_worker_set_up_and_imports() -> None:
    clock = st.StartupClock({"submitted": 0.0, "source": "t", "driver_start": 2.0, "loop_start": 30.0})
    for name, at in (("worker_process_start", 20.0), ("workers_start", 44.0), ("train_start", 50.0),
                     ("first_step_end", 55.0)):
        clock.mark(name, at)
    s = clock.split()
    assert (s["workers_ray_s"], s["workers_actor_s"], s["workers_imports_s"]) == (18.0, 10.0, 14.0)
    assert s["workers_ray_s"] + s["workers_actor_s"] + s["workers_imports_s"] == s["workers_s"]
    assert s["total_s"] == 55.0 == sum(s[k] or 0.0 for k, _ in st.ROWS)  # the detail is inside the workers row
    lines = clock.block().splitlines()
    at = next(i for i, ln in enumerate(lines) if "driver -> Ray Train workers running" in ln)
    assert [ln.split()[-2] for ln in lines[at + 1:at + 4]] == ["18.0", "10.0", "14.0"]
    assert "trainer imports" in lines[at + 3]
