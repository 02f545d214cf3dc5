"""The runs' report.html in the bucket: find the newest (or a named run's), download it, open it."""

from __future__ import annotations

import argparse
import os
import sys
import webbrowser
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gemma3_ray.deployment import from_args
from gemma3_ray.errors import EXIT_FAILURE, UserError
from gemma3_ray.gcp_clients import Clients

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


def cmd_report(args: argparse.Namespace, clients: Clients | None,
               out: Callable[[str], None] = lambda line: print(line, flush=True)) -> int:
    if args.release_arg:
        args.release = args.release_arg
    dep, clients = from_args(args, clients)
    storage = clients.get_storage()
    report = pick_report(storage, dep.bucket, dep.prefix, args.run)
    if report is None:
        where = f"gs://{dep.bucket}/{runs_prefix(dep.prefix)}"
        if args.run:
            runs = [r.run for r in find_reports(storage, dep.bucket, dep.prefix)]
            raise UserError(f"--run {args.run}: no report.html under {where}{args.run}/; runs with a report: "
                            f"{', '.join(runs) or 'none'}.")
        out(f"No run report yet under {where} (the trainer writes it at the first evaluation and at the end).")
        return EXIT_FAILURE
    dest = Path(args.output) if args.output else Path(f"{dep.release}-{report.run}-{REPORT_FILE}")
    download(storage, report, dest)
    out(f"{report.uri} -> {dest.resolve()}")
    if args.open and can_open_browser():
        webbrowser.open(dest.resolve().as_uri())
        out("opened in your browser")
    elif args.open:
        out(f"no display here: open {dest.resolve()} in a browser (it is one self-contained file)")
    return 0


def register(sub: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("report", help="download a run's report.html (the newest by default) and open it")
    p.add_argument("release_arg", nargs="?", metavar="RELEASE", help="Helm release (same as --release)")
    add_common(p)
    p.add_argument("--run", help="run name (a folder under <prefix>/runs/; default: the newest report)")
    p.add_argument("-o", "--output", help="file to write (default: ./RELEASE-RUN-report.html)")
    p.add_argument("--no-open", dest="open", action="store_false", help="only download, never open a browser")
    p.set_defaults(handler=cmd_report)
