#!/usr/bin/env python3
"""Generate the chart's `training:` schema from the trainer's own flags (one source of truth).

Every field of `TrainArguments` in trainer/job/flags.py becomes a property of `training` in
charts/gemma3-ray/values.schema.json, typed from its annotation (Literal → enum, bool, int, float,
str), bounded by its range rules (`flag(..., min=, above=, below=, off=)`: the very rules the trainer
checks at job start) and described by its help text; no other key is allowed. So a misspelt or
unknown flag, a value of the wrong type or out of range fails at `helm install`/`helm template`, with
Helm naming the field, instead of after KubeRay has started the GPU nodes.

`helm --set` passes floats as text, so a numeric flag also accepts the text of a number; its range is
checked on the text too, by patterns made for the bounds the rules use (a rule this script has no
pattern for stops it, so the schema never silently checks less than the trainer). The keys the chart derives (num_workers, use_gpu,
storage_path, run_name, installer, extra_pip) or never renders (hf_token) keep their hand-written "not
allowed here" entries.

    python -m scripts.sync_trainer_schema           # rewrite the schema (make sync-trainer runs it)
    python -m scripts.sync_trainer_schema --check   # exit 1 if the schema is out of date
    (--schema=PATH: another schema file; tests pass main() another flags module)

Run from the repository root, which holds the `trainer` package (`trainer.job.flags`: standard library only).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from trainer.job import flags as trainer_flags

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "charts" / "gemma3-ray" / "values.schema.json"
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
# Flags whose values the chart renders from a YAML map as compact JSON (the trainer parses JSON).
JSON_MAP_FLAGS = {"column_mapping"}
# Flags that must name something.
NON_EMPTY_FLAGS = {"model_id", "dataset_name"}
# The range rules of trainer/job/flags.py's flag(): min (>=), above (>), below (<), off (the "off" value).
RULES = ("min", "above", "below", "off")
# `helm --set` passes floats (and --set-string any number) as strings: a numeric flag also accepts
# the text of a number, which the chart renders verbatim, so it reaches the trainer unchanged.
NUMBER_TEXT = {
    int: r"^[-+]?[0-9]+$",
    float: r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$",
}
# The range rules on the text of a number (RE2 syntax: Helm's validators use Go's regexp). Each pattern
# is exact for the texts NUMBER_TEXT admits, except where noted.
_ZERO = r"(0+\.?0*|\.0+)([eE][-+]?[0-9]+)?"
NON_NEGATIVE_TEXT = r"^\+?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$|^-" + _ZERO + "$"
ZERO_TEXT = r"^[-+]?" + _ZERO + "$"
# A non-negative text below 1: zero, a mantissa below 1 with no positive exponent, or one integer digit
# with a negative exponent ("5e-2"). Refused although below 1: several integer digits with a negative
# exponent ("10e-2"); write those as decimals.
BELOW_ONE_TEXT = (r"^[-+]?" + _ZERO + r"$|^\+?(0*(\.[0-9]*)?([eE](-[0-9]+|\+?0+))?|0*[0-9](\.[0-9]*)?[eE]-0*[1-9][0-9]*)$")


def _int_at_least(low: int) -> str:
    """The text of an integer >= ``low`` (-9 <= low <= 9)."""
    if not -9 <= low <= 9:
        raise ValueError(f"no text pattern for an integer >= {low}: extend _int_at_least")
    if low > 0:
        return rf"^\+?0*([{low}-9]|[1-9][0-9]+)$"
    negative = rf"|^-0*[1-{-low}]$" if low < 0 else ""
    return r"^\+?[0-9]+$|^-0+$" + negative


def _float_text_rules(name: str, rules: dict[str, Any]) -> list[dict[str, Any]]:
    """Schema clauses that hold the rules on the text of a float."""
    low, above, below = rules.get("min"), rules.get("above"), rules.get("below")
    if (low, above) not in ((0, None), (None, 0)) or below not in (None, 1):
        raise ValueError(f"{name}: no text pattern for the rules {rules}: extend _float_text_rules")
    clauses: list[dict[str, Any]] = [{"pattern": NON_NEGATIVE_TEXT}]
    if above == 0:
        clauses.append({"not": {"pattern": ZERO_TEXT}})
    if below == 1:
        clauses.append({"pattern": BELOW_ONE_TEXT})
    return clauses


def _number(name: str, base: type, rules: dict[str, Any]) -> dict[str, Any]:
    """A numeric flag: a JSON number in range, or the text of one in range (and the `off` value)."""
    number: dict[str, Any] = {"type": JSON_TYPES[base]}
    text: dict[str, Any] = {"type": "string", "pattern": NUMBER_TEXT[base]}
    low, above, below, off = (rules.get(k) for k in ("min", "above", "below", "off"))
    if low is not None:
        number["minimum"] = low
    if above is not None:
        number["exclusiveMinimum"] = above
    if below is not None:
        number["exclusiveMaximum"] = below
    if low is not None or above is not None:
        if base is int:
            if above is not None or below is not None:
                raise ValueError(f"{name}: integer rules other than min: extend _number")
            text["allOf"] = [{"pattern": _int_at_least(low)}]
        else:
            text["allOf"] = _float_text_rules(name, rules)
    branches = [number, text]
    if off is not None:
        branches.append({"enum": [off, str(off)]})
    return {"anyOf": branches}


def _property(name: str, annotation: Any, help_text: str, rules: dict[str, Any], range_text: str | None) -> dict[str, Any]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 else annotation
    prop: dict[str, Any] = {"description": help_text + (f" Range: {range_text}." if range_text else "")}
    if typing.get_origin(base) is typing.Literal:
        prop["enum"] = list(typing.get_args(base))
    elif name in JSON_MAP_FLAGS:
        prop["type"] = ["object", "string"]
        prop["additionalProperties"] = {"type": "string"}
    elif base in NUMBER_TEXT:
        # Helm reads whole YAML numbers as integers: a float flag accepts both ("number").
        prop.update(_number(name, base, rules))
    elif base in JSON_TYPES:
        prop["type"] = JSON_TYPES[base]
    else:
        raise TypeError(f"{name}: no JSON schema type for {annotation!r}")
    if (rules.get("min") is not None or rules.get("above") is not None) and base not in NUMBER_TEXT:
        raise TypeError(f"{name}: range rules on a non-numeric flag")
    if name in NON_EMPTY_FLAGS:
        prop["minLength"] = 1
    return prop


def training_schema(current: dict[str, Any], trainer: types.ModuleType = trainer_flags) -> dict[str, Any]:
    """The `training` schema for the trainer as it is now, keeping the chart's forbidden-key entries."""
    hints = typing.get_type_hints(trainer.TrainArguments)
    forbidden = {k: v for k, v in current.get("properties", {}).items() if "not" in v}
    props: dict[str, Any] = dict(forbidden)
    for f in dataclasses.fields(trainer.TrainArguments):
        if f.name in forbidden:
            continue
        rules = {k: f.metadata[k] for k in RULES if k in f.metadata}
        props[f.name] = _property(f.name, hints[f.name], f.metadata.get("help", ""), rules, trainer.range_text(rules))
    out = {k: v for k, v in current.items() if k not in ("properties", "additionalProperties")}
    out["properties"] = props
    out["additionalProperties"] = False
    return out


def render(flags: types.ModuleType = trainer_flags, schema_path: Path = SCHEMA) -> tuple[str, str]:
    text = schema_path.read_text()
    schema = json.loads(text)
    schema["properties"]["training"] = training_schema(schema["properties"]["training"], flags)
    return text, json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str], flags: types.ModuleType = trainer_flags) -> int:
    opts = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    schema = Path(opts.get("schema", SCHEMA))
    try:
        old, new = render(flags, schema)
    except (TypeError, ValueError) as e:
        print(f"cannot generate the `training` schema from {flags.__name__}: {e}", file=sys.stderr)
        return 2
    if "--check" in argv:
        if old != new:
            print(f"{schema} is out of date with {flags.__name__}: run `make sync-trainer`", file=sys.stderr)
            return 1
        return 0
    if old != new:
        schema.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
