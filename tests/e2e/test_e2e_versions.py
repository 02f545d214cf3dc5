"""summary.json's part versions (issue #31 (1)) are read from what runs: the Go build info of a binary, the image of a
Deployment; never from our own pins."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from e2e.support import versions


@pytest.mark.skipif(shutil.which("go") is None, reason="needs the go command (make e2e-parts installs it)")
def test_go_build_info_as_go_version_m_reads_it(tmp_path: Path) -> None:
    (tmp_path / "go.mod").write_text("module example.com/e2eprobe\n\ngo 1.21\n")
    (tmp_path / "main.go").write_text("package main\n\nfunc main() {}\n")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0", "GOTOOLCHAIN": "local",
           }
    subprocess.run(["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", "probe", "."], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=300)
    got = versions.go_modules((tmp_path / "probe").read_bytes())
    shown = subprocess.run(["go", "version", "-m", "probe"], cwd=tmp_path, env=env, capture_output=True, text=True,
                           check=True).stdout
    want = {line.split("\t")[2]: line.split("\t")[3] for line in shown.splitlines()
            if line.startswith("\t") and line.split("\t")[1] in ("mod", "dep")}
    assert got == want and got["example.com/e2eprobe"]


def test_no_build_info_is_no_version() -> None:
    assert versions.go_modules(b"\x7fELF not go") == {}


def test_a_deployment_image_names_its_version() -> None:
    deps = [{"metadata": {"namespace": "kube-system", "name": "coredns"},
             "spec": {"template": {"spec": {"containers": [{"image": "registry.k8s.io/coredns/coredns:v1.11.3"}]}}}},
            {"metadata": {"namespace": "ray-system", "name": "kuberay-operator"},
             "spec": {"template": {"spec": {"containers": [{"image": "localhost:5000/kuberay/operator:v1.5.0"}]}}}},
            {"metadata": {"namespace": "kueue-system", "name": "kueue-controller-manager"},
             "spec": {"template": {"spec": {"containers": [
                 {"image": "registry.k8s.io/kueue/kueue:v0.17.0@sha256:" + "0" * 64}]}}}}]
    assert versions.image_tag(deps, "coredns") == "v1.11.3 (Deployment kube-system/coredns)"
    assert versions.image_tag(deps, "kueue") == "v0.17.0 (Deployment kueue-system/kueue-controller-manager)"
    assert versions.image_tag(deps, "kuberay/operator") == "v1.5.0 (Deployment ray-system/kuberay-operator)"
    assert versions.image_tag(deps, "ray-operator") == ""
