"""`values --check FILE`: values files written for an earlier chart version, checked against this chart (offline)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

Out = Callable[[str], None]


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--check", action="append", metavar="FILE", help="check this values file (repeatable) against the "
                   "chart instead of writing one: keys moved since --for-chart-version are refused naming their "
                   "replacement, then the chart's schema; reads nothing remote")
    p.add_argument("--for-chart-version", metavar="VERSION", help="with --check: the chart version the files were "
                   "written for (default: any earlier one; the moves of every version up to the chart's are checked)")
    p.add_argument("--chart", help="with --check: chart path (default: the chart beside the plugin)")


def checking(args: argparse.Namespace) -> bool:
    return bool(args.check)


def cmd_check(args: argparse.Namespace, out: Out = print) -> int:
    from gemma3_ray.config import values_moved
    from gemma3_ray.kube import helm_release

    chart = helm_release.chart_path(args.chart)
    files = [Path(f) for f in args.check]
    version = values_moved.check(chart, files, args.for_chart_version)
    since = f" (written for {args.for_chart_version})" if args.for_chart_version else ""
    out(f"{len(files)} values file(s){since} valid for chart {version}: no moved key set, the schema holds.")
    return 0
