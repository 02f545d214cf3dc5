"""The repository foundation: pinned tools and the single source of versions."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HELM_SHA = {
    "HELM": ("v4.1.4", "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"),
    "HELM3": ("v3.17.1", "19e2e1ab5fe32cd0510882f9bb97c9dd69fc73026b631ecbd12a981008639aff"),
}


def test_installed_helm_binaries_are_the_pinned_ones() -> None:
    for var, (version, sha) in HELM_SHA.items():
        path = Path(os.environ.get(var, ROOT / ".tools" / "bin" / var.lower()))
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, path
        out = subprocess.run([str(path), "version", "--short"], capture_output=True, text=True, check=True)
        assert out.stdout.startswith(version), out.stdout


def test_installed_runtime_matches_trainer_pins() -> None:
    """The venv the tests run in holds exactly the trainer's pinned runtime (torch: CPU build)."""
    from importlib.metadata import version

    for line in (ROOT / "trainer" / "requirements.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line)
        if not m or m.group(1) == "torch":
            continue
        assert version(m.group(1)) == m.group(3), m.group(1)
