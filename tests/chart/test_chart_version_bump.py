"""The chart's version is bumped when what it ships changes (#47 item 3): CHANGELOG.md (Keep a Changelog) has an
entry for the chart's `version:` recording the digest of its contents, and the chart's contents have that digest.

What counts (plugin/gemma3_ray/config/chart_digest.py, the one definition, which `gemma3-ray release` checks
too): templates/, values.schema.json, values.yaml, files/ — the trainer — less what .helmignore keeps out of the
package (its README, docs/, caches), and Chart.yaml less its `version` field. README.md, CHANGELOG.md, ci/ and
checkov-skips.yaml do not count (documentation and test fixtures). Refresh the record after a bump with
`python -m scripts.chart_digest --write`.

The check is shown to fail: a planted template change (and a trainer change) in a tmp copy of the chart is
refused with the one sentence, a README change is not, and a bumped version with its entry passes again.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from gemma3_ray.config import chart_digest, chart_version
from helm_render import CHART

from scripts import chart_digest as script

BUMP = "bump `version` in Chart.yaml, add a CHANGELOG.md entry for it and run `python -m scripts.chart_digest --write`"


def _copy(tmp_path: Path) -> Path:
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart, symlinks=False)
    return chart


def test_the_chart_has_the_digest_its_version_records() -> None:
    version = chart_version.read(CHART).version
    recorded = chart_digest.recorded(CHART)
    assert version in recorded, f"CHANGELOG.md has no entry for version {version}: add one and run " \
                                "`python -m scripts.chart_digest --write`"
    assert recorded[version] == chart_digest.content_digest(CHART), (
        f"The chart's contents changed since version {version} was recorded: {BUMP}.")


def test_the_changelog_keeps_a_changelog() -> None:
    text = (CHART / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n") and "keepachangelog.com" in text
    heads = re.findall(r"^## \[([^\]]+)\](.*)$", text, re.MULTILINE)
    assert heads[0] == ("Unreleased", "")
    for version, rest in heads[1:]:
        assert chart_version.SEMVER.fullmatch(version) and re.fullmatch(r" - \d{4}-\d{2}-\d{2}", rest), (version, rest)
    versions = [v for v, _ in heads[1:]]
    assert versions == sorted(versions, key=lambda v: tuple(int(x) for x in v.split("-")[0].split(".")), reverse=True)
    assert all(d for d in chart_digest.recorded(CHART).values() if d is not None)
    assert all(chart_digest.recorded(CHART)[v] for v in versions), "every version records its content digest"


@pytest.mark.parametrize(("changed", "counts"), [
    ("templates/rayjob.yaml", True), ("files/trainer/job/flags.py", True), ("values.schema.json", True),
    ("values.yaml", True), ("README.md", False), ("files/trainer/README.md", False), ("ci/default-values.yaml", False),
])
def test_a_change_without_a_bump_is_refused(changed: str, counts: bool, tmp_path: Path) -> None:
    chart = _copy(tmp_path)
    path = chart / changed
    assert path.is_file(), changed
    path.write_text(path.read_text() + ("\n{{- /* planted */}}\n" if path.suffix == ".yaml" and "templates" in changed
                                        else "\n" if path.suffix == ".json" else "\n# planted\n"))
    if not counts:
        chart_version.check_recorded(chart, chart_version.read(chart).version)
        return
    with pytest.raises(chart_version.ChartVersionError) as refused:
        chart_version.check_recorded(chart, chart_version.read(chart).version)
    assert str(refused.value).endswith(f"changed): {BUMP}.") and "\n" not in str(refused.value)


def test_a_bumped_version_with_its_entry_passes_and_a_released_digest_is_not_rewritten(tmp_path: Path,
                                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    chart = _copy(tmp_path)
    old = chart_version.read(chart).version
    (chart / "templates" / "rayjob.yaml").write_text((chart / "templates" / "rayjob.yaml").read_text() + "\n{{- /* x */}}\n")
    assert script.main(["--write"], chart) == 1  # the old version's record stays: a released version never changes
    assert "bump `version` in Chart.yaml" in capsys.readouterr().err
    (chart / "Chart.yaml").write_text(re.sub(r"^version: .*$", "version: 99.0.0", (chart / "Chart.yaml").read_text(),
                                             flags=re.MULTILINE))
    with pytest.raises(chart_version.ChartVersionError, match=r"CHANGELOG.md has no entry for version 99.0.0: add"):
        chart_version.check_recorded(chart, "99.0.0")
    log = chart / "CHANGELOG.md"
    log.write_text(log.read_text().replace("## [Unreleased]\n", "## [Unreleased]\n\n## [99.0.0] - 2099-01-01\n\n"
                                           "### Changed\n\n- a planted template comment\n"))
    assert script.main(["--write"], chart) == 0 and script.main([], chart) == 0
    chart_version.check_recorded(chart, "99.0.0")
    assert chart_digest.recorded(chart)[old] == chart_digest.recorded(CHART)[old]
