"""What CI says after `make e2e` (`.ci/run`): one plain line from summary.json, and whether CI fails.

`python -m e2e.runner.verdict e2e-output/summary.json` prints the line and exits 0 or 1: a pass is 0; a fail is
1; a run that left selected stages not run is 0 only when every one of them was "not run: time" (E2E_DEADLINE
left no room: CI's own deadline, not a defect), and the line says how many ran ("ran nothing" when none did).
Any other "not run" (the cluster lacks what a stage needs) is 1. A missing or unreadable summary is 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def ci_line(summary: dict) -> tuple[str, int]:
    """(the line CI prints, the exit code CI takes) for a summary.json's content."""
    result, reason = summary.get("result"), summary.get("reason", "")
    if result == "pass":
        return f"make e2e passed: {reason}", 0
    if result != "not run":
        return f"make e2e failed: {reason}", 1
    rows = {s.get("name"): s for s in summary.get("stages", [])}
    chosen = summary.get("selected") or []
    ran = [n for n in chosen if (rows.get(n) or {}).get("result") == "pass"]
    missing = [n for n in chosen if n not in ran]
    timed = [n for n in missing if str((rows.get(n) or {}).get("detail", "")).startswith("time:")]
    what = "ran nothing" if not ran else f"ran {len(ran)} of {len(chosen)} selected stages"
    if missing and timed == missing:
        first = (rows.get(missing[0]) or {}).get("detail", "")
        return (f"make e2e {what}: {len(missing)} not run for time before E2E_DEADLINE (first: {missing[0]}, "
                f"{first}); not a failure, CI's deadline left no room"), 0
    return f"make e2e {what}: {reason}", 1


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "e2e-output/summary.json")
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        print(f"make e2e left no readable {path} ({e}): it ended before its first stage, or was killed")
        return 1
    line, code = ci_line(summary)
    print(line)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
