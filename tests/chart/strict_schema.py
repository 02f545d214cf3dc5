"""Strict validation of RayCluster/RayJob objects against the official KubeRay CRD schemas.

The API server prunes unknown fields silently; here they are errors. The CRD's
openAPIV3Schema is rewritten so that every object that lists `properties` (and is not marked
`x-kubernetes-preserve-unknown-fields`) gets `additionalProperties: false`, and `nullable` is
honoured: a null where the schema wants an object (a bare `key:` in a template) is an error.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import jsonschema
import yaml

from tests.kuberay_crds import VERSIONS, crd_folder

KUBERAY_VERSIONS = VERSIONS
CRD_FILES = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}


def _strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if out.get("nullable") is True and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    return out


@cache
def strict_schema(version: str, kind: str) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load((crd_folder(version) / CRD_FILES[kind]).read_text(), Loader=loader)
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _strict(copy.deepcopy(v1["schema"]["openAPIV3Schema"]))
    # Top-level metadata is validated by the API server's ObjectMeta rules, not the CRD:
    # check the parts a chart writes.
    schema["properties"]["metadata"] = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "namespace": {"type": "string"},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata", "spec"})
    return schema


@cache
def _validator(version: str, kind: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(strict_schema(version, kind))


def crd_errors(doc: dict[str, Any], version: str) -> list[str]:
    """All strict-validation errors of one RayCluster/RayJob against one KubeRay version."""
    validator = _validator(version, doc["kind"])
    return [
        f"{doc['kind']}/{doc['metadata'].get('name')} {'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(doc)
    ]
