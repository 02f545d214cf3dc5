"""The `release: upgrade from the previous version` stage's choice of what to upgrade from: the newest released
artifact by version (not by name: 0.10.0 after 0.9.0), and none is a failure naming the folder, never a pass. The
stage itself needs the local cluster and its registry (`make e2e ARGS="--only release"`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e.stages import release
from e2e.support.errors import StageError


def test_the_newest_released_version_is_the_one_upgraded_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for v in ("0.1.0", "0.10.0", "0.9.0"):
        (tmp_path / f"gemma3-ray-{v}.tgz").write_bytes(b"x")
    monkeypatch.setattr(release, "RELEASES", tmp_path)
    assert release._previous().name == "gemma3-ray-0.10.0.tgz"


def test_no_released_chart_is_a_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release, "RELEASES", tmp_path)
    with pytest.raises(StageError, match="no released chart in"):
        release._previous()


def test_the_repository_holds_a_released_version_to_upgrade_from() -> None:
    assert release._previous().name == "gemma3-ray-0.1.0.tgz"
