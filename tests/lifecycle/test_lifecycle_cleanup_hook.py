"""The cleanup hook's program (files/cleanup/delete_rayjob.py) against the real API server, with a real
token of the hook's own ServiceAccount, bound by the Role the chart renders (issue #10, failure 2).

What KubeRay does with a deleted RayJob (rayjob_controller.go, Reconcile: a RayJob with a
deletionTimestamp is stopped through the dashboard, StopJob, then its `ray.io/rayjob-finalizer` is
removed) and what the garbage collector does with its cluster (constructRayClusterForRayJob makes
the RayJob the cluster's controller owner) are stood in by cluster_sim.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from cluster_sim import KUBERAY_FINALIZER, Controllers
from helm_render import CHART, CI_VALUES_DIR, helm_template
from kube_api import ApiError, ApiServer, Kube

PROGRAM = CHART / "files" / "cleanup" / "delete_rayjob.py"
OTHER = "other-gemma3-ray"  # another release's RayJob in the same namespace


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    r = helm_template([CI_VALUES_DIR / "default-values.yaml"], release="mine", namespace="cleanup")
    assert r.returncode == 0, r.stderr
    hooks = {d["kind"]: d for d in r.docs if d["metadata"].get("annotations", {}).get("helm.sh/hook", "").endswith("pre-delete")}
    return {"rayjob": r.one("RayJob"), **hooks}


@pytest.fixture(scope="module")
def cleanup_ns(apiserver: ApiServer, rendered: dict[str, Any]) -> str:
    """A namespace holding the chart's cleanup ServiceAccount, Role and RoleBinding, as Helm creates them."""
    ns = apiserver.namespace("cleanup")
    for kind, path in (("ServiceAccount", f"/api/v1/namespaces/{ns}/serviceaccounts"),
                       ("Role", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
                       ("RoleBinding", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings")):
        apiserver.admin.create(path, rendered[kind])
    return ns


def rayjobs(ns: str) -> str:
    return f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"


def create_rayjob(api: ApiServer, rendered: dict[str, Any], ns: str, name: str | None = None, finalizers: list[str] | None = None) -> None:
    job = {**rendered["rayjob"], "metadata": {"name": name or rendered["rayjob"]["metadata"]["name"], "finalizers": finalizers or []}}
    api.admin.create(rayjobs(ns), job)


def run_program(api: ApiServer, rendered: dict[str, Any], ns: str, tmp: Path, **env: str) -> subprocess.CompletedProcess:
    """The hook pod's container, run here: its command and env, the SA token mounted as in the pod."""
    pod = rendered["Job"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sa_dir = tmp / "serviceaccount"
    sa_dir.mkdir(exist_ok=True)
    (sa_dir / "token").write_text(api.token_for(ns, pod["serviceAccountName"]))
    (sa_dir / "ca.crt").write_bytes(Path(api.admin.ca_file).read_bytes())
    url = urlparse(api.server)
    full_env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": url.hostname or "", "KUBERNETES_SERVICE_PORT": str(url.port),
                "SERVICEACCOUNT_DIR": str(sa_dir), **{e["name"]: e["value"] for e in container["env"]}, "NAMESPACE": ns, **env}
    assert container["command"][:2] == ["python", "-c"] and container["command"][2] == PROGRAM.read_text()
    return subprocess.run([sys.executable, "-c", container["command"][2]], env=full_env, capture_output=True, text=True, timeout=120)


def scoped(api: ApiServer, ns: str, rendered: dict[str, Any]) -> Kube:
    sa = rendered["Job"]["spec"]["template"]["spec"]["serviceAccountName"]
    return Kube(api.server, api.admin.ca_file, api.token_for(ns, sa))


def test_deletes_the_rayjob_and_waits_until_kuberay_let_it_go(apiserver: ApiServer, rendered: dict[str, Any], cleanup_ns: str,
                                                              tmp_path: Path) -> None:
    name = rendered["rayjob"]["metadata"]["name"]
    with Controllers(apiserver, cleanup_ns, tmp_path / "sim") as sim:
        create_rayjob(apiserver, rendered, cleanup_ns)
        for _ in range(100):  # KubeRay adopts the job: finalizer, and the ephemeral job's cluster
            clusters = apiserver.admin.items(f"/apis/ray.io/v1/namespaces/{cleanup_ns}/rayclusters")
            if clusters:
                break
            time.sleep(0.1)
        assert clusters and KUBERAY_FINALIZER in apiserver.admin.get(f"{rayjobs(cleanup_ns)}/{name}")["metadata"]["finalizers"]
        proc = run_program(apiserver, rendered, cleanup_ns, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"RayJob {cleanup_ns}/{name}: gone after" in proc.stdout
    assert apiserver.admin.get(f"{rayjobs(cleanup_ns)}/{name}") is None
    assert not apiserver.admin.items(f"/apis/ray.io/v1/namespaces/{cleanup_ns}/rayclusters"), "the job's cluster went first"
    assert len(sim.stopped_jobs) == 1


def test_an_absent_rayjob_is_nothing_to_stop(apiserver: ApiServer, rendered: dict[str, Any], cleanup_ns: str, tmp_path: Path) -> None:
    proc = run_program(apiserver, rendered, cleanup_ns, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "not found; nothing to stop" in proc.stdout


def test_the_token_reaches_only_this_releases_rayjob(apiserver: ApiServer, rendered: dict[str, Any], cleanup_ns: str,
                                                      tmp_path: Path) -> None:
    create_rayjob(apiserver, rendered, cleanup_ns, name=OTHER)
    try:
        kube = scoped(apiserver, cleanup_ns, rendered)
        for method, path in (("DELETE", f"{rayjobs(cleanup_ns)}/{OTHER}"), ("GET", rayjobs(cleanup_ns)),
                             ("GET", f"/api/v1/namespaces/{cleanup_ns}/secrets"),
                             ("DELETE", f"/api/v1/namespaces/{cleanup_ns}/serviceaccounts/default")):
            with pytest.raises(ApiError) as err:
                kube.call(method, path)
            assert err.value.code == 403, (method, path)
        proc = run_program(apiserver, rendered, cleanup_ns, tmp_path, RAYJOB_NAME=OTHER)
        assert proc.returncode == 1 and "HTTP 403" in proc.stderr, (proc.stdout, proc.stderr)
        assert apiserver.admin.get(f"{rayjobs(cleanup_ns)}/{OTHER}") is not None
    finally:
        apiserver.admin.delete(f"{rayjobs(cleanup_ns)}/{OTHER}")


def test_a_rayjob_that_never_goes_fails_the_hook_naming_its_finalizer(apiserver: ApiServer, rendered: dict[str, Any],
                                                                      cleanup_ns: str, tmp_path: Path) -> None:
    """No KubeRay operator: the finalizer stays, so the hook fails (and helm stops) instead of
    reporting success while training may still hold GPUs."""
    name = rendered["rayjob"]["metadata"]["name"]
    create_rayjob(apiserver, rendered, cleanup_ns, finalizers=[KUBERAY_FINALIZER])
    try:
        proc = run_program(apiserver, rendered, cleanup_ns, tmp_path, TIMEOUT_SECONDS="2")
        assert proc.returncode == 1, proc.stdout
        assert "still present after 2 s" in proc.stderr and KUBERAY_FINALIZER in proc.stderr, proc.stderr
    finally:
        apiserver.admin.merge_patch(f"{rayjobs(cleanup_ns)}/{name}", {"metadata": {"finalizers": None}})
