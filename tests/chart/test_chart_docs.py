"""values.yaml documents every value where it is declared; the schema knows it; the README lists it."""

from __future__ import annotations

import json

from helm_render import CHART
from values_doc import documented_values

VALUES = CHART / "values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
README = (CHART / "README.md").read_text()
MIN_COMMENT_CHARS = 10
# Maps of user keys (flags, env vars) whose schema names only the keys it forbids or types.
FREE_FORM_MAPS = ("training", "rayJob.runtimeEnv.envVars")


def schema_node(path: str) -> dict:
    node = SCHEMA
    for part in path.split("."):
        props = node.get("properties", {})
        assert part in props, f"{path}: not in values.schema.json"
        node = props[part]
    return node


def test_every_value_is_documented_where_declared() -> None:
    docs = documented_values(VALUES)
    assert len(docs) >= 50
    undocumented = [p for p, c in docs.items() if len(c) < MIN_COMMENT_CHARS]
    assert not undocumented, undocumented


def test_every_value_is_in_the_schema_and_the_readme() -> None:
    for path in documented_values(VALUES):
        schema_node(path)
        assert f"`{path}`" in README, f"{path} missing from charts/gemma3-ray/README.md"


def test_schema_rejects_unknown_keys_at_every_object_level() -> None:
    def walk(node: dict, where: str) -> None:
        if node.get("type") == "object" and "properties" in node and where not in FREE_FORM_MAPS:
            assert node.get("additionalProperties") is False, where
        for name, child in node.get("properties", {}).items():
            walk(child, f"{where}.{name}".strip("."))

    walk(SCHEMA, "")
