"""Render the chart with the real Helm binaries and load the manifests (nulls kept)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gemma3-ray"
VALUES_DIR = ROOT / "values"
CI_VALUES_DIR = CHART / "ci"
RELEASE = "demo"
NAMESPACE = "ml-team"
HELM_TIMEOUT_S = 120


def helm_bin(var: str) -> str:
    """HELM (Helm 4) or HELM3 (Helm 3): from the environment, else the project-local install."""
    default = ROOT / ".tools" / "bin" / ("helm" if var == "HELM" else "helm3")
    return os.environ.get(var, str(default))


@dataclass
class Render:
    """One `helm template` result."""

    returncode: int
    stdout: str
    stderr: str
    docs: list[dict[str, Any]] = field(default_factory=list)

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.docs if d.get("kind") == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.kinds(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]


RUN_NAME = re.compile(r"--run_name=r[0-9]+-[0-9]{8}-[0-9]{6}-[a-z0-9]{4}")


def same_but_run_name(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documents with the run name (new on every render: its revision, UTC time, random) masked."""
    return json.loads(RUN_NAME.sub("--run_name=<run>", json.dumps(docs)))


def load_docs(text: str) -> list[dict[str, Any]]:
    """All YAML documents, nulls kept (a bare `key:` loads as None and is caught by validation)."""
    return [d for d in yaml.safe_load_all(text) if d is not None]


def helm_template(
    values_files: list[Path] | tuple[Path, ...] = (),
    set_values: dict[str, object] | None = None,
    helm: str = "HELM",
    chart: Path = CHART,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    extra_args: tuple[str, ...] = (),
) -> Render:
    cmd = [helm_bin(helm), "template", release, str(chart), "--namespace", namespace, *extra_args]
    for f in values_files:
        cmd += ["-f", str(f)]
    for key, value in (set_values or {}).items():
        if isinstance(value, str):
            cmd += ["--set-string", f"{key}={value}"]
        else:
            cmd += ["--set-json", f"{key}={json.dumps(value)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)
    docs = load_docs(proc.stdout) if proc.returncode == 0 else []
    return Render(proc.returncode, proc.stdout, proc.stderr, docs)


def values_files() -> list[Path]:
    """Every example values file and every chart-testing ci/ values file."""
    return sorted(VALUES_DIR.glob("*.yaml")) + sorted(CI_VALUES_DIR.glob("*.yaml"))


def pod_templates(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(role, pod template) pairs of a RayCluster or a RayJob with an inline cluster spec."""
    spec = doc["spec"]
    cluster = spec if doc["kind"] == "RayCluster" else spec.get("rayClusterSpec")
    if not cluster:
        return []
    out = [("head", cluster["headGroupSpec"]["template"])]
    out += [(f"worker:{g['groupName']}", g["template"]) for g in cluster["workerGroupSpecs"]]
    return out
