"""Values files written for an earlier chart version, checked against this one (`gemma3-ray values --check`).

The chart's ``values-moved.yaml`` lists, per version, the keys that version moved or removed and their
replacement. A values file written for version ``--for-chart-version`` (default: any earlier one) is refused in one
sentence naming a moved key it sets and its replacement; otherwise it is validated as Helm would: merged onto the
chart's values.yaml (a ``null`` deletes a default) and checked against values.schema.json, the first error one
sentence naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
from ruamel.yaml import YAML

from gemma3_ray.config import chart_version
from gemma3_ray.utils.errors import EXIT_USAGE, UserError
from gemma3_ray.utils.tokens import shown

TABLE = "values-moved.yaml"


class ValuesRefused(UserError):
    """A values file sets a moved key or breaks the chart's schema (one sentence: the key and the fix)."""

    exit_code = EXIT_USAGE


@dataclass(frozen=True)
class Move:
    version: str  # the chart version that moved or removed the key
    key: str  # dotted path, as written for the versions before
    replacement: str | None  # dotted path; None: removed
    note: str = ""


def semver_key(version: str) -> tuple[int, int, int]:
    m = chart_version.SEMVER.fullmatch(version)
    if not m:
        raise ValuesRefused(f"--for-chart-version {shown(version)} is not a chart version: give MAJOR.MINOR.PATCH, "
                            "e.g. 0.1.0 (the `version:` of the Chart.yaml the values file was written for).")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def _load(path: Path) -> Any:
    try:
        return YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValuesRefused(f"Cannot read values file {shown(path)} ({str(exc).splitlines()[0]}): pass a readable "
                            "YAML file.") from exc


def table(chart: Path) -> list[Move]:
    """Every move the chart's values-moved.yaml lists (none when it has no table: versions before the table)."""
    path = chart / TABLE
    doc = (_load(path) if path.is_file() else None) or {}
    return [Move(str(version), str(m["key"]), m.get("replacement"), str(m.get("note") or ""))
            for version, moves in (doc.get("versions") or {}).items() for m in moves or []]


def moves_since(chart: Path, for_version: str | None) -> list[Move]:
    """The moves a values file written for ``for_version`` meets (None: written for any earlier version)."""
    current = semver_key(chart_version.read(chart).version)
    since = semver_key(for_version) if for_version else (-1, -1, -1)
    if since > current:
        raise ValuesRefused(f"--for-chart-version {for_version} is newer than the chart ({'.'.join(map(str, current))}): "
                            "check with the chart the values were written for, or give the older version.")
    return [m for m in table(chart) if since < semver_key(m.version) <= current]


def _get(values: Any, dotted: str) -> bool:
    node = values
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def merged(base: Any, over: Any) -> Any:
    """Helm's merge of a values file onto the chart's defaults: maps merge, anything else replaces, null deletes."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(base.get(key), value)
    return out


def _said(error: jsonschema.exceptions.ValidationError) -> str:
    """The schema's rule in words, never the value itself (a values file may hold a token: hfToken.value)."""
    rule, want = error.validator, error.validator_value
    if rule in ("additionalProperties", "required"):
        return str(error.message).rstrip(".")  # names keys, not values
    return {"type": f"must be of type {want}", "pattern": f"must match {want}", "enum": f"must be one of {want}",
            "minimum": f"must be at least {want}", "maximum": f"must be at most {want}"}.get(
        str(rule), f"breaks the schema's `{rule}: {json.dumps(want)[:120]}`")


def refusal_for_move(path: Path, move: Move) -> str:
    where = f"values file {shown(path)} sets `{move.key}`, which chart {move.version}"
    if move.replacement:
        return f"{where} moved to `{move.replacement}`: rename the key to `{move.replacement}`."
    return f"{where} removed: {move.note or 'delete the key'}."


def check(chart: Path, files: list[Path], for_version: str | None = None) -> str:
    """Each values file against the chart: a moved key refused first, then the schema; returns the chart version."""
    moves = moves_since(chart, for_version)
    defaults = _load(chart / "values.yaml") or {}
    schema = json.loads((chart / "values.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    for path in files:
        values = _load(path) or {}
        if not isinstance(values, dict):
            raise ValuesRefused(f"values file {shown(path)} is not a map of keys: a values file is YAML `key: value`.")
        for move in moves:
            if _get(values, move.key):
                raise ValuesRefused(refusal_for_move(path, move))
        error = jsonschema.exceptions.best_match(validator.iter_errors(merged(defaults, values)))
        if error is not None:
            key = ".".join(str(p) for p in error.absolute_path) or "(top level)"
            raise ValuesRefused(f"values file {shown(path)}: `{key}` {_said(error)}: fix it for chart "
                                f"{chart_version.read(chart).version} (values.schema.json).")
    return chart_version.read(chart).version
