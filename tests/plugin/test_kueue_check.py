"""`status` and `doctor` on Kueue, against the real kube-apiserver with Kueue v0.19.2's CRDs: the
Workload of a queued RayJob (found by its job-uid label) read as waiting (with Kueue's reason),
admitted or evicted; doctor's LocalQueue / ClusterQueue checks pass for what `kueue setup` made and
fail, naming the fix, when the queue is missing or its quota cannot hold the whole job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from gemma3_ray.cli import kueue_command
from gemma3_ray.config import render
from gemma3_ray.kueue import check as kueue_check
from kubernetes import client, config

from tests.plugin.kube_apiserver import kubectl
from tests.plugin.test_kueue_setup import QUEUED, _args

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _helm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELM", os.environ.get("HELM", str(ROOT / ".tools" / "bin" / "helm")))


@pytest.fixture(scope="module")
def apis(kueue_crds: Path) -> tuple[Any, Any, Any]:
    api = config.new_client_from_config(config_file=str(kueue_crds))
    return client.CustomObjectsApi(api), client.ApiextensionsV1Api(api), client.CoreV1Api(api)


def _ns(kubeconfig: Path, name: str) -> str:
    kubectl(kubeconfig, "create", "namespace", name)
    return name


def _queued_rayjob(kubeconfig: Path, ns: str, custom: Any) -> dict[str, Any]:
    from tests.chart.helm_render import helm_template

    job = helm_template([QUEUED], namespace=ns).one("RayJob")
    return custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayjobs", job)


def _workload(custom: Any, ns: str, job: dict[str, Any], conditions: list[dict[str, Any]],
              admission: dict[str, Any] | None = None, sets: tuple[str, ...] = ("head",)) -> None:
    meta = job["metadata"]
    name = f"rayjob-{meta['name']}-abcde"
    body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                         "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": meta["name"],
                                              "uid": meta["uid"], "controller": True}]},
            "spec": {"queueName": "team-a", "podSets": [{"name": s, "count": 1, "template": {
                "spec": {"containers": [{"name": "ray", "image": "rayproject/ray"}]}}} for s in sets]}}
    if custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"] == []:
        custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads", body)
    now = "2026-12-01T20:00:00Z"
    status: dict[str, Any] = {"conditions": [{"lastTransitionTime": now, "observedGeneration": 1, **c} for c in conditions]}
    if admission is not None:
        status["admission"] = admission
    custom.patch_namespaced_custom_object_status("kueue.x-k8s.io", "v1beta2", ns, "workloads", name, {"status": status})


def test_status_reads_the_workloads_state_and_reason(kueue_crds: Path, apis: tuple[Any, Any, Any]) -> None:
    custom = apis[0]
    ns = _ns(kueue_crds, "kueue-status")
    job = _queued_rayjob(kueue_crds, ns, custom)
    assert kueue_check.status_lines(custom, job) == [
        f"Kueue: no Workload yet for queue {ns}/team-a (is Kueue running? `kubectl get localqueue -n {ns} team-a`)"]

    pending = "couldn't assign flavors to pod set gpu-workers: insufficient quota for nvidia.com/gpu in flavor team-cq-gpu"
    _workload(custom, ns, job, [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": pending}])
    (line,) = kueue_check.status_lines(custom, job)
    assert f"waiting in the queue (Pending: {pending})" in line and "kubectl describe workload -n" in line

    _workload(custom, ns, job, [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "ok"},
                                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"}])
    assert "admitted: the job runs" in kueue_check.status_lines(custom, job)[0]

    _workload(custom, ns, job, [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "by a higher priority"}])
    assert "evicted (Preempted: by a higher priority)" in kueue_check.status_lines(custom, job)[0]


def test_status_names_the_flavor_that_admitted_the_job(kueue_crds: Path, apis: tuple[Any, Any, Any]) -> None:
    """Capacity that falls back (#34): `status` says which ResourceFlavor (capacity kind) Kueue admitted the job
    on, from the Workload's admission as the API server (Kueue's CRD) keeps it."""
    custom = apis[0]
    ns = _ns(kueue_crds, "kueue-flavor")
    job = _queued_rayjob(kueue_crds, ns, custom)
    admitted = [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "ok"},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"}]
    one = {"clusterQueue": "team-cq", "podSetAssignments": [
        {"name": "head", "count": 1, "flavors": {"cpu": "team-cq-flex-start", "memory": "team-cq-flex-start"}}]}
    _workload(custom, ns, job, admitted, one)
    assert "admitted on flavor team-cq-flex-start: the job runs" in kueue_check.status_lines(custom, job)[0]
    two = {"clusterQueue": "team-cq", "podSetAssignments": [
        {"name": "head", "count": 1, "flavors": {"cpu": "team-cq-cpu", "memory": "team-cq-cpu"}},
        {"name": "gpu-workers", "count": 1, "flavors": {"nvidia.com/gpu": "team-cq-reservation", "cpu": "team-cq-reservation"}}]}
    ns2 = _ns(kueue_crds, "kueue-flavors")
    job = _queued_rayjob(kueue_crds, ns2, custom)
    _workload(custom, ns2, job, admitted, two, sets=("head", "gpu-workers"))
    assert ("admitted on flavors team-cq-cpu (pod sets head), team-cq-reservation (pod sets gpu-workers)"
            in kueue_check.status_lines(custom, job)[0])


def test_a_job_without_a_queue_has_no_kueue_line(apis: tuple[Any, Any, Any]) -> None:
    assert kueue_check.status_lines(apis[0], {"metadata": {"name": "j", "namespace": "x", "labels": {}}}) == []


def _checks(apis: tuple[Any, Any, Any], ns: str, values: dict[str, Any]) -> dict[str, kueue_check.Check]:
    out = kueue_check.doctor_checks(ns, "gemma3-ray", apis[0], apis[1], values, apis[2])
    return {c.name: c for c in out}


def test_doctor_passes_for_the_queue_kueue_setup_made_and_says_what_is_missing(kueue_crds: Path, apis: tuple[Any, Any, Any]) -> None:
    ns = _ns(kueue_crds, "kueue-doctor")
    values = render.load_plain(QUEUED)
    missing = _checks(apis, ns, values)
    assert missing["Kueue CRDs"].ok and not missing["Kueue LocalQueue"].ok
    assert f"{ns}/team-a does not exist" in missing["Kueue LocalQueue"].detail

    assert kueue_command.cmd_setup(_args(kueue_crds, ns, QUEUED, apply=True, queued=True, name="team-a"), None, lambda _: None) == 0
    kubectl(kueue_crds, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "metadata": {"name": "batch-high"},
        "value": 1000}))
    ok = _checks(apis, ns, values)
    assert all(c.ok for c in ok.values()), [c.line() for c in ok.values()]
    assert "team-a-cq has flavors and nominal quota for the whole job" in ok["Kueue ClusterQueue"].detail

    # The same queue name in another namespace, pointing at this namespace's ClusterQueue: never admitted.
    other = _ns(kueue_crds, "kueue-doctor-other")
    kubectl(kueue_crds, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "team-a", "namespace": other},
        "spec": {"clusterQueue": "team-a-cq"}}))
    elsewhere = _checks(apis, other, values)["Kueue ClusterQueue"]
    assert not elsewhere.ok and f"does not select namespace {other}" in elsewhere.detail

    # The admin's quota for half the GPUs: the job (2 nodes x 8 GPUs) could never be admitted.
    cq = apis[0].get_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "team-a-cq")
    for f in cq["spec"]["resourceGroups"][0]["flavors"]:
        for r in f["resources"]:
            if r["name"] == "nvidia.com/gpu" and f["name"] == "team-a-cq-gpu":
                r["nominalQuota"] = "8"
    apis[0].replace_cluster_custom_object("kueue.x-k8s.io", "v1beta2", "clusterqueues", "team-a-cq", cq)
    low = _checks(apis, ns, values)["Kueue ClusterQueue"]
    assert not low.ok and "can never admit this job" in low.detail and "pod set gpu-workers" in low.detail


def test_doctor_has_no_kueue_checks_without_a_queue(apis: tuple[Any, Any, Any]) -> None:
    assert kueue_check.doctor_checks("ml", "gemma3-ray", apis[0], apis[1], {"storage": {"bucket": "b"}}) == []
