"""`gemma3-ray values --check FILE --for-chart-version VERSION` (#47 item 3): values files written for the previous
chart version, checked against this one. The table of moved keys is data (charts/gemma3-ray/values-moved.yaml),
its CHANGELOG.md "Values moved" sections say the same, the 0.1.0 values files (values/*.yaml and the ci/ values
inside the released 0.1.0 artifact) validate against this chart, and a moved key planted in a copy of the chart's
table is refused in one sentence naming the key and its replacement, before the schema is read."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml
from gemma3_ray import cli
from gemma3_ray.config import chart_version

from tests.plugin.conftest import ROOT

CHART = ROOT / "charts" / "gemma3-ray"
RELEASED = ROOT / "charts" / "releases" / "gemma3-ray-0.1.0.tgz"


def _check(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        rc = cli.main(["values", *argv])
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    return rc, out.out, out.err


def _released_ci_values(dest: Path) -> list[Path]:
    with tarfile.open(RELEASED) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and re.fullmatch(r"gemma3-ray/ci/[^/]+\.yaml", m.name)]
        tar.extractall(dest, members=members, filter="data")
    return sorted((dest / "gemma3-ray" / "ci").glob("*.yaml"))


def test_the_0_1_0_values_files_validate_against_this_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((ROOT / "values").glob("*.yaml")) + _released_ci_values(tmp_path)
    assert len(files) > 10, files
    argv = [a for f in files for a in ("--check", str(f))] + ["--for-chart-version", "0.1.0"]
    rc, out, err = _check(argv, capsys)
    version = chart_version.read(CHART).version
    assert (rc, err) == (0, ""), err
    assert out == f"{len(files)} values file(s) (written for 0.1.0) valid for chart {version}: no moved key set, " \
                  "the schema holds.\n"


def test_every_version_has_its_row_and_the_changelog_says_the_same() -> None:
    table = yaml.safe_load((CHART / "values-moved.yaml").read_text())["versions"]
    text = (CHART / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## \[(\d[^\]]*)\]", text, re.MULTILINE)
    assert sorted(table) == sorted(versions)
    for version in versions:
        entry = text.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
        moved = entry.split("### Values moved", 1)[1]
        if not table[version]:
            assert moved.strip().startswith("- None"), version
        for move in table[version]:
            assert f"`{move['key']}`" in moved and (move["replacement"] is None or f"`{move['replacement']}`" in moved)


@pytest.fixture
def moved_chart(tmp_path: Path) -> Path:
    """A copy of the chart whose table says this version moved `training.learning_rate` to `optim.lr` and removed
    `head.rayStartParams` (planted: the real chart moved none)."""
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart)
    version = chart_version.read(chart).version
    (chart / "values-moved.yaml").write_text(yaml.safe_dump({"versions": {version: [
        {"key": "training.learning_rate", "replacement": "optim.lr"},
        {"key": "head.rayStartParams", "replacement": None, "note": "the chart sets them: delete the key"}],
        "0.1.0": []}}))
    return chart


def test_a_moved_key_is_refused_naming_it_and_its_replacement(moved_chart: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    version = chart_version.read(moved_chart).version
    old = tmp_path / "old.yaml"
    old.write_text("training:\n  learning_rate: 0.0001\n")
    rc, out, err = _check(["--check", str(old), "--for-chart-version", "0.1.0", "--chart", str(moved_chart)], capsys)
    assert (rc, out) == (2, "")
    assert err == f"gemma3-ray: error: values file '{old}' sets `training.learning_rate`, which chart {version} moved " \
                  "to `optim.lr`: rename the key to `optim.lr`.\n"
    removed = tmp_path / "removed.yaml"
    removed.write_text("head:\n  rayStartParams: {num-cpus: '0'}\n")
    rc, _, err = _check(["--check", str(removed), "--chart", str(moved_chart)], capsys)
    assert rc == 2 and err.endswith(f"sets `head.rayStartParams`, which chart {version} removed: the chart sets them: "
                                    "delete the key.\n"), err
    # written for the version that moved it: the key is not refused as moved (the schema decides)
    rc, _, err = _check(["--check", str(old), "--for-chart-version", version, "--chart", str(moved_chart)], capsys)
    assert rc == 0, err


def test_the_schema_is_checked_after_the_moves_and_never_echoes_a_value(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  lrx: 1\n")
    rc, _, err = _check(["--check", str(bad)], capsys)
    assert rc == 2 and "`training` Additional properties are not allowed ('lrx' was unexpected): fix it for chart" in err
    token = tmp_path / "token.yaml"
    token.write_text("hfToken:\n  value: 123456789012\n")
    rc, _, err = _check(["--check", str(token)], capsys)
    assert rc == 2 and "`hfToken.value` must be of type string" in err and "123456789012" not in err, err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "said"), [
    (["--for-chart-version", "one"], "--for-chart-version 'one' is not a chart version: give MAJOR.MINOR.PATCH"),
    (["--for-chart-version", "99.0.0"], "--for-chart-version 99.0.0 is newer than the chart"),
])
def test_a_bad_version_is_one_sentence(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _check(["--check", str(ROOT / "values" / "tutorial.yaml"), *argv], capsys)
    assert rc == 2 and said in err and err.count("\n") == 1, err
