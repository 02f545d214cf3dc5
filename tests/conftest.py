"""Shared test set-up: the repository root on sys.path (for `demo`, `localkit`, `trainer`), offline hubs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The checkout's own plugin package wins over any installed copy (the venv's editable install may
# point at another checkout of this repository).
for path in (ROOT, ROOT / "plugin"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Local test clusters are single-machine: "0" keeps every Ray server on the node address given
# (127.0.0.1). Ray reads it when `ray` is first imported, so it is set here, before any test module.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# One real kube-apiserver per session, shared by tests/plugin and tests/lifecycle (it takes ~15 s to
# start on a 2-core machine). Imported after sys.path holds the checkout.
from tests.plugin.kube_apiserver import kube_apiserver, kueue_crds  # noqa: E402, F401 - session fixtures

# SIGTERM (CI's deadline, `timeout`) stops the run as Ctrl-C does: every fixture's teardown runs first.
pytest_plugins = ["tests.sigterm"]
