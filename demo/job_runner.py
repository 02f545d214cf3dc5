"""Submit the entry point through the Ray Jobs API and follow it: logs, progress, outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import requests  # Ray's Jobs API client raises requests' errors for a refused connection

from demo.errors import DemoError
from demo.job_log import LineSplitter, for_terminal, is_ray_own

PROGRESS_POLL_S = 2.0
STATUS_POLL_S = 1.0
LOG_TAIL_LINES = 60
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
# Submission retries: Ray's job agent starts a moment after the dashboard answers (a loaded machine
# answers "No available agent to submit job" or a 5xx meanwhile), and a head may refuse connections.
SUBMIT_DEADLINE_S = 120.0
HEAD_LOGS = "the Ray head's session logs (<its temp dir>/session_latest/logs)"
SUBMIT_BACKOFF_S = (0.5, 1.0, 2.0, 4.0)  # then 4 s until the deadline
_TRANSIENT = re.compile(r"No available agent to submit job|status code 5\d\d|Connection refused|"
                        r"Failed to establish a new connection|Max retries exceeded|RemoteDisconnected", re.I)
# The metrics.jsonl to follow, or a function that finds it (the run's directory appears once the job runs).
MetricsPath = Path | Callable[[], Path] | None


@dataclass
class JobOutcome:
    submission_id: str
    status: str
    message: str
    wall_s: float | None
    log_path: Path
    working_dir_uri: str = ""  # the package Ray made of the runtime env's working_dir (gcs://_ray_pkg_<hash>.zip)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (a partly written last line is ignored)."""
    records = []
    try:
        text = path.read_text()
    except OSError:
        return records
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def progress_line(rec: dict[str, Any], max_steps: int | None, started: float) -> str:
    step = rec.get("step")
    of = f"/{max_steps}" if max_steps else ""
    parts = [f"step {step}{of}"]
    for key in ("loss", "eval_loss", "samples_per_second"):
        if isinstance(rec.get(key), (int, float)):
            parts.append(f"{key} {rec[key]:.4g}")
    parts.append(f"{time.monotonic() - started:.0f} s")
    return "[demo] progress: " + " · ".join(parts)


class _Out:
    """All job output to the log file; to the terminal the job's lines except Ray's own logging (indented
    under a `job |` gutter, so the demo's own lines stand out), and the progress lines."""

    def __init__(self, log: TextIO, stream: TextIO = sys.stdout):
        self.log, self.stream = log, stream
        self.lines, self.hidden = LineSplitter(), 0
        self.ansi = stream.isatty()

    def job(self, text: str) -> None:
        self.log.write(text)
        self.log.flush()
        self._show(self.lines.feed(text))

    def close(self) -> None:
        self._show(self.lines.flush())

    def _show(self, lines: list[str]) -> None:
        for line in lines:
            if is_ray_own(line):
                self.hidden += 1
            else:
                self.stream.write(for_terminal(line, self.ansi) + "\n")
        self.stream.flush()

    def note(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()


async def _follow(client, submission_id: str, out: _Out, metrics_path: MetricsPath, max_steps: int | None) -> None:
    started = time.monotonic()
    done = asyncio.Event()

    async def logs() -> None:
        try:
            async for chunk in client.tail_job_logs(submission_id):
                out.job(chunk)
        finally:
            done.set()

    async def progress() -> None:
        seen = 0
        while not done.is_set():
            path = metrics_path() if callable(metrics_path) else metrics_path
            if path is not None:
                records = read_metrics(path)
                for rec in records[seen:]:
                    if rec.get("kind") in ("train", "eval"):
                        out.note(progress_line(rec, max_steps, started))
                seen = max(seen, len(records))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(done.wait(), timeout=PROGRESS_POLL_S)

    await asyncio.gather(logs(), progress())


def run_job(client, entrypoint: str, runtime_env: dict[str, Any], log_path: Path, *,
            metrics_path: MetricsPath = None, max_steps: int | None = None,
            on_tick: Callable[[], None] | None = None, metadata: dict[str, str] | None = None,
            head_logs: str = HEAD_LOGS) -> JobOutcome:
    """Submit, stream the logs until the job ends, and return its outcome."""
    submission_id = submit(client, head_logs=head_logs, entrypoint=entrypoint, runtime_env=runtime_env,
                           metadata=metadata)
    print(f"[demo] submitted job {submission_id}; its log follows, without Ray's own logging "
          f"(all of it: {log_path})", flush=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        out = _Out(log)
        try:
            asyncio.run(_follow(client, submission_id, out, metrics_path, max_steps))
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):  # the head may be going down already; it is stopped next
                client.stop_job(submission_id)
            raise
        finally:
            out.close()
        if out.hidden:
            out.note(f"[demo] {out.hidden} lines of Ray's own logging and metric dicts are in {log_path} only")
        # The log stream can end a moment before the status turns terminal.
        info = client.get_job_info(submission_id)
        while str(info.status) not in TERMINAL:
            if on_tick:
                on_tick()
            time.sleep(STATUS_POLL_S)
            info = client.get_job_info(submission_id)
    wall = (info.end_time - info.start_time) / 1000.0 if info.end_time and info.start_time else None
    uploaded = str((info.runtime_env or {}).get("working_dir") or "")
    return JobOutcome(submission_id, str(info.status), info.message or "", wall, log_path, uploaded)


def submit(client, *, deadline_s: float = SUBMIT_DEADLINE_S, say: Callable[[str], None] = print,
           head_logs: str = HEAD_LOGS, **job: Any) -> str:
    """``client.submit_job(**job)``, retried with backoff while the Jobs API answers with a transient
    error (no job agent yet, a 5xx, connection refused) until ``deadline_s``; then one sentence naming
    ``head_logs``, where the head's logs are."""
    start = time.monotonic()
    attempt = 0
    while True:
        try:
            return client.submit_job(**job)
        except (RuntimeError, ConnectionError, OSError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            transient = isinstance(exc, requests.exceptions.ConnectionError) or bool(_TRANSIENT.search(str(exc)))
            waited = time.monotonic() - start
            pause = SUBMIT_BACKOFF_S[min(attempt, len(SUBMIT_BACKOFF_S) - 1)]
            if not transient:
                raise DemoError(f"the Ray Jobs API refused the job: {first}") from exc
            if waited + pause > deadline_s:
                raise DemoError(
                    f"the Ray Jobs API did not accept the job within {deadline_s:.0f} s ({attempt + 1} attempts; "
                    f"last answer: {first}): the Ray head is up but its job agent is not; its log "
                    f"(dashboard_agent.log) is in {head_logs}; run `make demo` again.") from exc
            attempt += 1
            say(f"[demo] the Jobs API is not ready ({first[:120]}); retry {attempt} in {pause:.1f} s")
            time.sleep(pause)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no job log)"


def require_success(outcome: JobOutcome) -> None:
    if outcome.status == "SUCCEEDED":
        return
    raise DemoError(
        f"the training job {outcome.submission_id} ended {outcome.status}: {outcome.message}\n"
        f"--- last {LOG_TAIL_LINES} lines of {outcome.log_path} ---\n{log_tail(outcome.log_path)}\n---\n"
        "Fix what the log names (the trainer's flags come from values/local.yaml; `make test` runs the "
        "trainer's own tests) and run `make demo` again."
    )
