"""The runs' report.html in the bucket: find the newest (or a named run's), download it, open it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RUNS_DIR = "runs"
REPORT_FILE = "report.html"
DISPLAY_ENV = ("DISPLAY", "WAYLAND_DISPLAY")


@dataclass(frozen=True)
class RunReport:
    run: str
    bucket: str
    name: str  # object name
    updated: str

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.name}"


def runs_prefix(prefix: str) -> str:
    return f"{prefix.strip('/')}/{RUNS_DIR}/" if prefix.strip("/") else f"{RUNS_DIR}/"


def find_reports(storage: Any, bucket: str, prefix: str) -> list[RunReport]:
    """Every run's report under gs://bucket/prefix/runs/<run>/report.html, newest first."""
    base = runs_prefix(prefix)
    found = []
    for blob in storage.list_blobs(bucket, prefix=base):
        run, _, rest = blob.name[len(base):].partition("/")
        if run and rest == REPORT_FILE:
            found.append(RunReport(run, bucket, blob.name, blob.updated.isoformat() if blob.updated else ""))
    return sorted(found, key=lambda r: (r.updated, r.run), reverse=True)


def pick_report(storage: Any, bucket: str, prefix: str, run: str | None = None) -> RunReport | None:
    """The named run's report, else the newest; None when there is none."""
    reports = find_reports(storage, bucket, prefix)
    if run is None:
        return reports[0] if reports else None
    return next((r for r in reports if r.run == run), None)


@dataclass(frozen=True)
class Checkpoint:
    path: str
    updated: str


def newest_checkpoint(storage: Any, bucket: str, prefix: str) -> Checkpoint | None:
    """The newest Ray Train checkpoint directory under gs://bucket/prefix (by last write, then name)."""
    best: tuple[str, str] | None = None
    for blob in storage.list_blobs(bucket, prefix=prefix.rstrip("/") + "/"):
        parts = blob.name.split("/")
        idx = next((i for i, p in enumerate(parts[:-1]) if p.startswith("checkpoint_")), None)
        if idx is None:
            continue
        directory = "/".join(parts[: idx + 1])
        updated = blob.updated.isoformat() if blob.updated else ""
        if best is None or (updated, directory) > best:
            best = (updated, directory)
    return Checkpoint(path=f"gs://{bucket}/{best[1]}", updated=best[0]) if best else None


def can_open_browser() -> bool:
    """A browser can show a page here: a display (X11/Wayland), or macOS/Windows."""
    return sys.platform in ("darwin", "win32") or any(os.environ.get(v) for v in DISPLAY_ENV)


def status_line(storage: Any, bucket: str, prefix: str) -> str:
    report = pick_report(storage, bucket, prefix)
    if report is None:
        return f"Run report: none yet under gs://{bucket}/{runs_prefix(prefix)}"
    return f"Run report: {report.uri} (run {report.run}, {report.updated}); `gemma3-ray report` downloads it"


def download(storage: Any, report: RunReport, dest: Path) -> Path:
    """Write the report to `dest` (through a temporary file: an interrupted download leaves no half page)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.part")
    storage.bucket(report.bucket).blob(report.name).download_to_filename(str(tmp))
    tmp.replace(dest)
    return dest
