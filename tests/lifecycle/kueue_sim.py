"""A stand-in for Kueue v0.19.2's job reconciler, doing only what its source does for a RayJob with a queue:

- pkg/controller/jobframework/reconciler.go ``ReconcileGenericJob`` / ``ConstructWorkload``: a RayJob
  with the ``kueue.x-k8s.io/queue-name`` label gets one Workload in its namespace, named after it
  (``GetWorkloadNameForOwnerWithGVK``: "rayjob-<name>-<hash>"), labelled
  ``kueue.x-k8s.io/job-uid=<uid>``, controlled by the RayJob (``controller: true``,
  ``blockOwnerDeletion: true``), with ``spec.queueName``, the WorkloadPriorityClass of
  ``kueue.x-k8s.io/priority-class`` as ``spec.priorityClassRef`` and its value as ``spec.priority``
  (none while that class does not exist), and the pod sets of
  pkg/controller/jobs/rayjob/rayjob_controller.go ``PodSets`` (head, each worker group, submitter).
- Nothing is admitted here (no quota, no scheduler): the job stays suspended until a test admits it
  as Kueue would on admission (``RunWithPodSetsInfo``: ``spec.suspend = false``).

Kueue never deletes the Workload of a deleted RayJob itself: the garbage collector does, through the
owner reference (cluster_sim's stand-in collects Workloads whose owner is gone).
"""

from __future__ import annotations

import hashlib
from typing import Any

from kube_api import ApiServer

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads"
PRIORITY_CLASSES = "/apis/kueue.x-k8s.io/v1beta2/workloadpriorityclasses"


def pod_sets(job: dict[str, Any]) -> list[dict[str, Any]]:
    spec = job["spec"]
    cluster = spec["rayClusterSpec"]
    sets = [{"name": "head", "count": 1, "template": cluster["headGroupSpec"]["template"]}]
    sets += [{"name": g["groupName"].lower(), "count": int(g.get("replicas", 1)) * max(int(g.get("numOfHosts", 1)), 1),
              "template": g["template"]} for g in cluster.get("workerGroupSpecs") or []]
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
        sets.append({"name": "submitter", "count": 1, "template": spec["submitterPodTemplate"]})
    return sets


def workload_for(job: dict[str, Any], priority: int | None = None) -> dict[str, Any]:
    """The Workload of a RayJob; ``priority`` is its WorkloadPriorityClass's value (Kueue copies it)."""
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    digest = hashlib.sha256(f"{meta['name']}/ray.io/v1, Kind=RayJob/{meta['uid']}".encode()).hexdigest()[:5]
    spec: dict[str, Any] = {"queueName": labels[QUEUE_LABEL], "podSets": pod_sets(job)}
    if labels.get(PRIORITY_LABEL):
        assert priority is not None, "Kueue makes no Workload until its WorkloadPriorityClass exists"
        spec["priorityClassRef"] = {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": labels[PRIORITY_LABEL]}
        spec["priority"] = priority
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {
            "name": f"rayjob-{meta['name']}-{digest}"[:253],
            "labels": {JOB_UID_LABEL: meta["uid"]},  # no job labels copied (labelKeysToCopy is empty by default)
            "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": meta["name"], "uid": meta["uid"],
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def reconcile(api: ApiServer, ns: str) -> None:
    """One round: a Workload for every live RayJob with a queue that has none."""
    kube = api.admin
    have = {w["metadata"].get("labels", {}).get(JOB_UID_LABEL) for w in kube.items(WORKLOADS.format(ns=ns))}
    for job in kube.items(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs"):
        meta = job["metadata"]
        labels = meta.get("labels") or {}
        if not labels.get(QUEUE_LABEL) or meta.get("deletionTimestamp") or meta["uid"] in have:
            continue
        priority = None
        if labels.get(PRIORITY_LABEL):
            wpc = kube.get(f"{PRIORITY_CLASSES}/{labels[PRIORITY_LABEL]}")
            if wpc is None:
                continue  # Kueue's reconciler fails (the class is not found) and retries
            priority = int(wpc["value"])
        kube.create(WORKLOADS.format(ns=ns), workload_for(job, priority))


def collect(api: ApiServer, ns: str) -> None:
    """The garbage collector's part: a Workload whose owner RayJob is gone is deleted."""
    kube = api.admin
    live = {j["metadata"]["uid"] for j in kube.items(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs")}
    for w in kube.items(WORKLOADS.format(ns=ns)):
        refs = w["metadata"].get("ownerReferences") or []
        if refs and not any(r["uid"] in live for r in refs):
            kube.delete(f"{WORKLOADS.format(ns=ns)}/{w['metadata']['name']}")
