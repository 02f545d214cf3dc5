"""The released versions (#47 item 3): charts/releases/NAME-VERSION.tgz is what a registry holds for VERSION, made
by `helm package` of the chart as it was released (0.1.0: the chart at the commit tagged `gemma3-ray-chart-0.1.0`,
which holds both). Its content digest — chart_digest's rule applied to the unpacked archive — is the one its
CHANGELOG.md entry records, and that entry can never be rewritten (`--rewrite` is refused for it), so a changed
chart is a new version.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from gemma3_ray.config import chart_digest, chart_version
from helm_render import CHART

from scripts import chart_digest as script

RELEASES = CHART.parent / "releases"
MAX_ARTIFACT_BYTES = 1_000_000  # the chart and its trainer: a few hundred kB at most, never a model or a cache


def test_0_1_0_is_released_and_its_artifact_is_what_its_entry_records() -> None:
    released = chart_digest.released(CHART)
    assert "0.1.0" in released, f"charts/releases/gemma3-ray-0.1.0.tgz is missing: {sorted(released)}"
    recorded = chart_digest.recorded(CHART)
    for version, tgz in released.items():
        assert tgz.stat().st_size < MAX_ARTIFACT_BYTES, (tgz, tgz.stat().st_size)
        assert recorded.get(version), f"released {version} has no CHANGELOG.md entry with a content digest"
        assert chart_digest.archive_digest(tgz) == recorded[version], f"{tgz.name} is not the released {version}"


def test_the_working_chart_is_a_version_after_every_released_one() -> None:
    def key(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in v.split("-")[0].split("+")[0].split("."))
    version = chart_version.read(CHART).version
    assert all(key(version) > key(v) for v in chart_digest.released(CHART)), version


def _with_release(tmp_path: Path) -> Path:
    chart = tmp_path / "charts" / "gemma3-ray"
    shutil.copytree(CHART, chart)
    shutil.copytree(RELEASES, tmp_path / "charts" / "releases")
    return chart


def test_a_released_entry_is_never_rewritten(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0.1.0 released: a changed chart still at 0.1.0 cannot record a new digest for it, not even with --rewrite;
    without the artifact (a version never released) --rewrite does replace it."""
    chart = _with_release(tmp_path)
    log = chart / "CHANGELOG.md"
    (chart / "Chart.yaml").write_text(re.sub(r"^version: .*$", "version: 0.1.0", (chart / "Chart.yaml").read_text(),
                                             flags=re.MULTILINE))
    before = log.read_text()
    (chart / "templates" / "rayjob.yaml").write_text((chart / "templates" / "rayjob.yaml").read_text() + "\n{{- /* x */}}\n")
    assert script.main(["--write", "--rewrite"], chart) == 1
    err = capsys.readouterr().err
    assert "version 0.1.0 is released (releases/gemma3-ray-0.1.0.tgz): its entry never changes, not even with " \
           "--rewrite; bump `version` in Chart.yaml" in err and err.count("\n") == 1, err
    assert log.read_text() == before
    (tmp_path / "charts" / "releases" / "gemma3-ray-0.1.0.tgz").unlink()
    assert script.main(["--write", "--rewrite"], chart) == 0
    assert chart_digest.recorded(chart)["0.1.0"] == chart_digest.content_digest(chart) != chart_digest.recorded(CHART)["0.1.0"]
