#!/usr/bin/env python3
"""Record the chart's content digest for its current version in charts/gemma3-ray/CHANGELOG.md.

What counts and why: plugin/gemma3_ray/config/chart_digest.py (templates/, values.schema.json, values.yaml,
files/ less what .helmignore leaves out, Chart.yaml less `version`). tests/chart/test_chart_version_bump.py fails
when the chart's contents differ from the digest its `version:` records; after a change, bump `version`, add a
CHANGELOG entry `## [VERSION] - DATE`, then:

    python -m scripts.chart_digest --write            # record the digest in the current version's entry
    python -m scripts.chart_digest                    # print it and whether it matches (exit 1 if not)
    python -m scripts.chart_digest --write --rewrite  # replace a recorded one: only for a version never released

Run from the repository root with the checkout's own venv (`make setup` installs its plugin/ editable there).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gemma3-ray"


def main(argv: list[str] | None = None, chart: Path = CHART) -> int:
    argv = sys.argv[1:] if argv is None else argv
    unknown = set(argv) - {"--write", "--rewrite"}
    if unknown or ("--rewrite" in argv and "--write" not in argv):
        print("usage: python -m scripts.chart_digest [--write [--rewrite]]", file=sys.stderr)
        return 2
    from gemma3_ray.config import chart_digest, chart_version

    version = chart_version.read(chart).version
    if "--write" in argv:
        try:
            new, old = chart_digest.write(chart, version, rewrite="--rewrite" in argv)
        except ValueError as exc:
            print(f"chart_digest: {exc}", file=sys.stderr)
            return 1
        print(f"{version}: {new}" + ("" if old in (None, new) else f" (was {old})"))
        return 0
    digest, recorded = chart_digest.content_digest(chart), chart_digest.recorded(chart).get(version)
    print(f"{version}: {digest} (recorded: {recorded or 'none'})")
    return 0 if digest == recorded else 1


if __name__ == "__main__":
    sys.exit(main())
