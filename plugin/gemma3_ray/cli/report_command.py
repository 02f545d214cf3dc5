"""`report`: download a run's report.html from the bucket (the newest by default) and open it in a browser."""

from __future__ import annotations

import argparse
import webbrowser
from collections.abc import Callable
from pathlib import Path

from gemma3_ray.cli import common
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp.run_reports import (
    REPORT_FILE,
    can_open_browser,
    download,
    find_reports,
    pick_report,
    runs_prefix,
)
from gemma3_ray.utils.errors import EXIT_FAILURE, UserError


def cmd_report(args: argparse.Namespace, clients: Clients | None,
               out: Callable[[str], None] = lambda line: print(line, flush=True)) -> int:
    if args.release_arg:
        args.release = args.release_arg
    dep, clients = common.resolve(args, clients)
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
