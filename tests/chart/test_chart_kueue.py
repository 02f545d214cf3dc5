"""The RayJob with a Kueue queue: Kueue v0.19.2's RayJob rules (kueue_rules.py, from its source) hold
for every rendered RayJob with a queue; each rule catches its violation; the job is created suspended
with the queue and priority labels; elastic training keeps working under an admitted workload."""

from __future__ import annotations

import copy
import re
import shlex
from typing import Any

import pytest
from gemma3_ray.config import machine_shapes
from helm_render import CHART, CI_VALUES_DIR, Render, helm_template
from kueue_rules import QUEUE_LABEL, admission_errors, webhook_errors

QUEUED_CI = CI_VALUES_DIR / "kueue-queued-values.yaml"


def queued_jobs(renders: dict[str, Render]) -> dict[str, dict[str, Any]]:
    return {name: r.one("RayJob") for name, r in renders.items()
            if (r.one("RayJob")["metadata"].get("labels") or {}).get(QUEUE_LABEL)}


def test_every_rendered_rayjob_with_a_queue_passes_kueues_rules(renders: dict[str, Render]) -> None:
    jobs = queued_jobs(renders)
    assert QUEUED_CI.name in jobs, "a values file with a queue is rendered"
    for name, job in jobs.items():
        assert admission_errors(job) == [], name


def test_a_job_without_a_queue_is_not_suspended_nor_labelled(renders: dict[str, Render]) -> None:
    job = renders["default-values.yaml"].one("RayJob")
    assert "suspend" not in job["spec"]
    assert not any(k.startswith("kueue.x-k8s.io/") for k in job["metadata"]["labels"])


@pytest.fixture(scope="module")
def queued() -> dict[str, Any]:
    return helm_template([QUEUED_CI]).one("RayJob")


def _mutated(job: dict[str, Any], change: str) -> dict[str, Any]:
    j = copy.deepcopy(job)
    spec, cluster = j["spec"], j["spec"]["rayClusterSpec"]
    labels = j["metadata"]["labels"]
    if change == "clusterSelector":
        spec["clusterSelector"] = {"ray.io/cluster": "shared"}
    elif change == "no-cluster-spec":
        del spec["rayClusterSpec"]
    elif change == "keep-cluster":
        spec["shutdownAfterJobFinishes"] = False
    elif change == "autoscaling":
        cluster["enableInTreeAutoscaling"] = True
    elif change == "too-many-pod-sets":
        cluster["workerGroupSpecs"] = [dict(cluster["workerGroupSpecs"][0], groupName=f"g{i}") for i in range(18)]
    elif change == "group-head":
        cluster["workerGroupSpecs"][0]["groupName"] = "head"
    elif change == "group-submitter":
        cluster["workerGroupSpecs"][0]["groupName"] = "submitter"
    elif change == "queue-name":
        labels[QUEUE_LABEL] = "Team_A"
    elif change == "max-exec-zero":
        labels["kueue.x-k8s.io/max-exec-time-seconds"] = "0"
    elif change == "max-exec-text":
        labels["kueue.x-k8s.io/max-exec-time-seconds"] = "two-days"
    elif change == "prebuilt":
        labels["kueue.x-k8s.io/prebuilt-workload-name"] = "Not_A_Name"
    elif change == "not-suspended":
        spec["suspend"] = False
    return j


CHANGES = {"clusterSelector": "spec.clusterSelector", "no-cluster-spec": "spec.rayClusterSpec",
           "keep-cluster": "spec.shutdownAfterJobFinishes", "autoscaling": "enableInTreeAutoscaling",
           "too-many-pod-sets": "too many pod sets", "group-head": "reserved for the head group",
           "group-submitter": "collides with the submitter", "queue-name": QUEUE_LABEL,
           "max-exec-zero": "greater than 0", "max-exec-text": "not an integer",
           "prebuilt": "prebuilt-workload-name", "not-suspended": "spec.suspend"}


@pytest.mark.parametrize("change", CHANGES)
def test_each_rule_catches_its_violation(queued: dict[str, Any], change: str) -> None:
    assert admission_errors(queued) == []
    errors = admission_errors(_mutated(queued, change))
    assert any(CHANGES[change] in e for e in errors), errors


def test_the_webhook_leaves_a_job_without_a_queue_alone_unless_it_manages_every_job(queued: dict[str, Any]) -> None:
    job = _mutated(queued, "keep-cluster")
    del job["metadata"]["labels"][QUEUE_LABEL]
    assert webhook_errors(job) == []
    assert webhook_errors(job, manage_jobs_without_queue_name=True)


def test_the_queued_job_waits_suspended_with_its_queue_priority_and_labels(queued: dict[str, Any]) -> None:
    assert queued["spec"]["suspend"] is True
    labels = queued["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels["kueue.x-k8s.io/priority-class"], labels["team"]) == ("team-a", "batch-high", "vision")
    assert labels["kueue.x-k8s.io/max-exec-time-seconds"] == "172800"


def test_elastic_training_under_an_admitted_workload(queued: dict[str, Any]) -> None:
    """Kueue admits replicas pods of the group and no autoscaler; Ray Train runs on at least
    min_workers of the derived num_workers, and KubeRay recreates a lost pod within the admission."""
    cluster = queued["spec"]["rayClusterSpec"]
    assert "enableInTreeAutoscaling" not in cluster and "autoscalerOptions" not in cluster
    (group,) = cluster["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    flags = dict(a[2:].split("=", 1) for a in shlex.split(queued["spec"]["entrypoint"]) if a.startswith("--"))
    assert (flags["num_workers"], flags["min_workers"]) == ("16", "8")


def _worker_pod(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]


def test_queued_capacity_selects_flex_start_nodes_and_tolerates_the_queued_taint(queued: dict[str, Any]) -> None:
    pod = _worker_pod(queued)
    assert pod["nodeSelector"]["cloud.google.com/gke-flex-start"] == "true"
    assert {"key": "cloud.google.com/gke-queued", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in pod["tolerations"]


def test_flex_start_capacity_selects_flex_start_nodes_without_a_queue(renders: dict[str, Render]) -> None:
    job = renders["flex-start-values.yaml"].one("RayJob")
    pod = _worker_pod(job)
    assert pod["nodeSelector"]["cloud.google.com/gke-flex-start"] == "true"
    assert not any(t["key"] == "cloud.google.com/gke-queued" for t in pod["tolerations"])
    assert "suspend" not in job["spec"]


def test_the_charts_flex_start_gpus_are_the_machine_shape_tables() -> None:
    text = (CHART / "templates" / "validate.yaml").read_text()
    (listed,) = re.findall(r'\$flex := list ((?:"[^"]+" ?)+)', text)
    assert sorted(re.findall(r'"([^"]+)"', listed)) == sorted(machine_shapes.FLEX_START_ACCELERATORS)
