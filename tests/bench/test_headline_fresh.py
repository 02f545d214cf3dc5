"""RESULTS.md's headline measured what the tree ships (issue #45 item 1): the results file its first line names
recorded the digest of the trainer's speed path (bench/speed_path.py); when a part of that path has changed since,
this fails naming the parts, until a new headline call is recorded. A speed change cannot reach the default
unmeasured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import speed_path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"


def headline_rows(text: str) -> tuple[str, dict[str, dict]]:
    """The results file RESULTS.md's first line names, and its rows by name."""
    first = text.splitlines()[0]
    m = re.search(r"one call: `(bench/results/[^`]+\.jsonl)`", first)
    assert m, f"RESULTS.md's first line names no results file: {first!r}"
    lines = (ROOT / m[1]).read_text().splitlines()
    return m[1], {row["name"]: row for row in map(json.loads, filter(str.strip, lines))}


def stale(measured: dict, now: dict[str, str]) -> list[str]:
    if "speed_files" not in measured:
        return ["(the results line records no speed path: a call before bench/speed_path.py)"]
    return speed_path.changed(measured["speed_files"], now)


def test_the_headline_measured_the_speed_path_the_tree_ships():
    source, rows = headline_rows(RESULTS.read_text())
    row = rows.get("default")
    assert row and row.get("ok"), f"{source} has no good `default` row"
    changed = stale(row, speed_path.parts())
    assert not changed, (f"the trainer's speed path changed since the headline's call ({source}, commit "
                         f"{row.get('commit') or '?'}): {', '.join(changed)}. Measure it (`make bench GROUP=headline`, "
                         "bench/README.md) and write RESULTS.md from the new results file before this lands")
    assert row["speed_path"] == speed_path.digest(row["speed_files"]), f"{source}: its digest does not match its parts"


def test_a_change_to_any_part_is_seen(tmp_path):
    """The check can fail: a lever's module, the lever table, the model set-up and a recipe value each change the
    digest; a flag of another concern in flags.py does not."""
    import shutil

    for part in ("trainer", "bench"):
        shutil.copytree(ROOT / part, tmp_path / part, symlinks=False,
                        ignore=shutil.ignore_patterns("__pycache__", "results", "*.md"))
    before = speed_path.parts(tmp_path)
    flags = tmp_path / "trainer/job/flags.py"
    edits = {
        "trainer/speed/frozen_norm.py": ("return F.layer_norm(", "return 1 * F.layer_norm("),
        "trainer/job/lever_table.py": ("from __future__ import annotations", "from __future__ import annotations\n#"),
        "trainer/worker/model.py": ("from __future__ import annotations", "from __future__ import annotations\n#"),
        speed_path.RECIPES: ('"per_device_train_batch_size": (16,', '"per_device_train_batch_size": (12,'),
    }
    for part, (old, new) in edits.items():
        path = flags if part == speed_path.RECIPES else tmp_path / part
        text = path.read_text()
        assert old in text, f"{part}: the planted edit no longer applies ({old!r})"
        path.write_text(text.replace(old, new, 1))
        assert speed_path.changed(before, speed_path.parts(tmp_path)) == [part]
        path.write_text(text)
    flags.write_text(flags.read_text() + "\nUNRELATED = 1\n")
    assert speed_path.changed(before, speed_path.parts(tmp_path)) == []


@pytest.mark.parametrize("row", [{}, {"speed_files": {"trainer/speed/x.py": "a"}}])
def test_an_old_or_changed_record_is_stale(row):
    assert stale(row, {"trainer/speed/x.py": "b"})
