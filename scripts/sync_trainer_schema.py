#!/usr/bin/env python3
"""Generate the chart's `training:` schema from the trainer's own flags (one source of truth).

Every field of `TrainArguments` in trainer/flags.py becomes a property of `training` in
charts/gemma3-ray/values.schema.json, typed from its annotation (Literal → enum, bool, int, float,
str) and described by its help text; no other key is allowed. So a misspelt or unknown flag, or a
value of the wrong type, fails at `helm install`/`helm template`, with Helm naming the field, instead
of after KubeRay has started the GPU nodes. The keys the chart derives (num_workers, use_gpu,
storage_path, run_name, installer, extra_pip) or never renders (hf_token) keep their hand-written "not
allowed here" entries.

    python scripts/sync_trainer_schema.py           # rewrite the schema (make sync-trainer runs it)
    python scripts/sync_trainer_schema.py --check   # exit 1 if the schema is out of date
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "trainer" / "flags.py"  # the flags' module: standard library only
SCHEMA = ROOT / "charts" / "gemma3-ray" / "values.schema.json"
JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string"}
# Flags whose values the chart renders from a YAML map as compact JSON (the trainer parses JSON).
JSON_MAP_FLAGS = {"column_mapping"}
# Flags that must name something.
NON_EMPTY_FLAGS = {"model_id", "dataset_name"}
# `helm --set` passes floats (and --set-string any number) as strings: a numeric flag also accepts
# the text of a number, which the chart renders verbatim, so it reaches the trainer unchanged.
NUMBER_TEXT = {
    int: r"^[-+]?[0-9]+$",
    float: r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$",
}


def _load_trainer() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gemma3_ray_trainer_for_schema", TRAINER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _property(name: str, annotation: Any, help_text: str) -> dict[str, Any]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 1 else annotation
    prop: dict[str, Any] = {"description": help_text}
    if typing.get_origin(base) is typing.Literal:
        prop["enum"] = list(typing.get_args(base))
    elif name in JSON_MAP_FLAGS:
        prop["type"] = ["object", "string"]
        prop["additionalProperties"] = {"type": "string"}
    elif base in NUMBER_TEXT:
        # Helm reads whole YAML numbers as integers: a float flag accepts both ("number").
        prop["anyOf"] = [{"type": JSON_TYPES[base]}, {"type": "string", "pattern": NUMBER_TEXT[base]}]
    elif base in JSON_TYPES:
        prop["type"] = JSON_TYPES[base]
    else:
        raise TypeError(f"{name}: no JSON schema type for {annotation!r}")
    if name in NON_EMPTY_FLAGS:
        prop["minLength"] = 1
    return prop


def training_schema(current: dict[str, Any]) -> dict[str, Any]:
    """The `training` schema for the trainer as it is now, keeping the chart's forbidden-key entries."""
    trainer = _load_trainer()
    hints = typing.get_type_hints(trainer.TrainArguments)
    forbidden = {k: v for k, v in current.get("properties", {}).items() if "not" in v}
    props: dict[str, Any] = dict(forbidden)
    for f in dataclasses.fields(trainer.TrainArguments):
        if f.name in forbidden:
            continue
        props[f.name] = _property(f.name, hints[f.name], f.metadata.get("help", ""))
    out = {k: v for k, v in current.items() if k not in ("properties", "additionalProperties")}
    out["properties"] = props
    out["additionalProperties"] = False
    return out


def render() -> tuple[str, str]:
    text = SCHEMA.read_text()
    schema = json.loads(text)
    schema["properties"]["training"] = training_schema(schema["properties"]["training"])
    return text, json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    old, new = render()
    if "--check" in argv:
        if old != new:
            print(f"{SCHEMA.relative_to(ROOT)} is out of date with {TRAINER.relative_to(ROOT)}: "
                  "run `make sync-trainer`", file=sys.stderr)
            return 1
        return 0
    if old != new:
        SCHEMA.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
