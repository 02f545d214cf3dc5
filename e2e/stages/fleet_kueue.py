"""`fleet: Kueue on GPUs` (issue #43): the capacity fallback (reservation -> flex-start -> on-demand) decided by the
real Kueue on kwok-simulated GKE GPU pools, and the admitted jobs' pods placed there by the real kube-scheduler.

`gemma3-ray kueue setup --apply` for a namespace of the run, from the chart's fallback values
(e2e/support/fleet_fallback.py), its cluster-scoped objects labelled with the run's id (shared_cluster.claim_kueue:
the run's clean-up removes them); then one pool per GPU flavor sized to its quota, and a CPU pool. Releases are
installed one after another, each waited on until admitted and placed before the next: job 1 on the reservation
flavor, job 2 on flex-start, job 3 on on-demand, each one's workers bound to its flavor's pool (one per node, all
GPUs), its head on a CPU node; job 4 waits with Kueue's quota reason, which `gemma3-ray status` shows. Then every
release is uninstalled and the nodes deleted.

Pods on simulated nodes never run a container (kwok marks them Running): the claim is admission and placement. The
on-demand flavor's labels (the accelerator's only) also match the reservation and flex-start nodes; with those full
the scheduler has only the on-demand pool left, which is what job 3's placement shows. tests/e2e/test_fleet_kueue.py
runs this module with kubectl's and helm's answers replaced.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e.stages import fleet
from e2e.support import fleet_fallback as ff
from e2e.support.errors import StageError
from e2e.support.fleet_cases import CHART
from e2e.support.kube import ended
from e2e.support.session import run_name

ADMIT_S = 120
STATUS_ARGS = ("--project", "gemma3-ray-e2e", "--region", "us-central1")


def _rayjob(h: Any, ns: str, release: str) -> dict[str, Any] | None:
    jobs = h.kube.items("rayjobs", ns, f"app.kubernetes.io/instance={release}")
    return jobs[0] if jobs else None


def _workload(h: Any, ns: str, release: str) -> dict[str, Any] | None:
    job = _rayjob(h, ns, release)
    return ff.of_rayjob(h.kube.items("workloads", ns), job["metadata"]["name"]) if job else None


def _pods(h: Any, ns: str, release: str) -> list[dict[str, Any]]:
    cluster = ((_rayjob(h, ns, release) or {}).get("status") or {}).get("rayClusterName")
    return h.kube.items("pods", ns, f"ray.io/cluster={cluster}") if cluster else []


def _install(h: Any, ns: str, release: str) -> None:
    h.kube.h("install", release, str(CHART), "-n", ns, "-f", str(ff.VALUES), timeout=180,
             what=f"helm install {release} -f {ff.VALUES.name}")
    h.installed.append((ns, release))


def admitted(h: Any, p: ff.Plan, ns: str, i: int, nodes: dict[str, dict[str, Any]]) -> str:
    """Release i, admitted on the i-th GPU flavor and placed on that flavor's pool."""
    release, want = ff.release(i), p.gpu_flavors[i]
    _install(h, ns, release)

    def admission() -> dict[str, Any] | None:
        wl = _workload(h, ns, release)
        return wl if wl and ff.flavors_by_pod_set(wl) else None

    wl = h.kube.wait_for(f"{release}: admitted by Kueue", admission, ADMIT_S, ns)
    ff.check_admission(p, release, want, wl)
    case = p.case(release, want)

    def placed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        pods = _pods(h, ns, release)
        got = ([x for x in pods if x["metadata"]["labels"].get(fleet.NODE_TYPE) == "head"],
               [x for x in pods if x["metadata"]["labels"].get(fleet.NODE_TYPE) == "worker"])
        return got if fleet.settled(*got, case) else None

    heads, workers = h.kube.wait_for(f"{release}: head bound, {case.replicas} workers bound or refused", placed,
                                     fleet.PODS_S, ns)
    head_on = heads[0]["spec"]["nodeName"]
    text = fleet.check(case, heads, workers, nodes, nodes.get(head_on) or h.kube.get("node", head_on, "default"))
    return f"admitted on {want}; {text}"


def waits(h: Any, p: ff.Plan, ns: str) -> str:
    """One job more than the GPU flavors hold: it waits with Kueue's quota reason, shown by `gemma3-ray status`."""
    for i in range(len(p.gpu_flavors)):  # a job that ended gave its quota back: the next would rightly be admitted
        job = _rayjob(h, ns, ff.release(i)) or {}
        if ended(job.get("status")):
            raise StageError(f"{ff.release(i)} already ended ({job['status'].get('jobDeploymentStatus')}): its quota "
                             "is free again, so the next job cannot show the wait")
    release = ff.release(len(p.gpu_flavors))
    _install(h, ns, release)

    def decided() -> dict[str, Any] | None:
        wl = _workload(h, ns, release)
        return wl if wl and (ff.flavors_by_pod_set(wl) or ff.quota_wait(wl)) else None

    wl = h.kube.wait_for(f"{release}: admitted or waiting on quota", decided, ADMIT_S, ns)
    reason = ff.check_waits(p, release, wl, _pods(h, ns, release))
    status = h.kube.run(["gemma3-ray", "status", "-n", ns, "--release", release, *STATUS_ARGS],
                        what="gemma3-ray status", timeout=120).stdout
    if reason[:40] not in status:
        raise StageError(f"gemma3-ray status for {release} does not show Kueue's reason {reason!r}:\n{status[-600:]}")
    return f"{release} waits: {reason[:160]}"


def _uninstall_all(h: Any, ns: str, releases: list[str]) -> None:
    for release in releases:
        h.uninstall(release, ns)
    h.kube.wait_for("the releases' pods gone before their nodes",
                    lambda: not h.kube.items("pods", ns, "ray.io/cluster"), fleet.PODS_S, ns)


def kueue_on_gpus(h: Any) -> str:
    from e2e.stages.shared_cluster import _kueue_setup, claim_kueue

    cdir: Path = fleet.cluster_dir(h)
    ns = h.namespace(run_name("f-kueue"))
    _kueue_setup(h, ns, [ff.VALUES])
    cq, spec = claim_kueue(h, ns)
    p = ff.plan(cq, spec)
    nodes = fleet.create_nodes(h, p.all_pools, cdir)
    try:
        lines = [f"ClusterQueue {cq}: {', '.join(p.gpu_flavors)} then {p.cpu_flavor}; pools "
                 + ", ".join(f"{pool.name} {pool.nodes} x {pool.machine_type}" for pool in p.pools.values())]
        lines += [admitted(h, p, ns, i, nodes) for i in range(len(p.gpu_flavors))]
        lines.append(waits(h, p, ns))
        _uninstall_all(h, ns, [ff.release(i) for i in range(len(p.gpu_flavors) + 1)])
        return "\n".join(lines)
    finally:
        fleet.delete_nodes(h, list(nodes))
