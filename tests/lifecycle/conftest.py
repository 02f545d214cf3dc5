"""One real kube-apiserver for the whole session (fresh directory, stopped at the end)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "chart"))

import kube_api  # noqa: E402


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kube_api.ApiServer]:
    reason = kube_api.cannot_run_reason()
    if reason:
        pytest.skip(f"the real kube-apiserver cannot run here: {reason}")
    directory = tmp_path_factory.mktemp("kube-apiserver")
    server = kube_api.start(directory)
    try:
        yield server
    finally:
        kube_api.stop(directory)
