"""A queued release's life on a real API server with the KubeRay and Kueue v0.19.2 CRDs: every rendered
RayJob with a queue, and the Workload Kueue would make for it, are accepted server-side; install
leaves the job waiting suspended (no cluster) with its Workload; admission starts its cluster; an
upgrade replaces job and Workload; uninstall leaves nothing, the Workload going through its owner
reference to the RayJob (a Workload without one stays: the reference is what removes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_sim import Controllers
from helm_render import CHART, CI_VALUES_DIR, helm_bin, helm_template, values_files
from kube_api import ApiServer
from kueue_sim import JOB_UID_LABEL, PRIORITY_CLASSES, WORKLOADS, workload_for
from release_state import BASELINE, helm, snapshot

RELEASE = "queued"
FULLNAME = f"{RELEASE}-gemma3-ray"
QUEUED = CI_VALUES_DIR / "kueue-queued-values.yaml"
USER_SECRET = "hf-secret"


@pytest.fixture(scope="module")
def kueue(apiserver: ApiServer, kueue_crds: Path) -> ApiServer:
    """The session's server with the KubeRay and Kueue CRDs, and the admin's WorkloadPriorityClass."""
    apiserver.use_crds("v1.7.0")
    if apiserver.admin.get(f"{PRIORITY_CLASSES}/batch-high") is None:
        apiserver.admin.create(PRIORITY_CLASSES, {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                                                  "metadata": {"name": "batch-high"}, "value": 1000})
    return apiserver


def _queued_jobs(ns: str) -> dict[str, dict[str, Any]]:
    out = {}
    for f in values_files():
        job = helm_template([f], namespace=ns).one("RayJob")
        if (job["metadata"].get("labels") or {}).get("kueue.x-k8s.io/queue-name"):
            out[f.name] = job
    return out


def test_every_queued_rayjob_and_its_workload_are_accepted_server_side(kueue: ApiServer) -> None:
    ns = kueue.namespace("kueue-accept")
    jobs = _queued_jobs(ns)
    assert QUEUED.name in jobs
    for name, job in jobs.items():
        created = kueue.admin.create(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs", job)
        assert created["spec"]["suspend"] is True, name
        wl = kueue.admin.create(WORKLOADS.format(ns=ns), workload_for(created, 1000))
        assert [p["name"] for p in wl["spec"]["podSets"]] == ["head", job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"],
                                                              "submitter"], name
        kueue.admin.delete(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/{job['metadata']['name']}")


def _workloads(api: ApiServer, ns: str) -> dict[str, dict[str, Any]]:
    return {w["metadata"]["name"]: w for w in api.admin.items(WORKLOADS.format(ns=ns))}


def _owned_by(workloads: dict[str, dict[str, Any]], uid: str) -> list[dict[str, Any]]:
    return [w for w in workloads.values() if w["metadata"].get("labels", {}).get(JOB_UID_LABEL) == uid]


def test_install_waits_in_the_queue_upgrade_and_uninstall_leave_nothing(kueue: ApiServer, tmp_path: Path) -> None:
    ns = kueue.namespace("kueue-life")
    kueue.admin.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": USER_SECRET}, "stringData": {"hf_api_token": "x"}})
    unowned = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload", "metadata": {"name": "not-owned"},
               "spec": {"queueName": "team-a", "podSets": [{"name": "main", "count": 1, "template": {
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}]}}
    kueue.admin.create(WORKLOADS.format(ns=ns), unowned)
    bin_ = helm_bin("HELM")
    with Controllers(kueue, ns, tmp_path / "sim", kueue=True) as sim:
        out = helm(kueue, bin_, "install", RELEASE, str(CHART), "-n", ns, "-f", str(QUEUED))
        assert "waits in the Kueue queue team-a" in out, out
        sim.settle()
        s1 = snapshot(kueue, ns)
        job1 = s1.rayjob()
        assert job1["spec"]["suspend"] is True
        assert "RayCluster" not in s1.objects, "a suspended job gets no cluster: it waits for admission"
        (wl1,) = _owned_by(_workloads(kueue, ns), job1["metadata"]["uid"])
        assert wl1["spec"]["queueName"] == "team-a"
        # the priority is the class's value, read from the server (another test on this server may have made the class)
        value = kueue.admin.get(f"{PRIORITY_CLASSES}/batch-high")["value"]
        assert (wl1["spec"]["priorityClassRef"]["name"], wl1["spec"]["priority"]) == ("batch-high", value)
        assert [(p["name"], p["count"]) for p in wl1["spec"]["podSets"]] == [("head", 1), ("gpu-workers", 2), ("submitter", 1)]

        # Kueue admits it (RunWithPodSetsInfo: suspend=false): KubeRay makes the job's cluster.
        path = f"/apis/ray.io/v1/namespaces/{ns}/rayjobs/{job1['metadata']['name']}"
        kueue.admin.merge_patch(path, {"spec": {"suspend": False}})
        sim.settle()
        assert len(snapshot(kueue, ns).names("RayCluster")) == 1

        helm(kueue, bin_, "upgrade", RELEASE, str(CHART), "-n", ns, "--reuse-values", "--set", "training.learning_rate=0.0001")
        sim.settle()
        s2 = snapshot(kueue, ns)
        job2 = s2.rayjob()
        assert job2["metadata"]["name"] == f"{FULLNAME}-r2" and job2["spec"]["suspend"] is True
        assert "RayCluster" not in s2.objects, "the admitted job's cluster went with it; the new job waits"
        workloads = _workloads(kueue, ns)
        assert not _owned_by(workloads, job1["metadata"]["uid"]), "the old job's Workload went with its owner"
        assert len(_owned_by(workloads, job2["metadata"]["uid"])) == 1

        helm(kueue, bin_, "uninstall", RELEASE, "-n", ns)
        sim.settle()
        assert snapshot(kueue, ns).all() - BASELINE == {("Secret", USER_SECRET)}
        assert set(_workloads(kueue, ns)) == {"not-owned"}, "only the owner reference removes a Workload"

