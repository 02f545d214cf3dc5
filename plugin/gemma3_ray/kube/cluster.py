"""Inside the cluster, through the ``kubernetes`` client: the HF Secret, the RayJob, its driver log, the CRDs."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from gemma3_ray.utils import poll
from gemma3_ray.utils.errors import ClusterError, UserError

RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAYJOB_PLURAL = "rayjobs"
RAYJOB_CRD = "rayjobs.ray.io"
RAYCLUSTER_CRD = "rayclusters.ray.io"
INSTANCE_LABEL = "app.kubernetes.io/instance"
DASHBOARD_PORT = 8265
HTTP_NOT_FOUND = 404
HTTP_FORBIDDEN = 403
HTTP_UNAUTHORIZED = 401
TERMINAL_JOB_STATES = {"SUCCEEDED", "FAILED", "STOPPED"}
TERMINAL_DEPLOYMENT_STATES = {"Complete", "Failed"}
FOLLOW_INTERVAL_S = 10.0


def _api_error(exc: Exception, what: str) -> UserError:
    status = getattr(exc, "status", None)
    if status == HTTP_UNAUTHORIZED:
        return ClusterError(f"The cluster refused your credentials (401) when asked to {what}: refresh them with "
                            "`gcloud auth login` and `gcloud container clusters get-credentials CLUSTER --location "
                            "LOCATION`, then run this again.")
    if status == HTTP_FORBIDDEN:
        return ClusterError(f"The cluster forbids you to {what}: ask for a Role that allows it in this namespace.")
    return ClusterError(f"Could not {what}: {getattr(exc, 'reason', None) or exc}.")


api_error = _api_error


def delete_rayjob(custom: Any, namespace: str, name: str) -> None:
    """Delete one RayJob (already gone is fine)."""
    from kubernetes.client.exceptions import ApiException

    try:
        custom.delete_namespaced_custom_object(RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, name,
                                               propagation_policy="Background")
    except ApiException as exc:
        if exc.status == HTTP_NOT_FOUND:
            return
        raise _api_error(exc, f"delete RayJob {namespace}/{name}") from None


def read_secret(core: Any, namespace: str, name: str) -> Any | None:
    from kubernetes.client.exceptions import ApiException

    try:
        return core.read_namespaced_secret(name, namespace)
    except ApiException as exc:
        if exc.status == HTTP_NOT_FOUND:
            return None
        raise _api_error(exc, f"read Secret {namespace}/{name}") from exc


def put_secret(core: Any, namespace: str, name: str, key: str, value: str, labels: dict[str, str]) -> None:
    """Create or replace an Opaque Secret holding ``value`` under ``key`` (value never logged)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        type="Opaque",
        data={key: base64.b64encode(value.encode()).decode()},
    )
    try:
        core.create_namespaced_secret(namespace, body)
    except ApiException as exc:
        if exc.status != 409:  # noqa: PLR2004 - exists: replace below
            raise _api_error(exc, f"create Secret {namespace}/{name}") from None
        try:
            core.replace_namespaced_secret(name, namespace, body)
        except ApiException as exc2:
            raise _api_error(exc2, f"update Secret {namespace}/{name}") from None


@dataclass(frozen=True)
class RayJobState:
    name: str
    job_status: str
    deployment_status: str
    message: str
    ray_cluster: str
    job_id: str
    dashboard_url: str


def rayjob_state(obj: dict[str, Any]) -> RayJobState:
    status = obj.get("status") or {}
    return RayJobState(
        name=obj["metadata"]["name"],
        job_status=status.get("jobStatus") or "PENDING",
        deployment_status=status.get("jobDeploymentStatus") or "New",
        message=status.get("message") or "",
        ray_cluster=status.get("rayClusterName") or "",
        job_id=status.get("jobId") or "",
        dashboard_url=status.get("dashboardURL") or "",
    )


def find_rayjob(custom: Any, namespace: str, release: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        items = custom.list_namespaced_custom_object(
            RAY_GROUP, RAY_VERSION, namespace, RAYJOB_PLURAL, label_selector=f"{INSTANCE_LABEL}={release}"
        ).get("items", [])
    except ApiException as exc:
        if exc.status == HTTP_NOT_FOUND:
            raise ClusterError("The RayJob CRD is not installed: install the KubeRay operator first "
                               "(see `gemma3-ray doctor`).") from None
        raise _api_error(exc, f"list RayJobs in {namespace}") from None
    if not items:
        raise ClusterError(f"No RayJob of release {release!r} in namespace {namespace}: run `gemma3-ray up` "
                           "or `helm install` first.")
    return max(items, key=lambda o: o["metadata"].get("creationTimestamp") or "")


def follow(custom: Any, namespace: str, release: str, out: Callable[[str], None]) -> RayJobState:
    """Poll the release's newest RayJob until it ends, printing each change of its state; its last state."""
    def ended(s: RayJobState) -> bool:
        return s.job_status in TERMINAL_JOB_STATES or s.deployment_status in TERMINAL_DEPLOYMENT_STATES

    return poll.until(lambda: rayjob_state(find_rayjob(custom, namespace, release)), ended,
                      interval=FOLLOW_INTERVAL_S, timeout=None, out=out, progress_every=float("inf"),
                      describe=lambda s: f"RayJob {s.name}: {s.deployment_status} / {s.job_status} {s.message}".rstrip())


def dashboard_job(core: Any, namespace: str, ray_cluster: str, job_id: str) -> dict[str, Any] | None:
    """The Ray dashboard's view of the job, through the API server's service proxy (None if unreachable)."""
    if not (ray_cluster and job_id):
        return None
    try:
        raw = core.connect_get_namespaced_service_proxy_with_path(
            f"{ray_cluster}-head-svc:{DASHBOARD_PORT}", namespace, f"api/jobs/{job_id}")
    except Exception:
        return None
    try:
        return json.loads(raw) if isinstance(raw, str) else dict(raw)
    except (ValueError, TypeError):
        return None


# The scheduler's reasons (kube-scheduler's FailedScheduling message parts) and what to change for each.
_UNPLACEABLE_FIXES = (
    ("Insufficient nvidia.com/gpu", "too few free GPUs in the pool: add nodes to it (or free them) or lower "
                                    "workers.replicas"),
    ("didn't match Pod's node affinity/selector", "no node has the labels the values select (the accelerator, "
                                                  "the reservation or capacity labels): check the pool against "
                                                  "`gemma3-ray values --machine-type`"),
    ("untolerated taint", "the free nodes carry a taint the pods do not tolerate"),
    ("Insufficient cpu", "too little free CPU on the nodes the pods may use: lower the requests or add nodes"),
    ("Insufficient memory", "too little free memory on the nodes the pods may use: lower the requests or add nodes"),
)


def _scheduled_false(pod: Any) -> str:
    """The scheduler's message when it refused the pod (PodScheduled=False, reason Unschedulable), else ''."""
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return (c.message or "").strip()
    return ""


def unplaceable_lines(core: Any, namespace: str, ray_cluster: str) -> list[str]:
    """One sentence per Ray node type (head, worker) whose pods the scheduler cannot place: how many, its own
    message, and what to change. A pod still pulling its image, or not yet looked at, is not named."""
    if not ray_cluster:
        return []
    pods = core.list_namespaced_pod(namespace, label_selector=f"ray.io/cluster={ray_cluster}").items
    out = []
    for kind in ("head", "worker"):
        group = [p for p in pods if (p.metadata.labels or {}).get("ray.io/node-type") == kind]
        refused = [(p.metadata.name, _scheduled_false(p)) for p in group]
        refused = [(n, m) for n, m in refused if m]
        if not refused:
            continue
        message = refused[0][1]
        fix = next((f for key, f in _UNPLACEABLE_FIXES if key in message), "see `kubectl describe pod "
                   f"{refused[0][0]} -n {namespace}`")
        out.append(f"{len(refused)} of {len(group)} {kind} pod{'s' if len(group) != 1 else ''} of {ray_cluster} "
                   f"cannot be placed: the scheduler says \"{message}\": {fix}")
    return out


def driver_log(core: Any, namespace: str, rayjob: str, follow: bool) -> Iterator[str]:
    """The driver's output: KubeRay's submitter Job (named after the RayJob) runs `ray job submit` and
    follows the driver log, so its pod log is the driver log."""
    from kubernetes.client.exceptions import ApiException

    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={rayjob}").items
    if not pods:
        raise ClusterError(f"The submitter pod of RayJob {rayjob} does not exist yet: wait for the Ray cluster "
                           "to start (`gemma3-ray status`).")
    pod = max(pods, key=lambda p: p.metadata.creation_timestamp or 0)
    try:
        resp = core.read_namespaced_pod_log(pod.metadata.name, namespace, follow=follow, _preload_content=False)
        for chunk in resp.stream():
            yield chunk.decode(errors="replace")
    except ApiException as exc:
        raise _api_error(exc, f"read the log of pod {namespace}/{pod.metadata.name}") from None


def crd(api_ext: Any, name: str) -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    try:
        obj = api_ext.read_custom_resource_definition(name)
    except ApiException as exc:
        if exc.status == HTTP_NOT_FOUND:
            return None
        raise _api_error(exc, f"read CRD {name}") from None
    return obj if isinstance(obj, dict) else api_ext.api_client.sanitize_for_serialization(obj)
