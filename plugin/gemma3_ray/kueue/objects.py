"""What Kueue counts for a rendered RayJob, and the Kueue objects (v1beta2) an admin makes for it.

Kueue v0.19.2 makes one Workload per RayJob with a pod set for the head, one per worker group
(replicas x numOfHosts pods) and, in K8sJobMode, one for the submitter
(pkg/controller/jobs/rayjob/rayjob_controller.go ``PodSets``; KubeRay's default submitter resources
when the RayJob has no submitterPodTemplate). A pod counts the sum of its containers' requests (a
limit stands in for a missing request, as the API server defaults it), at least its largest init
container. Every requested resource must be covered by the ClusterQueue, or Kueue cannot admit it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gemma3_ray.utils import names

API_VERSION = "kueue.x-k8s.io/v1beta2"
GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GPU = "nvidia.com/gpu"
OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER = f"{names.PRODUCT}-kueue-setup"
PROVISIONING_CLASS = "queued-provisioning.gke.io"  # GKE's class for flex-start with queued provisioning
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
# GKE's ProvisioningRequest takes one pod set per request (ray-project/ray#57839): Kueue merges the pod
# sets it sends whose scheduling requirements are the same (apis/kueue/v1beta2/provisioningrequestconfig_types.go
# IdenticalWorkloadSchedulingRequirements; the other policy, IdenticalPodTemplates, also needs the
# same containers and labels).
POD_SET_MERGE_POLICY = "IdenticalWorkloadSchedulingRequirements"
# A request GKE cannot fill is retried: at most 3 times, after about 60 s, 120 s, 240 s (at most 1800 s),
# then Kueue deactivates the Workload. These are Kueue's documented defaults (retryStrategy), written out
# so the plan shows them and a live object that differs is brought back.
RETRY_STRATEGY = {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}
# KubeRay's submitter defaults (ray-operator/controllers/ray/common/job.go), as Kueue mirrors them.
DEFAULT_SUBMITTER_REQUESTS = {"cpu": "500m", "memory": "200Mi"}
# The node labels that tell GPU pools apart (the chart's worker nodeSelector sets them).
FLAVOR_LABEL_KEYS = ("cloud.google.com/gke-accelerator", "cloud.google.com/gke-flex-start",
                     "cloud.google.com/gke-spot", "cloud.google.com/reservation-name")
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}  # GKE taints every GPU node so
QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
FLEX_START_LABEL = {"cloud.google.com/gke-flex-start": "true"}  # GKE's label of flex-start nodes
# The capacity kinds of the chart's capacity.fallback, the order Kueue tries them in is the values'.
FALLBACK_KINDS = ("reservation", "flex-start", "on-demand")
DEFAULT_PRIORITY_VALUE = 100  # a WorkloadPriorityClass setup makes; a job without a class has priority 0
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # the API server sets it on every namespace

_QUANTITY = re.compile(r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[numkMGTPE]|)$")
_SUFFIX = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("0.001"), "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: Any) -> Decimal:
    """A Kubernetes quantity ("24", "500m", "64Gi", 8) as a number of units."""
    m = _QUANTITY.match(str(text).strip())
    if not m:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    return Decimal(m["num"]) * Decimal(_SUFFIX[m["suffix"]])


def format_quantity(value: Decimal) -> str:
    """The shortest exact text of a quantity: whole numbers bare, CPU in m, bytes in Gi/Mi/Ki."""
    if value == value.to_integral_value():
        n = int(value)
        for suffix in ("Ti", "Gi", "Mi", "Ki"):
            unit = _SUFFIX[suffix]
            if n >= unit and n % unit == 0:
                return f"{n // unit}{suffix}"
        return str(n)
    milli = value * 1000
    if milli == milli.to_integral_value():
        return f"{int(milli)}m"
    return f"{int((value * 10**9).to_integral_value())}n"


Demand = dict[str, Decimal]


def pod_requests(template: dict[str, Any]) -> Demand:
    spec = template.get("spec") or {}

    def of(container: dict[str, Any]) -> Demand:
        res = container.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: quantity(v) for k, v in merged.items()}

    total: Demand = {}
    for c in spec.get("containers") or []:
        for k, v in of(c).items():
            total[k] = total.get(k, Decimal(0)) + v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, Decimal(0)), v)
    return total


@dataclass(frozen=True)
class PodSet:
    name: str
    count: int
    requests: Demand
    node_selector: dict[str, str] = field(default_factory=dict)

    def total(self) -> Demand:
        return {k: v * self.count for k, v in self.requests.items()}


def pod_sets(rayjob: dict[str, Any]) -> list[PodSet]:
    """The pod sets of the Workload Kueue makes for this RayJob (inline cluster spec only)."""
    spec = rayjob["spec"]
    cluster = spec.get("rayClusterSpec")
    if not cluster:
        raise ValueError("the RayJob has no rayClusterSpec (persistent mode): Kueue does not queue it")
    head = cluster["headGroupSpec"]["template"]
    out = [PodSet("head", 1, pod_requests(head), (head.get("spec") or {}).get("nodeSelector") or {})]
    for g in cluster.get("workerGroupSpecs") or []:
        count = int(g.get("replicas", 1)) * max(int(g.get("numOfHosts", 1)), 1)
        out.append(PodSet(g["groupName"].lower(), count, pod_requests(g["template"]),
                          (g["template"].get("spec") or {}).get("nodeSelector") or {}))
    if spec.get("submissionMode", "K8sJobMode") == "K8sJobMode":
        sub = spec.get("submitterPodTemplate")
        requests = pod_requests(sub) if sub else {k: quantity(v) for k, v in DEFAULT_SUBMITTER_REQUESTS.items()}
        out.append(PodSet("submitter", 1, requests))
    return out


def add(*demands: Demand) -> Demand:
    total: Demand = {}
    for d in demands:
        for k, v in d.items():
            total[k] = total.get(k, Decimal(0)) + v
    return total


def describe(demand: Demand) -> str:
    return ", ".join(f"{k} {format_quantity(v)}" for k, v in sorted(demand.items()) if v) or "nothing"


@dataclass(frozen=True)
class Setup:
    """The objects for one namespace's queue: names, what one job needs, how many jobs at once."""

    namespace: str
    queue: str
    cluster_queue: str
    sets: tuple[PodSet, ...]
    capacity: str = "none"  # the chart's capacity.type
    jobs: int = 1
    priority: str = ""  # the WorkloadPriorityClass the values name (kueue.priorityClass), if any
    priority_value: int = DEFAULT_PRIORITY_VALUE
    fallback: tuple[str, ...] = ()  # capacity.fallback with capacity.type=fallback: one flavor per kind, in order
    reservation: str = ""  # capacity.reservation

    @property
    def gpu_sets(self) -> list[PodSet]:
        return [s for s in self.sets if s.requests.get(GPU)]

    @property
    def cpu_sets(self) -> list[PodSet]:
        return [s for s in self.sets if not s.requests.get(GPU)]

    @property
    def gpu_flavor(self) -> str:
        return f"{self.cluster_queue}-gpu"

    @property
    def cpu_flavor(self) -> str:
        return f"{self.cluster_queue}-cpu" if self.gpu_sets else self.cluster_queue

    @property
    def check(self) -> str:
        return f"{self.cluster_queue}-queued-provisioning"

    @property
    def queued(self) -> bool:
        return self.capacity == "queued"

    def covered(self) -> list[str]:
        return sorted({k for s in self.sets for k in s.requests})

    def quota(self, sets: list[PodSet], jobs: int = 0) -> list[dict[str, Any]]:
        """Nominal quota for `jobs` (default: --jobs) jobs' worth of these pod sets, per covered resource."""
        total = add(*(s.total() for s in sets))
        return [{"name": r, "nominalQuota": format_quantity(total.get(r, Decimal(0)) * (jobs or self.jobs))}
                for r in self.covered()]

    @property
    def namespace_selector(self) -> dict[str, Any]:
        return {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}}

    @property
    def capacity_sets(self) -> list[PodSet]:
        """The pod sets a fallback's flavors admit: the GPU ones, or every one of a CPU-only job."""
        return self.gpu_sets or list(self.sets)

    def fallback_flavor(self, kind: str) -> str:
        return f"{self.cluster_queue}-{kind}"

    def kind_labels(self, kind: str) -> dict[str, str]:
        """A capacity kind's GKE node labels, as the chart's worker nodeSelector writes them for that
        capacity.type (templates/_placement.tpl gemma3-ray.workerNodeSelector); on-demand has none."""
        if kind == "flex-start":
            return dict(FLEX_START_LABEL)
        if kind == "reservation":
            return reservation_labels(self.reservation)
        return {}

    def flavor_labels(self) -> dict[str, str]:
        labels: dict[str, str] = {}
        for s in self.gpu_sets:
            labels.update({k: v for k, v in s.node_selector.items() if k in FLAVOR_LABEL_KEYS})
        return labels


def reservation_labels(reservation: str) -> dict[str, str]:
    """GKE's node labels for capacity.reservation ("N", "N/reservationBlocks/B" or
    "projects/P/reservations/N[/reservationBlocks/B]"), as the chart renders them for type=reservation."""
    if not reservation:
        raise ValueError("capacity.reservation is empty: the fallback lists reservation")
    rest, _, block = reservation.partition("/reservationBlocks/")
    parts = rest.split("/")
    labels = {"cloud.google.com/reservation-name": parts[-1], "cloud.google.com/reservation-affinity": "specific"}
    if rest.startswith("projects/"):
        labels["cloud.google.com/reservation-project"] = parts[1]
    if block:
        labels["cloud.google.com/reservation-blocks"] = block
    return labels


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {OWNER_LABEL: OWNER}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def objects(setup: Setup) -> list[dict[str, Any]]:
    """(WorkloadPriorityClass), ResourceFlavors, (ProvisioningRequestConfig, AdmissionCheck), ClusterQueue,
    LocalQueue, in apply order."""
    out: list[dict[str, Any]] = []
    if setup.priority:  # no `spec`: its value is a top-level field, like a PriorityClass's
        out.append({"apiVersion": API_VERSION, "kind": "WorkloadPriorityClass", "metadata": _meta(setup.priority),
                    "value": setup.priority_value,
                    "description": f"made by `{names.PRODUCT} kueue setup` for the jobs whose values name it"})
    flavors: list[dict[str, Any]] = []
    if setup.fallback:
        # One flavor per capacity kind, in the values' order: Kueue tries a ClusterQueue's flavors in order
        # and admits on the first with room (the default flavorFungibility: the next when the quota is
        # used), then writes that flavor's nodeLabels into the pods' nodeSelector.
        taints = [GPU_TAINT] if setup.gpu_sets else []
        base = setup.flavor_labels()
        for kind in setup.fallback:
            name = setup.fallback_flavor(kind)
            out.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(name),
                        "spec": {"nodeLabels": {**base, **setup.kind_labels(kind)}, "nodeTaints": taints}})
            flavors.append({"name": name, "resources": setup.quota(setup.capacity_sets)})
        if setup.gpu_sets:  # the heads and submitters of every job the GPU flavors admit together (#43)
            out.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(setup.cpu_flavor), "spec": {}})
            flavors.append({"name": setup.cpu_flavor,
                            "resources": setup.quota(setup.cpu_sets, setup.jobs * len(setup.fallback))})
    elif setup.gpu_sets:
        taints = [GPU_TAINT] + ([QUEUED_TAINT] if setup.queued else []) + ([SPOT_TAINT] if setup.capacity == "spot" else [])
        out.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(setup.gpu_flavor),
                    "spec": {"nodeLabels": setup.flavor_labels(), "nodeTaints": taints}})
        flavors.append({"name": setup.gpu_flavor, "resources": setup.quota(setup.gpu_sets)})
    if not setup.fallback:
        out.append({"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(setup.cpu_flavor), "spec": {}})
        flavors.append({"name": setup.cpu_flavor, "resources": setup.quota(setup.cpu_sets)})
    cq_spec: dict[str, Any] = {
        "namespaceSelector": setup.namespace_selector,
        "resourceGroups": [{"coveredResources": setup.covered(), "flavors": flavors}],
    }
    if setup.queued:
        out.append({"apiVersion": API_VERSION, "kind": "ProvisioningRequestConfig", "metadata": _meta(setup.check),
                    "spec": {"provisioningClassName": PROVISIONING_CLASS, "managedResources": [GPU],
                             "podSetMergePolicy": POD_SET_MERGE_POLICY, "retryStrategy": dict(RETRY_STRATEGY)}})
        out.append({"apiVersion": API_VERSION, "kind": "AdmissionCheck", "metadata": _meta(setup.check),
                    "spec": {"controllerName": PROVISIONING_CONTROLLER, "parameters": {
                        "apiGroup": GROUP, "kind": "ProvisioningRequestConfig", "name": setup.check}}})
        cq_spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": setup.check, "onFlavors": [setup.gpu_flavor]}]}
    out.append({"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": _meta(setup.cluster_queue), "spec": cq_spec})
    out.append({"apiVersion": API_VERSION, "kind": "LocalQueue", "metadata": _meta(setup.queue, setup.namespace),
                "spec": {"clusterQueue": setup.cluster_queue}})
    return out


PLURALS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues", "LocalQueue": "localqueues",
           "ProvisioningRequestConfig": "provisioningrequestconfigs", "AdmissionCheck": "admissionchecks",
           "Workload": "workloads", "WorkloadPriorityClass": "workloadpriorityclasses"}


def contains(live: Any, want: Any) -> bool:
    """Whether ``live`` has every field of ``want`` with the same value (server defaults ignored)."""
    if isinstance(want, dict):
        return isinstance(live, dict) and all(contains(live.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(live, list) and len(live) == len(want) and all(contains(a, b) for a, b in zip(live, want, strict=True))
    if isinstance(want, str) and isinstance(live, str | int) and _QUANTITY.match(want) and _QUANTITY.match(str(live)):
        return quantity(live) == quantity(want)
    return bool(live == want)
