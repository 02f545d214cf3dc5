"""The documented values of the chart: every value path in values.yaml with the comment above it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

# Maps whose keys are the user's (Kubernetes objects, flags): documented as one value.
FREE_FORM = {"resources", "submitterResources", "rayStartParams", "nodeSelector", "affinity", "annotations", "podAnnotations",
             "podSecurityContext", "containerSecurityContext",
             "podLabels", "envVars", "training", "requests", "limits"}
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][\w.-]*):(?P<rest>.*)$")


def documented_values(values_yaml: Path) -> dict[str, str]:
    """{dotted.path: comment} for every value a user sets (free-form maps count as one)."""
    data = yaml.safe_load(values_yaml.read_text())
    lines = values_yaml.read_text().splitlines()
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            comment.append(re.sub(r"^#\s?(-- )?", "", stripped))
            continue
        m = KEY_LINE.match(line)
        if not m:
            if not stripped:
                comment = []
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if any(part in FREE_FORM for _, part in stack):
            comment = []
            continue
        path = ".".join([p for _, p in stack] + [m["key"]])
        value = data
        for part in path.split("."):
            value = value[part]
        if not isinstance(value, dict) or not value or m["key"] in FREE_FORM:
            out[path] = " ".join(comment).strip()
        stack.append((indent, m["key"]))
        comment = []
    return out
