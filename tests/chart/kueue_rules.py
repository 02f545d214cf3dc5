"""Kueue v0.19.2's RayJob admission rules, transcribed from its source, for rendered RayJobs.

Source (github.com/kubernetes-sigs/kueue, tag v0.19.2):
- pkg/controller/jobs/rayjob/rayjob_webhook.go, ``RayJobWebhook.validateCreate``: a job with a queue
  (or any job when manageJobsWithoutQueueName) must not give both clusterSelector and
  rayClusterSpec; with clusterSelector alone Kueue does not manage it; without either it is
  rejected; with rayClusterSpec, ``shutdownAfterJobFinishes`` must be true, then
  raycluster.ValidateCreate, then jobframework.ValidateJobOnCreate.
- pkg/controller/jobs/raycluster/common.go, ``ValidateCreate``: no ``enableInTreeAutoscaling``
  unless workload slicing is enabled (annotation kueue.x-k8s.io/elastic-job=true plus an alpha
  feature gate); at most ``jobframework.MaxPodSets`` (18, pkg/controller/jobframework/constants.go)
  pod sets, counted as worker groups + 1 (``ExpectedPodSetsCount``); no worker group named "head".
- pkg/controller/jobframework/validation.go, ``ValidateJobOnCreate``: the queue-name label
  (``ValidateQueueName``) and the prebuilt-workload-name label are DNS-1123 subdomains
  (``ValidateLabelAsCRDName``), ``kueue.x-k8s.io/max-exec-time-seconds`` is an integer > 0
  (``validateCreateForMaxExecTime``), the elastic-job annotation only on supported kinds (RayJob is).
- pkg/controller/jobs/rayjob/rayjob_controller.go, ``PodSets``: the Workload also has a pod set
  named "submitter" (K8sJobMode), so a worker group of that name would collide in the Workload's
  podSets (a list keyed by name): not a webhook rule, an admission failure all the same.
- jobframework.ApplyDefaultForSuspend (defaults.go, the mutating webhook): a job with a queue is
  suspended at creation; the chart renders ``suspend: true`` itself.
"""

from __future__ import annotations

import re
from typing import Any

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PREBUILT_LABEL = "kueue.x-k8s.io/prebuilt-workload-name"
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
MAX_POD_SETS = 18
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_SUBDOMAIN_MAX = 253


def _dns1123_subdomain(value: str) -> bool:
    return len(value) <= _DNS1123_SUBDOMAIN_MAX and bool(_DNS1123_SUBDOMAIN.match(value))


def managed(job: dict[str, Any], manage_jobs_without_queue_name: bool = False) -> bool:
    return manage_jobs_without_queue_name or bool((job["metadata"].get("labels") or {}).get(QUEUE_LABEL))


def webhook_errors(job: dict[str, Any], manage_jobs_without_queue_name: bool = False) -> list[str]:
    """What Kueue's RayJob validating webhook answers on create ([] = admitted)."""
    errors: list[str] = []
    spec = job["spec"]
    meta = job["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if managed(job, manage_jobs_without_queue_name):
        has_selector, cluster = bool(spec.get("clusterSelector")), spec.get("rayClusterSpec")
        if has_selector and cluster is not None:
            return ["spec.clusterSelector: a kueue managed job should not use an existing cluster"]
        if has_selector:
            return []  # a RayJob on an existing cluster: not managed by Kueue
        if cluster is None:
            return ["spec.rayClusterSpec: rayClusterSpec is required for Kueue-managed jobs"]
        if not spec.get("shutdownAfterJobFinishes", False):
            errors.append("spec.shutdownAfterJobFinishes: a kueue managed job should delete the cluster after finishing")
        slicing = annotations.get(ELASTIC_ANNOTATION) == "true"
        if cluster.get("enableInTreeAutoscaling") and not slicing:
            errors.append("spec.rayClusterSpec.enableInTreeAutoscaling: only with workload slicing")
        groups = cluster.get("workerGroupSpecs") or []
        if len(groups) + 1 > MAX_POD_SETS:
            errors.append(f"spec.rayClusterSpec.workerGroupSpecs: too many pod sets ({len(groups) + 1} > {MAX_POD_SETS})")
        errors += [f"spec.rayClusterSpec.workerGroupSpecs[{i}].groupName: \"head\" is reserved for the head group"
                   for i, g in enumerate(groups) if g.get("groupName") == "head"]
    for key in (QUEUE_LABEL, PREBUILT_LABEL):
        if key in labels and not _dns1123_subdomain(labels[key]):
            errors.append(f"metadata.labels[{key}]: not a DNS-1123 subdomain")
    if MAX_EXEC_LABEL in labels:
        value = labels[MAX_EXEC_LABEL]
        if not re.fullmatch(r"[-+]?[0-9]+", value):
            errors.append(f"metadata.labels[{MAX_EXEC_LABEL}]: not an integer")
        elif int(value) <= 0:
            errors.append(f"metadata.labels[{MAX_EXEC_LABEL}]: should be greater than 0")
    return errors


def admission_errors(job: dict[str, Any]) -> list[str]:
    """Beyond the webhook: what keeps a queued RayJob from ever becoming a Workload, or from waiting."""
    errors = list(webhook_errors(job))
    cluster = job["spec"].get("rayClusterSpec") or {}
    if job["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode":
        errors += [f"workerGroupSpecs[{i}].groupName: \"submitter\" collides with the submitter's pod set"
                   for i, g in enumerate(cluster.get("workerGroupSpecs") or []) if g.get("groupName", "").lower() == "submitter"]
    if managed(job) and not job["spec"].get("suspend", False):
        errors.append("spec.suspend: a queued RayJob must be created suspended (Kueue un-suspends it on admission)")
    return errors
