"""The trainer package's files as the job needs them, found by walking the folder to every depth.

What the chart ships: every Python module of the package, at any depth of its folders, and the top's
requirements.txt. A file's ConfigMap key is its path with '.' for '/' (keys cannot hold '/'); the
submitter's volume items put each key back at trainer/<its path>. The walk is the reference the
rendered ConfigMap is held to, so a module the template's patterns miss fails the tests.
"""

from __future__ import annotations

import os
from pathlib import Path

REQUIREMENTS = "requirements.txt"


def trainer_files(folder: Path) -> dict[str, bytes]:
    """Path in the package -> bytes: every *.py at any depth and requirements.txt (no caches, no hidden files)."""
    out: dict[str, bytes] = {}
    for here, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for name in names:
            path = Path(here) / name
            rel = path.relative_to(folder).as_posix()
            if not name.startswith(".") and (name.endswith(".py") or rel == REQUIREMENTS):
                out[rel] = path.read_bytes()
    return dict(sorted(out.items()))


def configmap_key(path: str) -> str:
    """A file's ConfigMap key: its path with '.' for '/' (keys cannot hold '/')."""
    return path.replace("/", ".")


def shipped(configmap: dict, rayjob: dict) -> dict[str, bytes]:
    """What the submitter pod finds under its mount: each ConfigMap key's bytes at its volume item's path."""
    pod = rayjob["spec"]["submitterPodTemplate"]["spec"]
    (volume,) = [v["configMap"] for v in pod["volumes"] if v["name"] == "trainer"]
    items = {i["key"]: i["path"] for i in volume["items"]}
    assert set(items) == set(configmap["data"]), "every ConfigMap key is mounted, and only those"
    return {items[k]: text.encode() for k, text in configmap["data"].items()}
