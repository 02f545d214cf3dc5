"""Where a job's start went: submission, runtime env, workers, model, data, first optimizer step.

The driver records when the job was submitted (Ray's Jobs API record) and when its own process
started; the rank-0 worker adds its phases and prints one block when its first optimizer step ends.
The same split goes into ``summary.json`` under ``startup``. Standard library only at import time:
the driver runs this on a head that may have nothing but Ray.

Usage (the driver passes ``driver_marks()`` to the workers in the train loop config)::

    startup_timing.begin(config["startup"])          # first thing in the worker's train loop
    with startup_timing.phase(startup_timing.MODEL):  # around each part of the model load
        ...
    trainer.add_callback(metrics.first_step_callback(rank))  # trainer.worker.metrics: the transformers side
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from trainer.job import stored

# An exact submission time (Unix seconds) from whoever submits the job, when Ray has no record of
# it (a script run directly, e.g. bench/e2e_ray.sh). Ray's Jobs API record wins when there is one.
SUBMITTED_AT_ENV = "GEMMA3_RAY_SUBMITTED_AT"
# Set by Ray's job supervisor in the driver's environment: the job config, whose metadata holds the
# Jobs API submission id (ray/dashboard/modules/job/job_supervisor.py, JOB_ID_METADATA_KEY).
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
SUBMISSION_ID_KEY = "job_submission_id"

MODEL = "model load"
DATA = "data fetch and scan"
# (key in summary.json, label) in the order a job goes through them.
ROWS = (
    ("runtime_env_s", "runtime env set-up (submission -> driver start)"),
    ("workers_s", "driver -> Ray Train workers running"),
    ("model_load_s", f"{MODEL} (fetch, processor, from_pretrained)"),
    ("data_s", DATA),
    ("setup_other_s", "trainer set-up (adapter, optimizer, resume)"),
    ("first_step_s", "first optimizer step (incl. first batch)"),
)
_PHASE_KEYS = {MODEL: "model_load_s", DATA: "data_s"}
# Where the workers row goes (printed under it when known): (key, label, first mark, last mark).
WORKER_DETAIL = (
    ("workers_ray_s", "of which: Ray start, placement, worker spawn", "driver_start", "worker_process_start"),
    ("workers_actor_s", "of which: worker process -> train loop", "worker_process_start", "loop_start"),
    ("workers_imports_s", "of which: trainer imports (torch, TRL, ...)", "loop_start", "workers_start"),
)



def _split_problem(value: Any, at: str) -> str | None:
    """Why a summary's `startup` is not a split block() can print (each row's seconds a number or null)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{at}: not a JSON object"
    keys = [k for k, _ in ROWS] + [k for k, *_ in WORKER_DETAIL] + ["total_s"]
    bad = [k for k in keys if value.get(k) is not None and (isinstance(value[k], bool)
                                                           or not isinstance(value[k], int | float))]
    return f"{at}.{bad[0]}: {json.dumps(value[bad[0]])[:40]} is not seconds" if bad else None


SUMMARY = stored.fields({}, {"startup": _split_problem})  # what main() reads of a summary.json

_IMPORTED_AT = time.time()


def process_start_time() -> float:
    """Unix time this process started (Linux: its /proc start tick), else when this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])  # field 22: start, in ticks since boot
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return _IMPORTED_AT


def submitted_at() -> tuple[float | None, str]:
    """(Unix time the job was submitted, where that came from); (None, why) when unknown."""
    if os.environ.get(SUBMITTED_AT_ENV):
        try:
            return float(os.environ[SUBMITTED_AT_ENV]), SUBMITTED_AT_ENV
        except ValueError:
            return None, f"{SUBMITTED_AT_ENV}={os.environ[SUBMITTED_AT_ENV]!r} is not a Unix time"
    try:
        sid = (json.loads(os.environ.get(RAY_JOB_CONFIG_ENV, "{}")).get("metadata") or {}).get(SUBMISSION_ID_KEY)
    except ValueError:
        sid = None
    if not sid:
        return None, "not submitted through the Ray Jobs API"
    try:
        from ray.job_submission import JobSubmissionClient

        info = JobSubmissionClient().get_job_info(sid)
    except Exception as e:  # noqa: BLE001 - timing is a report; it never fails the job
        return None, f"Ray's record of job {sid} is unreadable ({type(e).__name__}: {e})"
    if not info.start_time:
        return None, f"Ray's record of job {sid} has no submission time"
    return info.start_time / 1000.0, f"Ray Jobs API, job {sid}"


def driver_marks() -> dict[str, Any]:
    """What the driver knows, for the workers: submission time (or why not) and its own start."""
    submitted, source = submitted_at()
    return {"submitted": submitted, "source": source, "driver_start": process_start_time()}


class StartupClock:
    """Marks (Unix times) and accumulated phase durations of one worker process's start."""

    def __init__(self, marks: dict[str, Any] | None = None):
        self.marks: dict[str, Any] = dict(marks or {})
        self.phases: dict[str, float] = {}

    def mark(self, name: str, at: float | None = None) -> None:
        self.marks[name] = time.time() if at is None else at

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.time()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.time() - start

    def split(self) -> dict[str, Any]:
        """Seconds per row of ROWS (None where unknown), the total and where the start was taken from."""
        m = self.marks
        out: dict[str, Any] = {key: None for key, _ in ROWS}
        submitted, driver, workers = m.get("submitted"), m.get("driver_start"), m.get("workers_start")
        train, first = m.get("train_start"), m.get("first_step_end")
        if submitted is not None and driver is not None:
            out["runtime_env_s"] = driver - submitted
        if driver is not None and workers is not None:
            out["workers_s"] = workers - driver
        for key, _label, first_mark, last_mark in WORKER_DETAIL:
            if m.get(first_mark) is not None and m.get(last_mark) is not None:
                out[key] = m[last_mark] - m[first_mark]
        for name, key in _PHASE_KEYS.items():
            if name in self.phases:
                out[key] = self.phases[name]
        if workers is not None and train is not None:
            out["setup_other_s"] = max(0.0, train - workers - sum(self.phases.values()))
        if train is not None and first is not None:
            out["first_step_s"] = first - train
        start = submitted if submitted is not None else driver
        out["total_s"] = first - start if start is not None and first is not None else None
        out["from"] = "submission" if submitted is not None else "driver start"
        out["submission_time_source"] = m.get("source")
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}

    def block(self) -> str:
        return block(self.split())


def block(s: dict[str, Any]) -> str:
    """A split (``StartupClock.split()``, or ``summary.json``'s ``startup``) as one readable block."""
    total = s.get("total_s")
    head = f"gemma3-ray job start: {total:.1f} s" if total is not None else "gemma3-ray job start"
    lines = [f"{head} from {s.get('from', 'driver start')} to the end of the first optimizer step"]
    for key, label in ROWS:
        value = s.get(key)
        if value is None:
            text = "n/a" + (f" ({s.get('submission_time_source')})" if key == "runtime_env_s" else "")
        else:
            share = f" {100 * value / total:4.0f}%" if total else ""
            text = f"{value:8.1f} s{share}"
        lines.append(f"  {label:<48} {text}")
        if key == "workers_s":
            lines += [f"    {sub:<46} {s[k]:8.1f} s" for k, sub, _a, _b in WORKER_DETAIL if s.get(k) is not None]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``python -m trainer.job.startup_timing SUMMARY_JSON``: print the split a run's summary.json holds."""
    if len(argv) != 1:
        print("usage: python -m trainer.job.startup_timing SUMMARY_JSON", file=sys.stderr)
        return 2
    try:
        with open(argv[0], "rb") as fh:
            split_ = stored.parse(fh.read(), "summary.json", SUMMARY).get("startup")
    except (OSError, stored.Unusable) as e:
        print(f"{argv[0]}: {e}", file=sys.stderr)
        return 2
    if not split_:
        print(f"{argv[0]}: no startup split (a run from before startup_timing, or no optimizer step)", file=sys.stderr)
        return 1
    print(block(split_))
    return 0


CLOCK = StartupClock()


def begin(marks: dict[str, Any] | None) -> StartupClock:
    """Start this worker process's clock from the driver's marks (and `loop_start`, when the train loop
    was entered); marks this process's start and the workers' start (the trainer's imports done)."""
    global CLOCK
    CLOCK = StartupClock(marks)
    CLOCK.mark("worker_process_start", process_start_time())
    CLOCK.mark("workers_start")
    return CLOCK


def phase(name: str) -> contextlib.AbstractContextManager[None]:
    return CLOCK.phase(name)


def first_step_done(rank: int) -> None:
    """Mark the end of the first optimizer step (once per process); rank 0 prints the block."""
    if "first_step_end" in CLOCK.marks:
        return
    CLOCK.mark("first_step_end")
    if rank == 0:
        print(CLOCK.block(), flush=True)


def split() -> dict[str, Any]:
    return CLOCK.split()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
