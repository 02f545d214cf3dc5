"""What `fleet: Kueue on GPUs` installs and judges, as data and pure checks (issue #43, Kueue on GPUs).

The values are the chart's own for capacity that falls back (charts/gemma3-ray/ci/kueue-fallback-values.yaml: two
workers of 8 H200, capacity.type=fallback [reservation, flex-start, on-demand], reservation h200-reservation).
`gemma3-ray kueue setup` makes one ResourceFlavor per kind in that order, each with GPU quota for one job's workers
and the kind's GKE node labels, and a CPU flavor for the heads and submitters. The simulated fleet is sized from
that ClusterQueue as the API server returned it: one pool per GPU flavor, of the machine type the values' workers
fit (fleet_nodes.pool_for_values), with as many nodes as the flavor's GPU quota fills, and the kind's GKE labels
(a reservation pool with the reservation's labels, a flex-start pool, an on-demand pool with neither); a CPU pool
with a node per head.

Released one after another, job i must be admitted with its worker pod set on the i-th GPU flavor (the earlier
ones' quota being full) and its head and submitter on the CPU flavor; one job more than the GPU flavors hold waits
with Kueue's own reason, which names quota.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from e2e.support.errors import StageError
from e2e.support.fleet_cases import CHART, Case, effective
from e2e.support.fleet_nodes import GPU, Pool, cpu_pool, merged, pool_for_values

VALUES = CHART / "ci" / "kueue-fallback-values.yaml"
RELEASE = "f-kq"  # f-kq-1, f-kq-2, …: short, DNS
CPU_SETS = ("head", "submitter")  # Kueue's pod sets of a RayJob that are not a worker group
POOL_CAPACITY = {"reservation": "reservation", "flex-start": "flex-start", "on-demand": "none"}  # a kind's nodes


@dataclass(frozen=True)
class Plan:
    """The ClusterQueue's flavors as `kueue setup` made them, and the pools that hold exactly their GPU quota."""

    cluster_queue: str
    gpu_flavors: tuple[str, ...]  # in the ClusterQueue's order: the order Kueue tries them
    cpu_flavor: str
    pools: dict[str, Pool]  # GPU flavor -> its pool
    replicas: int  # workers of one job

    def case(self, release: str, flavor: str) -> Case:
        """The placement fleet.check judges for a release admitted on `flavor`: its workers on that flavor's pool."""
        return Case(release, VALUES, (self.cpu_pool, self.pools[flavor]), self.replicas)

    @property
    def cpu_pool(self) -> Pool:
        return cpu_pool(len(self.gpu_flavors))  # one e2-standard-32 per head (24 CPU each: two do not fit one)

    @property
    def all_pools(self) -> tuple[Pool, ...]:
        return (self.cpu_pool, *self.pools.values())


def release(i: int) -> str:
    return f"{RELEASE}-{i + 1}"


def _gpu_quota(flavor: dict[str, Any]) -> int:
    from gemma3_ray.kueue.objects import quantity

    got = next((quantity(r["nominalQuota"]) for r in flavor.get("resources") or [] if r["name"] == GPU), Decimal(0))
    return int(got)


def plan(cq_name: str, cq_spec: dict[str, Any], values: Path = VALUES) -> Plan:
    """The pools for the ClusterQueue `kueue setup` made from `values`; StageError when its flavors are not one per
    fallback kind, in the values' order, then the CPU flavor, or a GPU quota is not whole nodes."""
    v = effective(values)
    kinds = list(v["capacity"]["fallback"])
    flavors = [f for rg in cq_spec.get("resourceGroups") or [] for f in rg.get("flavors") or []]
    names = [f["name"] for f in flavors]
    want = [f"{cq_name}-{k}" for k in kinds] + [f"{cq_name}-cpu"]
    if names != want:
        raise StageError(f"ClusterQueue {cq_name}: flavors {names}, want {want} (capacity.fallback {kinds}, then the "
                         "CPU flavor of the heads)")
    base = pool_for_values(merged(v, {"capacity": {"type": "none"}}))
    reservation = v["capacity"].get("reservation") or ""
    pools = {}
    for kind, flavor in zip(kinds, flavors[:-1], strict=True):
        gpus = _gpu_quota(flavor)
        if gpus <= 0 or gpus % base.gpus:
            raise StageError(f"flavor {flavor['name']}: {GPU} quota {gpus}, not whole {base.machine_type} nodes of "
                             f"{base.gpus} GPUs")
        pools[flavor["name"]] = replace(base, name=kind, nodes=gpus // base.gpus, capacity=POOL_CAPACITY[kind],
                                        reservation=reservation if kind == "reservation" else "")
    return Plan(cq_name, tuple(names[:-1]), names[-1], pools, int(v["workers"]["replicas"]))


def of_rayjob(items: list[dict[str, Any]], rayjob: str) -> dict[str, Any] | None:
    """The Workload Kueue made for the RayJob (its owner), among a namespace's Workloads."""
    return next((w for w in items if rayjob in [o.get("name") for o in w["metadata"].get("ownerReferences") or []]),
                None)


def flavors_by_pod_set(workload: dict[str, Any]) -> dict[str, set[str]]:
    """status.admission: each pod set's flavors (one per resource); {} while not admitted."""
    admission = (workload.get("status") or {}).get("admission") or {}
    return {a.get("name", "?"): set((a.get("flavors") or {}).values()) for a in admission.get("podSetAssignments") or []}


def quota_wait(workload: dict[str, Any]) -> str:
    """Kueue's message while the Workload waits for quota (QuotaReserved False), else ''."""
    return next((c.get("message", "") for c in (workload.get("status") or {}).get("conditions") or []
                 if c.get("type") == "QuotaReserved" and c.get("status") == "False"), "")


def check_admission(p: Plan, release_: str, want: str, workload: dict[str, Any]) -> str:
    """Its worker pod sets on flavor `want`, its head and submitter on the CPU flavor; StageError otherwise."""
    got = flavors_by_pod_set(workload)
    workers = {s: f for s, f in got.items() if s not in CPU_SETS}
    if not workers or any(f != {want} for f in workers.values()):
        raise StageError(f"{release_}: workers admitted on {sorted(set().union(*workers.values())) if workers else []}"
                         f", want {want} (Kueue tries {', '.join(p.gpu_flavors)} in order; the ones before are full)")
    off = {s: sorted(f) for s, f in got.items() if s in CPU_SETS and f != {p.cpu_flavor}}
    if off:
        raise StageError(f"{release_}: {off} admitted off the CPU flavor {p.cpu_flavor}")
    return want


def check_waits(p: Plan, release_: str, workload: dict[str, Any] | None, pods: list[dict[str, Any]]) -> str:
    """One job more than the GPU flavors hold: not admitted, Kueue's reason naming quota, no pod made."""
    if workload is None:
        raise StageError(f"{release_}: no Workload (is Kueue managing the RayJob's queue?)")
    got = flavors_by_pod_set(workload)
    if got:
        raise StageError(f"{release_}: admitted ({', '.join(sorted(set().union(*got.values())))}) instead of waiting: "
                         f"the GPU flavors {', '.join(p.gpu_flavors)} hold {len(p.gpu_flavors)} jobs, each one's")
    reason = quota_wait(workload)
    if "quota" not in reason:
        raise StageError(f"{release_}: waits without Kueue's quota reason (QuotaReserved says {reason!r})")
    if pods:
        raise StageError(f"{release_}: waits, yet {len(pods)} Ray pods exist ({pods[0]['metadata']['name']}, …)")
    return reason
