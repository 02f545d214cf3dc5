"""The chart-testing lint equivalent, offline: helm lint --strict with Helm 4 and Helm 3 for every
values file, yamllint with chart-testing's rules, yamale with chart-testing's Chart.yaml schema."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yamale
import yaml
from helm_render import CHART, ROOT, helm_bin, values_files
from yamllint import linter
from yamllint.config import YamlLintConfig

PARALLEL_HELM = 4
LINT_TIMEOUT_S = 120


def helm_lint(helm: str, values: Path) -> subprocess.CompletedProcess[str]:
    cmd = [helm_bin(helm), "lint", "--strict", str(CHART), "-f", str(values)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=LINT_TIMEOUT_S, check=False)


def test_helm_lint_strict_every_values_file_both_helms() -> None:
    jobs = [(helm, f) for f in values_files() for helm in ("HELM", "HELM3")]
    assert len(jobs) >= 2 * 10
    with ThreadPoolExecutor(PARALLEL_HELM) as pool:
        results = list(pool.map(lambda j: helm_lint(*j), jobs))
    failed = [f"{h} {f.name}: {r.stdout}{r.stderr}" for (h, f), r in zip(jobs, results, strict=True) if r.returncode]
    assert not failed, "\n".join(failed)
    for r in results:
        assert "[WARNING]" not in r.stdout and "[ERROR]" not in r.stdout, r.stdout


def test_helm_lint_strict_fails_on_bad_values(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("storage: {bucket: gemma3-ray-ci}\nworkers: {gpusPerNode: 3}\n")
    for helm in ("HELM", "HELM3"):
        assert helm_lint(helm, bad).returncode != 0


def yaml_files_to_lint() -> list[Path]:
    return [
        CHART / "Chart.yaml",
        CHART / "values.yaml",
        CHART / "checkov-skips.yaml",
        CHART / "values-moved.yaml",
        *values_files(),
        *sorted((Path(__file__).parent / "bad-values").glob("*.yaml")),
        ROOT / "ct.yaml",
        ROOT / "lintconf.yaml",
        ROOT / ".yamllint.yaml",
    ]


@pytest.mark.parametrize("path", yaml_files_to_lint(), ids=lambda p: str(p.relative_to(ROOT)))
def test_yamllint_with_chart_testing_rules(path: Path) -> None:
    conf = YamlLintConfig(file=str(ROOT / ".yamllint.yaml"))
    assert not conf.is_file_ignored(str(path.relative_to(ROOT)))
    problems = [p for p in linter.run(path.read_text(), conf, str(path)) if p.level == "error"]
    assert not problems, [f"{path.name}:{p.line}:{p.column} {p.message}" for p in problems]


def test_yamllint_catches_a_problem() -> None:
    conf = YamlLintConfig(file=str(ROOT / "lintconf.yaml"))
    assert [p for p in linter.run("a: 1\na: 2\n", conf) if p.level == "error"]


def test_chart_yaml_matches_chart_testing_schema() -> None:
    schema = yamale.make_schema(str(ROOT / "chart_schema.yaml"))
    yamale.validate(schema, yamale.make_data(str(CHART / "Chart.yaml")), strict=True)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"
    with pytest.raises(yamale.YamaleError):
        yamale.validate(schema, [({"name": "x", "apiVersion": "v2"}, "Chart.yaml")], strict=True)
