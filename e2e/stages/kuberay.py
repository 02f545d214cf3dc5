"""What KubeRay 1.6+ and Kueue flavors add, on the real operator (issue #34): the RayJob's deletion rules
(the workers gone when the job ends, the head kept for a set time, then nothing), and capacity that falls
back (with the first flavor's quota taken, the job is admitted on the second, and `gemma3-ray status` names it).

`preflight` tells the stage table what the running operator lacks (E2E_KUBERAY=v1.6.1 picks a newer one).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from e2e.support import nodes
from e2e.support.errors import StageError
from e2e.support.harness import VALUES, Harness, Run
from e2e.support.kube import Kube, ended, epoch
from e2e.support.session import run_name

KUBERAY_16 = "KubeRay >= 1.6"  # what the deletion-rule stage requires (stage_table `requires`)
DELETION_NS = run_name("g3r-deletion")  # unique per run (e2e/support/session.py)
WORKERS_AFTER_S, CLUSTER_AFTER_S = 0, 60
FALLBACK_NS = run_name("g3r-fallback")
RESERVATION = run_name("e2e-reservation")  # no node of the cluster carries it unless this run labels one
# One node stands for both capacity kinds (the local cluster's own, else E2E_NODE's; e2e/support/nodes.py): it
# carries the reservation's and flex-start's GKE labels, its values before recorded in the run's Lease and put back,
# so the job runs wherever Kueue admits it; which flavor admitted it is what the stage checks.
NODE_LABELS = {"cloud.google.com/reservation-name": RESERVATION, "cloud.google.com/reservation-affinity": "specific",
               "cloud.google.com/gke-flex-start": "true"}
SLACK_S = 5  # the operator's requeue and this poll's interval


def preflight(kube: Kube) -> dict[str, str]:
    """What the cluster's KubeRay lacks for these stages ({} when nothing): read from the served RayJob CRD, as
    `gemma3-ray up` reads it (spec.preRunningDeadlineSeconds came with 1.6.0, as the deletion rules' defaults)."""
    from gemma3_ray.kube import kuberay_crd

    proc = kube.k("get", "crd", "rayjobs.ray.io", "-o", "json", check=False, timeout=60)
    if proc.returncode != 0:
        return {KUBERAY_16: f"the RayJob CRD is not readable: {proc.stderr.strip()[-200:]}"}
    report = kuberay_crd.rayjob_spec_fields(json.loads(proc.stdout))
    if not report.supports("preRunningDeadlineSeconds"):
        return {KUBERAY_16: "its RayJob CRD lacks spec.preRunningDeadlineSeconds (KubeRay 1.5 or older; run with "
                            "E2E_KUBERAY=v1.6.1)"}
    return {}


def _cluster_pods(h: Harness, ns: str, cluster: str) -> dict[str, list[str]]:
    """The cluster's pods that are not being deleted, by ray.io/node-type (head, worker)."""
    out: dict[str, list[str]] = {"head": [], "worker": []}
    for p in h.kube.items("pods", ns, f"ray.io/cluster={cluster}"):
        if p["metadata"].get("deletionTimestamp"):
            continue
        out.setdefault(p["metadata"].get("labels", {}).get("ray.io/node-type", "?"), []).append(p["metadata"]["name"])
    return out


def deletion_rules(h: Harness) -> str:
    """rayJob.deletion (workers at once, the cluster after CLUSTER_AFTER_S): after SUCCEEDED the worker pods go while
    the head stays, the head stays at least CLUSTER_AFTER_S after the job's end, then no pod and no RayCluster is
    left, and the RayJob itself stays (DeleteCluster, not DeleteSelf)."""
    ns = h.namespace(DELETION_NS)
    run = h.helm_install("del", ns, sets={"rayJob.deletion.workersAfterSeconds": WORKERS_AFTER_S,
                                          "rayJob.deletion.clusterAfterSeconds": CLUSTER_AFTER_S})
    spec = (h.kube.get("rayjob", run.rayjob, ns) or {}).get("spec", {})
    if "shutdownAfterJobFinishes" in spec or not spec.get("deletionStrategy", {}).get("deletionRules"):
        raise StageError(f"RayJob {ns}/{run.rayjob} as served: no deletionRules, or shutdownAfterJobFinishes kept: "
                         f"{json.dumps(spec.get('deletionStrategy'))[:300]}")
    job = h.wait_run(run)
    cluster, end = job["status"]["rayClusterName"], epoch(job["status"]["endTime"])

    def head_only() -> dict[str, list[str]] | None:
        pods = _cluster_pods(h, ns, cluster)
        return pods if pods["head"] and not pods["worker"] else None

    kept = h.kube.wait_for(f"{cluster}: worker pods gone, head kept", head_only, CLUSTER_AFTER_S, ns)
    workers_gone_s = time.time() - end
    suspended = [g.get("suspend") for g in ((h.kube.get("raycluster", cluster, ns) or {}).get("spec") or {})
                 .get("workerGroupSpecs", [])]
    if suspended != [True]:
        raise StageError(f"RayCluster {cluster}: worker group suspend is {suspended}, want [True] (DeleteWorkers)")

    def head_gone() -> float | None:
        return time.time() if not _cluster_pods(h, ns, cluster)["head"] else None

    head_gone_at = h.kube.wait_for(f"{cluster}: the head deleted after {CLUSTER_AFTER_S} s", head_gone,
                                   CLUSTER_AFTER_S + 120, ns)
    if head_gone_at - end < CLUSTER_AFTER_S - SLACK_S:
        raise StageError(f"{cluster}: the head went {head_gone_at - end:.0f} s after the job ended, before the "
                         f"{CLUSTER_AFTER_S} s of clusterAfterSeconds")

    def nothing_left() -> bool:
        return (h.kube.get("raycluster", cluster, ns) is None
                and not h.kube.items("pods", ns, f"ray.io/cluster={cluster}"))

    h.kube.wait_for(f"{cluster}: no RayCluster and no pod left", nothing_left, 120, ns)
    after = h.kube.get("rayjob", run.rayjob, ns)
    if after is None or not ended(after.get("status")) or after["status"].get("jobStatus") != "SUCCEEDED":
        raise StageError(f"RayJob {ns}/{run.rayjob} should stay SUCCEEDED after DeleteCluster: {after and after.get('status')}")
    return (f"{run.rayjob} SUCCEEDED; workers gone {max(workers_gone_s, 0):.0f} s after its end with head "
            f"{kept['head'][0]} kept; head gone {head_gone_at - end:.0f} s after (clusterAfterSeconds "
            f"{CLUSTER_AFTER_S}); then no RayCluster, no pod; the RayJob stays")


# ------------------------------------------------------------------------------------------------ fallback
def _fallback_values(h: Harness) -> Path:
    path = h.out_dir / "fallback-local.yaml"
    path.write_text(json.dumps({"kueue": {"queueName": "fallback"},
                                "capacity": {"type": "fallback", "reservation": RESERVATION,
                                             "fallback": ["reservation", "flex-start"]}}, indent=2) + "\n")
    return path


def _admitted_flavors(h: Harness, run: Run) -> set[str]:
    for wl in h.kube.items("workloads", run.namespace):
        if run.rayjob in [o.get("name") for o in wl["metadata"].get("ownerReferences", [])]:
            admission = (wl.get("status") or {}).get("admission") or {}
            return {f for a in admission.get("podSetAssignments") or [] for f in (a.get("flavors") or {}).values()}
    return set()


def _head_selector(h: Harness, run: Run) -> dict[str, str]:
    """The nodeSelector of the run's head pod, once KubeRay made it after Kueue's admission."""
    def head() -> dict[str, Any] | None:
        cluster = ((h.kube.get("rayjob", run.rayjob, run.namespace) or {}).get("status") or {}).get("rayClusterName")
        pods = h.kube.items("pods", run.namespace, f"ray.io/cluster={cluster},ray.io/node-type=head") if cluster else []
        return pods[0] if pods else None
    return h.kube.wait_for(f"{run.rayjob}: head pod", head, 120, run.namespace)["spec"].get("nodeSelector") or {}


def fallback(h: Harness) -> str:
    """capacity.type=fallback [reservation, flex-start] with quota for one job per flavor: release A is admitted on
    the reservation flavor; with its quota taken, release B is admitted on flex-start; `gemma3-ray status` says so."""
    from e2e.stages.shared_cluster import _kueue_setup, claim_kueue

    node = nodes.node_for(h, "capacity fallback")  # NotRun on a cluster the harness did not start, without E2E_NODE
    try:
        nodes.change(h.kube, h.session.lease, node, labels=NODE_LABELS)
        ns = h.namespace(FALLBACK_NS)
        values = [_fallback_values(h)]
        said = _kueue_setup(h, ns, [VALUES, *values]).stdout
        cq, spec = claim_kueue(h, ns)
        order = [f["name"] for f in spec.get("resourceGroups", [{}])[0].get("flavors", [])]
        if order != [f"{cq}-reservation", f"{cq}-flex-start"]:
            raise StageError(f"ClusterQueue {cq}: flavors {order}, want reservation then flex-start\n{said[-400:]}")
        a = h.helm_install("fb-a", ns, values=values)
        first = h.kube.wait_for(f"{a.rayjob} admitted", lambda: _admitted_flavors(h, a), 120, ns)
        if first != {order[0]}:
            raise StageError(f"{a.rayjob} admitted on {sorted(first)}, want {order[0]} (the first flavor, with room)")
        job_a = h.kube.get("rayjob", a.rayjob, ns) or {}
        if ended(job_a.get("status")):
            raise StageError(f"{a.rayjob} already ended: its quota is free again, B cannot show the fallback")
        b = h.helm_install("fb-b", ns, values=values)
        second = h.kube.wait_for(f"{b.rayjob} admitted", lambda: _admitted_flavors(h, b), 120, ns)
        if second != {order[1]}:
            raise StageError(f"{b.rayjob} admitted on {sorted(second)}, want {order[1]} ({order[0]}'s quota is A's)")
        status = h.kube.run(["gemma3-ray", "status", "-n", ns, "--release", "fb-b", "--project", "gemma3-ray-e2e",
                             "--region", "us-central1"], what="gemma3-ray status", timeout=120).stdout
        if f"admitted on flavor {order[1]}" not in status:
            raise StageError(f"gemma3-ray status for B does not name flavor {order[1]}:\n{status[-600:]}")
        # Kueue put each flavor's node labels into the pods' nodeSelector (the GKE labels of that capacity).
        a_sel, b_sel = _head_selector(h, a), _head_selector(h, b)
        if a_sel.get("cloud.google.com/reservation-name") != RESERVATION or "cloud.google.com/gke-flex-start" in a_sel:
            raise StageError(f"{a.rayjob}'s head nodeSelector {a_sel}: want the reservation's labels only")
        if b_sel.get("cloud.google.com/gke-flex-start") != "true" or "cloud.google.com/reservation-name" in b_sel:
            raise StageError(f"{b.rayjob}'s head nodeSelector {b_sel}: want the flex-start label only")
        for release in ("fb-b", "fb-a"):  # two clusters on 2 cores: no need to train them to the end
            h.uninstall(release, ns)
        return (f"ClusterQueue {cq} flavors {order}; {a.rayjob} admitted on {order[0]} (head nodeSelector "
                f"reservation-name={RESERVATION}); {b.rayjob} on {order[1]} (gke-flex-start=true); "
                f"`gemma3-ray status`: admitted on flavor {order[1]}")
    finally:
        problems = nodes.restore(h.kube, h.session.lease)  # the values the node had, absent ones removed
        if problems and sys.exc_info()[0] is None:  # else the stage's own error stands; the clean-up tries again
            raise StageError(f"node {node}: its labels could not be put back: {'; '.join(problems)}")
