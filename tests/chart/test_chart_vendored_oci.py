"""Vendored as a subchart from an OCI registry (#47 item 4): an umbrella chart whose Chart.yaml depends on
gemma3-ray at `oci://…` under an alias gets it with `helm dependency update` and renders with the values under
that alias — the chart as `gemma3-ray release` pushed it to a real registry (distribution, the e2e's part, on a
free local port; skipped, naming the command that builds it, when the part is not cached). Both Helm majors.
(test_chart_vendored.py covers a copied folder.)"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gemma3_ray.kube import chart_publish
from helm_render import CHART, CI_VALUES_DIR, helm_bin, load_docs

from tests.oci_registry import running, skip_unless_built

ALIAS = "finetune"


def _helm(helm: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_bin(helm), *args], capture_output=True, text=True, timeout=180, cwd=cwd)


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_an_umbrella_chart_depends_on_it_from_the_registry_and_renders_its_alias(
        helm: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    skip_unless_built()
    monkeypatch.setenv("HELM_BIN", helm_bin(helm))
    with running(tmp_path / "registry") as host:
        pushed = chart_publish.run(chart_publish.Flags(registry=f"oci://{host}/charts", chart=str(CHART),
                                                       plain_http=True, apply=True), lambda _line: None)
        assert pushed is not None
        version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
        umbrella = tmp_path / "platform"
        umbrella.mkdir()
        (umbrella / "Chart.yaml").write_text(yaml.safe_dump({
            "apiVersion": "v2", "name": "platform", "version": "1.0.0",
            "dependencies": [{"name": "gemma3-ray", "version": version, "repository": f"oci://{host}/charts",
                              "alias": ALIAS}]}))
        updated = _helm(helm, "dependency", "update", str(umbrella), "--plain-http")
        assert updated.returncode == 0, updated.stderr
    # The registry is stopped: what renders below came through `helm dependency update`, nothing else.
    (tgz,) = (umbrella / "charts").glob("gemma3-ray-*.tgz")
    assert tgz.name == f"gemma3-ray-{version}.tgz"
    lock = yaml.safe_load((umbrella / "Chart.lock").read_text())
    assert lock["dependencies"][0]["repository"] == f"oci://{host}/charts"
    values: dict[str, Any] = yaml.safe_load((CI_VALUES_DIR / "default-values.yaml").read_text())
    values.setdefault("workers", {})["replicas"] = 3
    (tmp_path / "values.yaml").write_text(yaml.safe_dump({ALIAS: values}))
    rendered = _helm(helm, "template", "team-a", str(umbrella), "-f", str(tmp_path / "values.yaml"))
    assert rendered.returncode == 0, rendered.stderr
    docs = load_docs(rendered.stdout)
    (job,) = [d for d in docs if d["kind"] == "RayJob"]
    spec = job["spec"].get("rayClusterSpec") or next(d for d in docs if d["kind"] == "RayCluster")["spec"]
    assert spec["workerGroupSpecs"][0]["replicas"] == 3  # a value under the alias reached the subchart
    assert job["metadata"]["labels"]["helm.sh/chart"] == f"{ALIAS}-{version}"  # Helm names an aliased chart by its alias
    # --set reaches it under the alias too.
    by_set = _helm(helm, "template", "team-a", str(umbrella), "-f", str(tmp_path / "values.yaml"),
                  "--set", f"{ALIAS}.workers.replicas=2")
    assert by_set.returncode == 0, by_set.stderr
    (job2,) = [d for d in load_docs(by_set.stdout) if d["kind"] == "RayJob"]
    spec2 = job2["spec"].get("rayClusterSpec") or next(
        d for d in load_docs(by_set.stdout) if d["kind"] == "RayCluster")["spec"]
    assert spec2["workerGroupSpecs"][0]["replicas"] == 2
