"""The lifecycle tests' view of the session's one real kube-apiserver (started by tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))

import kube_api  # noqa: E402


@pytest.fixture(scope="session")
def apiserver(kube_apiserver: Path) -> Iterator[kube_api.ApiServer]:
    """The session's API server (tests/conftest.py starts it once), serving the KubeRay 1.7.0 CRDs
    again when these tests are done with it (some switch to 1.4.2)."""
    server = kube_api.connect(kube_apiserver)
    try:
        yield server
    finally:
        server.use_crds("v1.7.0")
