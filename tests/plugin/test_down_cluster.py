"""`down` on a real API server (../shared/kube-apiserver): it deletes the release's RayJobs that Helm
does not manage (the hook RayJob of an earlier chart version, which no `helm uninstall` deletes),
uninstalls the release with real Helm, then waits until no RayJob of the release is left — and says
which one KubeRay's finalizer holds when one stays; the same release name in another namespace is
untouched; a second `down` reports "nothing to remove" and exits 0; a step the cluster forbids is an
error.

What KubeRay does after the RayJob is deleted (stop the job, delete the RayCluster it created) is
its controller's: ray-operator/controllers/ray/rayjob_controller.go, RayJobReconciler.Reconcile
(the deletion branch runs the finalizer that stops the job and deletes the cluster). No operator
runs here; the tests assert what the plugin asks of the API server."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients

from tests.plugin.conftest import PROJECT, REGION, ROOT
from tests.plugin.kube_apiserver import kubectl, token_kubeconfig

HELM = os.environ.get("HELM", str(ROOT / ".tools/bin/helm"))
RELEASE = "gemma3-ray"


def _rayjob(ns: str, name: str) -> str:
    return json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/instance": RELEASE},
                     "annotations": {"helm.sh/hook": "post-install,post-upgrade"}},
        "spec": {"entrypoint": "python vision_train.py", "rayClusterSpec": {"headGroupSpec": {
            "rayStartParams": {}, "template": {"spec": {"containers": [
                {"name": "ray-head", "image": "rayproject/ray:2.9.0"}]}}}}},
    })


@pytest.fixture
def releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A one-ConfigMap chart for real Helm releases named `gemma3-ray` (each test installs its own)."""
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: tiny\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-trainer\ndata: {a: b}\n")
    monkeypatch.setenv("HELM", HELM)
    monkeypatch.delenv("HELM_BIN", raising=False)
    for var in ("HELM_DATA_HOME", "HELM_CONFIG_HOME", "HELM_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "helm"))
    return chart


def _install(kubeconfig: Path, chart: Path, ns: str) -> None:
    kubectl(kubeconfig, "create", "namespace", ns)
    out = subprocess.run([HELM, "install", RELEASE, str(chart), "-n", ns, "--kubeconfig", str(kubeconfig)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kubectl(kubeconfig, "apply", "-f", "-", stdin=_rayjob(ns, f"{RELEASE}-abcde"))


def _down(kubeconfig: Path, ns: str, *extra: str) -> int:
    acts = [] if "--dry-run" in extra else ["--apply"]  # down plans unless --apply
    return cli.main(["down", *acts, "--project", PROJECT, "--region", REGION, "-n", ns, "--kubeconfig", str(kubeconfig),
                     *extra], Clients(project=PROJECT))


def _state(kubeconfig: Path, ns: str) -> tuple[list[str], list[str]]:
    jobs = json.loads(kubectl(kubeconfig, "-n", ns, "get", "rayjobs", "-o", "json"))["items"]
    rel = subprocess.run([HELM, "list", "-q", "-n", ns, "--kubeconfig", str(kubeconfig)], capture_output=True,
                         text=True, timeout=60).stdout.split()
    return [j["metadata"]["name"] for j in jobs], rel


def test_down_deletes_the_rayjob_and_the_release_and_is_idempotent(
    kube_apiserver: Path, releases: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = "down-a", "down-b"
    _install(kube_apiserver, releases, a)
    _install(kube_apiserver, releases, b)
    assert _state(kube_apiserver, a) == ([f"{RELEASE}-abcde"], [RELEASE])
    capsys.readouterr()

    assert _down(kube_apiserver, a, "--dry-run") == 0
    assert "would remove RayJob" in capsys.readouterr().out
    assert _state(kube_apiserver, a) == ([f"{RELEASE}-abcde"], [RELEASE])

    assert _down(kube_apiserver, a) == 0
    out = capsys.readouterr().out
    assert f"removed RayJob {a}/{RELEASE}-abcde" in out
    assert f"removed Helm release {RELEASE} in namespace {a}" in out
    assert "keep Google Cloud prerequisites" in out and "Done: removed 3" in out
    assert _state(kube_apiserver, a) == ([], [])
    assert _state(kube_apiserver, b) == ([f"{RELEASE}-abcde"], [RELEASE])  # the other namespace's release

    assert _down(kube_apiserver, a) == 0
    out = capsys.readouterr().out
    assert "Nothing to remove" in out and "removed" not in out and "FAILED" not in out
    assert f"nothing to remove: Helm release {RELEASE} in namespace {a}" in out


def test_a_step_the_cluster_forbids_is_an_error(kube_apiserver: Path, releases: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With a real ServiceAccount token that may read but not delete RayJobs: `down` fails on the
    RayJob, says so, exits 1 and does not uninstall (nothing reports success)."""
    ns = "down-rbac"
    _install(kube_apiserver, releases, ns)
    kubectl(kube_apiserver, "-n", ns, "create", "serviceaccount", "reader")
    kubectl(kube_apiserver, "-n", ns, "create", "role", "reader", "--verb=get,list",
            "--resource=rayjobs.ray.io,secrets")
    kubectl(kube_apiserver, "-n", ns, "create", "rolebinding", "reader", "--role=reader",
            f"--serviceaccount={ns}:reader")
    token = kubectl(kube_apiserver, "-n", ns, "create", "token", "reader").strip()
    limited = token_kubeconfig(kube_apiserver, token, tmp_path / "reader.kubeconfig", ns)
    capsys.readouterr()

    assert _down(limited, ns) == 1
    captured = capsys.readouterr()
    assert f"FAILED to remove RayJob {ns}/{RELEASE}-abcde" in captured.out
    assert "removed" not in captured.out.replace("FAILED to remove", "") and "Done" not in captured.out
    assert "down stopped after 0 removal(s)" in captured.err and "forbids" in captured.err
    assert token not in captured.out + captured.err
    assert _state(kube_apiserver, ns) == ([f"{RELEASE}-abcde"], [RELEASE])


def test_down_uninstalls_the_chart_and_waits_until_its_rayjobs_are_gone(
    kube_apiserver: Path, releases: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """The chart's RayJob is a release resource: `helm uninstall` deletes it. With KubeRay's finalizer
    on it and no operator to remove it (issue #19, failure 4), `down` never reports success: it names
    the RayJob and the command that clears it; after that command a second `down` finds nothing. The
    earlier chart's hook RayJob (named after the release, labelled with it) is deleted by `down` itself."""
    from gemma3_ray.release import down

    monkeypatch.setattr(down, "GONE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(down, "GONE_POLL_S", 0.5)
    ns = "down-chart"
    kubectl(kube_apiserver, "create", "namespace", ns)
    chart = ROOT / "charts" / "gemma3-ray"
    out = subprocess.run([HELM, "install", RELEASE, str(chart), "-n", ns, "--kubeconfig", str(kube_apiserver),
                          "-f", str(chart / "ci" / "default-values.yaml")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=_rayjob(ns, RELEASE))  # the earlier chart's hook RayJob
    job = f"{RELEASE}-r1"
    kubectl(kube_apiserver, "-n", ns, "patch", "rayjob", job, "--type=merge", "-p",
            '{"metadata":{"finalizers":["ray.io/rayjob-finalizer"]}}')  # what KubeRay adds; no operator removes it
    assert sorted(_state(kube_apiserver, ns)[0]) == [RELEASE, job]
    capsys.readouterr()

    assert _down(kube_apiserver, ns) == 1
    captured = capsys.readouterr()
    assert f"removed RayJob {ns}/{RELEASE} (not managed by Helm" in captured.out
    assert f"removed Helm release {RELEASE} in namespace {ns}" in captured.out
    assert "Done" not in captured.out and "\n" not in captured.err.strip()
    fix = f"""kubectl -n {ns} patch rayjob {job} --type=merge -p '{{"metadata":{{"finalizers":null}}}}'"""
    assert f"RayJob {ns}/{job} is still there" in captured.err and "KubeRay's finalizer" in captured.err
    assert fix in captured.err, captured.err
    assert _state(kube_apiserver, ns) == ([job], [])

    kubectl(kube_apiserver, *fix.split(" ", 1)[1].replace("'", "").split(" "))
    assert _down(kube_apiserver, ns) == 0
    assert "Nothing to remove" in capsys.readouterr().out
    assert _state(kube_apiserver, ns) == ([], [])
