"""GKE-shaped node pools, simulated: the Node objects kwok keeps Ready, generated from one source.

The shapes come from what the plugin already knows (plugin/gemma3_ray/config/machine_shapes.py: a machine
type's accelerator, GPUs, vCPUs and memory); the labels, taints and allocatable are the ones GKE gives such a
node, each from the GKE page that says so:

- ``cloud.google.com/gke-nodepool: <pool>`` on every node of a node pool — "About node pools",
  https://cloud.google.com/kubernetes-engine/docs/concepts/node-pools
- ``cloud.google.com/gke-accelerator: <accelerator>``, ``nvidia.com/gpu`` capacity and allocatable (the GPUs of the
  machine type) and the taint ``nvidia.com/gpu=present:NoSchedule`` that GKE puts on GPU nodes of a cluster that
  also has non-GPU nodes, with its ExtendedResourceToleration admission adding the toleration to pods that request
  GPUs — "Run GPUs in GKE Standard node pools", https://cloud.google.com/kubernetes-engine/docs/how-to/gpus
- ``cloud.google.com/gke-gpu-driver-version: latest|default`` on nodes whose driver GKE installs (the pool's
  ``gpu-driver-version``, the plugin's ``cluster create`` asks LATEST) — the same page, "Install NVIDIA GPU device
  drivers", and https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-gpus
- ``cloud.google.com/reservation-name``, ``cloud.google.com/reservation-affinity: specific`` (and
  ``cloud.google.com/reservation-project``, ``cloud.google.com/reservation-blocks`` for a shared reservation or a
  block) — "Consuming reserved zonal resources",
  https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations: the node selector a workload
  consumes a specific reservation with, which the nodes GKE makes for it satisfy
- ``cloud.google.com/gke-spot: "true"`` and the taint ``cloud.google.com/gke-spot=true:NoSchedule`` —
  "Spot VMs", https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms
- ``cloud.google.com/gke-flex-start: "true"`` — "Run a large-scale workload with flex-start",
  https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training; with queued provisioning
  also the taint ``cloud.google.com/gke-queued=true:NoSchedule`` —
  https://cloud.google.com/kubernetes-engine/docs/how-to/provisioningrequest
- allocatable CPU and memory: capacity less GKE's reservation for the system (6% of the first core, 1% of the
  next, 0.5% of the next 2, 0.25% above 4; memory 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8,
  6% of the next 112, 2% above 128, and 100 MiB for eviction) — "Plan GKE Standard node sizes",
  https://cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes
- ``kubernetes.io/hostname``, ``kubernetes.io/arch``, ``kubernetes.io/os``, ``node.kubernetes.io/instance-type``,
  ``topology.kubernetes.io/region``/``zone``: Kubernetes' well-known labels, which GKE sets
  (https://kubernetes.io/docs/reference/labels-annotations-taints/).

Modelled: placement (labels, taints, allocatable) of the pools the plugin's ``cluster create`` makes and of the
pools the values files select. Not modelled: Autopilot and node auto-provisioning (GKE making nodes for a
pending pod; here the pool exists before the install), the GPU device plugin and driver pods, compact placement,
TPUs, GKE's own system pods taking part of allocatable, and multi-zone pools. That a Standard pool created with a
specific reservation affinity carries the reservation labels on its nodes is assumed (GKE documents them as the
selector that consumes the reservation), not checked against GKE.

Each node carries kwok's annotation ``kwok.x-k8s.io/node: fake`` and the label kwok is told to manage
(KWOK_LABEL; e2e/cluster/cluster.sh starts kwok with ``--manage-nodes-with-label-selector``), so kwok keeps these
nodes Ready and plays their pods' lifecycle while the real node's kubelet runs real pods; and the run's label
(RUN_LABEL=<run id>): the nodes are the run's, deleted at its end (e2e/support/session.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gemma3_ray.config import machine_shapes

from e2e.support.lease import RUN_LABEL
from e2e.support.placement import quantity

KWOK_LABEL = ("kwok.x-k8s.io/node", "fake")  # the label kwok manages here, also kwok's conventional annotation
POOL = "cloud.google.com/gke-nodepool"
ACCEL = "cloud.google.com/gke-accelerator"
DRIVER = "cloud.google.com/gke-gpu-driver-version"
GPU = "nvidia.com/gpu"
GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
QUEUED_TAINT = {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"}
CAPACITIES = ("none", "reservation", "spot", "flex-start", "queued")
CPU_POOL_MACHINE = "e2-standard-32"  # the plugin's Standard cluster's CPU pool (gke/cluster.py DEFAULT_CPU_MACHINE_TYPE)
_CPU_RE = re.compile(r"^(?P<family>e2|n2|n2d)-standard-(?P<vcpus>\d+)$")  # 4 GB per vCPU
BOOT_DISK_GIB = 100
ARM_FAMILIES = ("a4x-",)  # GB200: Arm (Grace) hosts


@dataclass(frozen=True)
class Pool:
    """One node pool: its GKE name, machine type, size and how its GPUs come (capacity, reservation, driver)."""

    name: str
    machine_type: str
    nodes: int
    capacity: str = "none"  # none | reservation | spot | flex-start | queued
    reservation: str = ""  # as values give it: NAME, or projects/P/reservations/NAME, either [/reservationBlocks/B]
    driver: str = "latest"  # cloud.google.com/gke-gpu-driver-version ("" for none; ignored on a CPU pool)
    zone: str = "us-central1-a"

    @property
    def accelerator(self) -> str:
        return _gpu_shape(self.machine_type)[0]

    @property
    def gpus(self) -> int:
        return _gpu_shape(self.machine_type)[1]


def _gpu_shape(machine_type: str) -> tuple[str, int]:
    if _CPU_RE.match(machine_type):
        return "", 0
    shape = machine_shapes.shape_for_machine_type(machine_type)
    return shape.accelerator, shape.gpus_per_node


def node_size(machine_type: str) -> tuple[int, int]:
    """(vCPUs, memory GiB) of a machine type: machine_shapes' for GPU machines, 4 GiB per vCPU for e2/n2-standard."""
    m = _CPU_RE.match(machine_type)
    if m:
        return int(m.group("vcpus")), 4 * int(m.group("vcpus"))
    size = machine_shapes.node_size(machine_type)
    if size is None:
        raise ValueError(f"machine type {machine_type}: its vCPUs and memory are not known to machine_shapes")
    return size


def allocatable(vcpus: int, memory_gib: int) -> tuple[int, int]:
    """(CPU millicores, memory MiB) GKE leaves to pods on a node of this size (plan-node-sizes' reservation)."""
    cpu_tiers = ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025))
    mem_tiers = ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02))

    def reserved(total: float, tiers: tuple[tuple[float, float], ...]) -> float:
        out, left = 0.0, total
        for size, share in tiers:
            take = min(left, size)
            out += take * share
            left -= take
        return out

    cpu_m = int(vcpus * 1000 - reserved(vcpus, cpu_tiers) * 1000)
    mem_mi = int(memory_gib * 1024 - reserved(memory_gib, mem_tiers) * 1024 - 100)
    return cpu_m, mem_mi


def _reservation_parts(reservation: str) -> dict[str, str]:
    """The chart's split of a reservation (templates/_placement.tpl): name, project, block."""
    m = re.match(r"^(?:projects/(?P<project>[^/]+)/reservations/)?(?P<name>[^/]+)(?:/reservationBlocks/(?P<block>.+))?$",
                 reservation)
    if not m:
        raise ValueError(f"reservation {reservation!r}: give NAME or projects/P/reservations/NAME[/reservationBlocks/B]")
    return {k: v for k, v in m.groupdict().items() if v}


def labels(pool: Pool, index: int, run_id: str, tag: str = "") -> dict[str, str]:
    name = node_name(pool, index, run_id, tag)
    out = {
        "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "arm64" if pool.machine_type.startswith(ARM_FAMILIES) else "amd64",
        "node.kubernetes.io/instance-type": pool.machine_type,
        "topology.kubernetes.io/zone": pool.zone, "topology.kubernetes.io/region": pool.zone.rsplit("-", 1)[0],
        POOL: pool.name, KWOK_LABEL[0]: KWOK_LABEL[1], RUN_LABEL: run_id,
    }
    if pool.gpus:
        out[ACCEL] = pool.accelerator
        if pool.driver:
            out[DRIVER] = pool.driver
    if pool.capacity == "reservation":
        parts = _reservation_parts(pool.reservation)
        out["cloud.google.com/reservation-name"] = parts["name"]
        out["cloud.google.com/reservation-affinity"] = "specific"
        if "project" in parts:
            out["cloud.google.com/reservation-project"] = parts["project"]
        if "block" in parts:
            out["cloud.google.com/reservation-blocks"] = parts["block"]
    elif pool.capacity == "spot":
        out["cloud.google.com/gke-spot"] = "true"
    elif pool.capacity in ("flex-start", "queued"):
        out["cloud.google.com/gke-flex-start"] = "true"
    return out


def taints(pool: Pool) -> list[dict[str, str]]:
    out = [dict(GPU_TAINT)] if pool.gpus else []
    if pool.capacity == "spot":
        out.append(dict(SPOT_TAINT))
    if pool.capacity == "queued":
        out.append(dict(QUEUED_TAINT))
    return out


def node_name(pool: Pool, index: int, run_id: str, tag: str = "") -> str:
    """`tag` keeps one case's nodes apart from another's: a name made again right after its node went meets what
    the cluster still holds of the old one (2026-12-04: the next case's nodes looked full)."""
    return f"fleet-{run_id}-{tag + '-' if tag else ''}{pool.name}-{index}"


def node(pool: Pool, index: int, run_id: str, tag: str = "") -> dict[str, Any]:
    """The Node object of the pool's index-th node (status as a kubelet would register it; kwok keeps it Ready)."""
    if pool.capacity not in CAPACITIES:
        raise ValueError(f"pool {pool.name}: capacity {pool.capacity!r} is not one of {', '.join(CAPACITIES)}")
    if pool.capacity == "reservation" and not pool.reservation:
        raise ValueError(f"pool {pool.name}: capacity reservation needs the reservation's name")
    vcpus, mem = node_size(pool.machine_type)
    cpu_m, mem_mi = allocatable(vcpus, mem)
    res = {"cpu": str(vcpus), "memory": f"{mem}Gi", "ephemeral-storage": f"{BOOT_DISK_GIB}Gi", "pods": "110"}
    alloc = {"cpu": f"{cpu_m}m", "memory": f"{mem_mi}Mi", "ephemeral-storage": f"{int(BOOT_DISK_GIB * 0.9)}Gi",
             "pods": "110"}
    if pool.gpus:
        res[GPU] = alloc[GPU] = str(pool.gpus)
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(pool, index, run_id, tag), "labels": labels(pool, index, run_id, tag),
                     "annotations": {KWOK_LABEL[0]: KWOK_LABEL[1], "node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"taints": taints(pool)} if taints(pool) else {},
        "status": {"capacity": res, "allocatable": alloc, "phase": "Running"},
    }


def nodes(pools: list[Pool], run_id: str, tag: str = "") -> list[dict[str, Any]]:
    return [node(p, i, run_id, tag) for p in pools for i in range(p.nodes)]


def cpu_pool(nodes_: int = 1, machine_type: str = CPU_POOL_MACHINE) -> Pool:
    """The Standard cluster's CPU pool, which holds the Ray head (gke/cluster.py's cpu-pool)."""
    return Pool("cpu-pool", machine_type, nodes_)


def machine_for(accelerator: str, gpus: int, cpu: float, memory_gib: float) -> str:
    """The smallest machine type of this accelerator and GPU count whose allocatable fits one worker's requests
    (what a platform team would make the pool of for a values file); ValueError when none does."""
    fits = []
    for mt in machine_shapes.KNOWN_MACHINE_TYPES:
        if _gpu_shape(mt) != (accelerator, gpus) or machine_shapes.node_size(mt) is None:
            continue
        cpu_m, mem_mi = allocatable(*node_size(mt))
        if cpu_m >= cpu * 1000 and mem_mi >= memory_gib * 1024:
            fits.append((node_size(mt), mt))
    if not fits:
        raise ValueError(f"no machine type of {gpus} x {accelerator} fits a worker requesting {cpu} CPU and "
                         f"{memory_gib} GiB")
    return min(fits)[1]


def pool_from_plugin(node_pool: Any) -> Pool:
    """The Pool GKE makes of a Container API NodePool (the plugin's gke/cluster.py gpu_node_pool): its name, machine
    type, node count (autoscaled pools: their maximum), driver version, reservation affinity, flex-start, queued."""
    cfg = node_pool.config
    accel = cfg.accelerators[0] if cfg.accelerators else None
    driver = ""
    if accel is not None and accel.gpu_driver_installation_config.gpu_driver_version:
        driver = type(accel.gpu_driver_installation_config).GPUDriverVersion(
            accel.gpu_driver_installation_config.gpu_driver_version).name.lower()
    count = node_pool.initial_node_count or node_pool.autoscaling.total_max_node_count
    capacity, reservation = "none", ""
    if node_pool.queued_provisioning.enabled:
        capacity = "queued"
    elif cfg.flex_start:
        capacity = "flex-start"
    elif cfg.reservation_affinity.values:
        capacity, reservation = "reservation", cfg.reservation_affinity.values[0]
    if driver in ("installation_disabled", "gpu_driver_version_unspecified"):
        driver = ""
    return Pool(node_pool.name, cfg.machine_type, count, capacity=capacity, reservation=reservation, driver=driver,
                zone=(node_pool.locations or ["us-central1-a"])[0])


def pool_for_values(values: dict[str, Any], name: str = "gpu-pool") -> Pool:
    """The GPU pool a values file (merged over the chart's defaults) is for: its accelerator, GPUs per node and
    replicas, the smallest machine type whose node fits one worker's requests, its capacity, reservation and
    driver version. ValueError for CPU-only workers or a shape no machine type has."""
    w = values["workers"]
    gpus = int(w.get("gpusPerNode") or 0)
    if not gpus or w.get("accelerator") in (None, "", "none"):
        raise ValueError("CPU-only workers (workers.gpusPerNode 0): no GPU pool")
    req = (w.get("resources") or {}).get("requests") or {}
    machine = machine_for(w["accelerator"], gpus, quantity(req.get("cpu", 0)), quantity(req.get("memory", 0)) / 2**30)
    cap = values.get("capacity") or {}
    return Pool(name, machine, int(w.get("replicas") or 1), capacity=cap.get("type") or "none",
                reservation=cap.get("reservation") or "", driver=w.get("gpuDriverVersion") or "")


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Values laid over values, as Helm does (maps merged key by key, anything else replaced)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
