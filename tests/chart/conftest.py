"""Fixtures for the chart tests: every values file rendered once per session, in parallel."""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from helm_render import Render, helm_template, values_files  # noqa: E402

PARALLEL_HELM = 4


@pytest.fixture(scope="session")
def renders() -> dict[str, Render]:
    """Helm 4 render of every values/ and ci/ file, keyed by file name."""
    files = values_files()
    with ThreadPoolExecutor(PARALLEL_HELM) as pool:
        results = list(pool.map(lambda f: helm_template([f]), files))
    out = {f.name: r for f, r in zip(files, results, strict=True)}
    failed = {name: r.stderr for name, r in out.items() if r.returncode}
    assert not failed, failed
    return out


@pytest.fixture(scope="session")
def render() -> Callable[..., Render]:
    """helm_template with a per-session cache keyed by its arguments."""
    cache: dict[tuple, Render] = {}

    def _render(*files: Path, sets: dict[str, object] | None = None, helm: str = "HELM") -> Render:
        key = (files, helm, tuple(sorted((k, repr(v)) for k, v in (sets or {}).items())))
        if key not in cache:
            cache[key] = helm_template(list(files), sets, helm)
        return cache[key]

    return _render
