"""`helm plugin install ./plugin` into temporary Helm homes, with Helm 4 and Helm 3, then the plugin's
commands through Helm itself."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from gemma3_ray.utils import names

from tests.plugin.conftest import ROOT, GcloudHome

PLUGIN = ROOT / "plugin"
HELMS = {"helm4": os.environ.get("HELM", str(ROOT / ".tools/bin/helm")),
         "helm3": os.environ.get("HELM3", str(ROOT / ".tools/bin/helm3"))}
TIMEOUT_S = 120


def helm_env(home: Path, gcloud: GcloudHome, **extra: str) -> dict[str, str]:
    env = gcloud.env(**extra)
    for var in ("HELM_PLUGINS", "HELM_NAMESPACE", "HELM_KUBECONTEXT", "GEMMA3_RAY_PYTHON"):
        env.pop(var, None)
    # Helm 4 installs into $HELM_DATA_HOME/plugins whatever HELM_PLUGINS says, so keep them equal.
    env.update(HELM_DATA_HOME=str(home / "data"), HELM_CONFIG_HOME=str(home / "config"),
               HELM_CACHE_HOME=str(home / "cache"), HELM_PLUGINS=str(home / "data" / "plugins"),
               KUBECONFIG=str(home / "no-kubeconfig"))
    return env


def run(helm: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("major", list(HELMS))
def test_plugin_installs_and_runs_through_helm(major: str, tmp_path: Path, gcloud_home: GcloudHome) -> None:
    helm = HELMS[major]
    gcloud_home.write("default", {"core": {"project": "acme-ml-1"}, "compute": {"region": "us-central1"}},
                      activate=True)
    env = helm_env(tmp_path / "helm-home", gcloud_home)
    installed = run(helm, env, "plugin", "install", str(PLUGIN))
    assert installed.returncode == 0, installed.stderr
    listed = run(helm, env, "plugin", "list")
    assert "gemma3-ray" in listed.stdout and "0.1.0" in listed.stdout

    helped = run(helm, env, "gemma3-ray", "--help")
    assert helped.returncode == 0, helped.stderr
    for command in ("values", "prereqs", "doctor", "up", "status", "logs", "down", "cluster", "image"):
        assert command in helped.stdout

    # the cluster plan through Helm, offline (no Google credentials in this environment)
    env_offline = {**env, "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-credentials.json")}
    planned = run(helm, env_offline, "gemma3-ray", "cluster", "create")
    assert planned.returncode == 0, planned.stderr
    assert "+ create Autopilot cluster gemma3-ray in us-central1 (project acme-ml-1)" in planned.stdout

    # Helm's own -n reaches the plugin as HELM_NAMESPACE
    out = run(helm, env, "-n", "team-ml", "gemma3-ray", "values", "--machine-type", "a4-highgpu-8g")
    assert out.returncode == 0, out.stderr
    v = yaml.safe_load(out.stdout)
    gsa = names.release_gsa_id("team-ml", "gemma3-ray")
    assert v["serviceAccount"]["gcpServiceAccount"] == f"{gsa}@acme-ml-1.iam.gserviceaccount.com"
    assert (v["workers"]["accelerator"], v["workers"]["gpusPerNode"]) == ("nvidia-b200", 8)
    assert "namespace team-ml" in out.stdout and "--namespace" not in out.stdout

    bad = run(helm, env, "gemma3-ray", "values", "--bucket", "Not A Bucket")
    assert bad.returncode == 2 and "Invalid bucket name" in bad.stderr


def test_launcher_finds_python_or_says_how(tmp_path: Path, gcloud_home: GcloudHome) -> None:
    """A plugin copied away from the repository has no ../.venv: GEMMA3_RAY_PYTHON points at one, and
    without it the launcher explains what to do (unless a python3 on PATH has the dependencies)."""
    copy = tmp_path / "gemma3-ray"
    shutil.copytree(PLUGIN, copy, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    helm = HELMS["helm4"]
    env = helm_env(tmp_path / "helm-home", gcloud_home)
    assert run(helm, env, "plugin", "install", str(copy)).returncode == 0
    ok = run(helm, {**env, "GEMMA3_RAY_PYTHON": str(ROOT / ".venv/bin/python")}, "gemma3-ray", "--version")
    assert ok.returncode == 0 and "gemma3-ray 0.1.0" in ok.stdout, ok.stderr
    bare_path = f"{tmp_path / 'no-python'}:/usr/bin:/bin"
    has_deps = subprocess.run(["python3", "-c", "import ruamel.yaml, google.cloud.storage, kubernetes"],
                              env={"PATH": bare_path}, capture_output=True).returncode == 0
    missing = run(helm, {**env, "PATH": bare_path}, "gemma3-ray", "--version")
    if has_deps:
        assert missing.returncode == 0
    else:
        assert missing.returncode != 0 and "GEMMA3_RAY_PYTHON" in missing.stderr


@pytest.mark.parametrize("major", list(HELMS))
def test_plugin_installs_as_gemma3_ray_wherever_helm_plugins_points(major: str, tmp_path: Path,
                                                                   gcloud_home: GcloudHome) -> None:
    """Issue #12 (8): with HELM_PLUGINS set away from $HELM_DATA_HOME/plugins, Helm 4's `plugin install
    ./plugin` links the folder as `plugin` into $HELM_DATA_HOME/plugins (LocalInstaller.Path in helm's
    internal/plugin/installer/local_installer.go), says "Installed", and `helm gemma3-ray` is unknown.
    scripts/install-helm-plugin.sh links it as `gemma3-ray` where Helm loads plugins, for both majors."""
    helm = HELMS[major]
    env = helm_env(tmp_path / "helm-home", gcloud_home)
    env["HELM_PLUGINS"] = str(tmp_path / "team-plugins")
    plain = run(helm, env, "plugin", "install", str(PLUGIN))
    assert plain.returncode == 0, plain.stderr
    if major == "helm4":
        assert (tmp_path / "helm-home" / "data" / "plugins" / "plugin").is_symlink()
        assert run(helm, env, "gemma3-ray", "--version").returncode != 0  # the defect the script fixes
    script = subprocess.run([str(ROOT / "scripts" / "install-helm-plugin.sh")], env={**env, "HELM": helm},
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert script.returncode == 0, script.stderr
    assert (tmp_path / "team-plugins" / "gemma3-ray").resolve() == PLUGIN.resolve()
    listed = run(helm, env, "plugin", "list")
    assert [ln.split()[0] for ln in listed.stdout.splitlines()[1:]] == ["gemma3-ray"], listed.stdout
    ok = run(helm, env, "gemma3-ray", "--version")
    assert ok.returncode == 0 and "gemma3-ray 0.1.0" in ok.stdout, ok.stderr
    again = subprocess.run([str(ROOT / "scripts" / "install-helm-plugin.sh")], env={**env, "HELM": helm},
                           capture_output=True, text=True, timeout=TIMEOUT_S)
    assert again.returncode == 0, again.stderr  # idempotent
