"""The `shared` group (issue #42): `make e2e` on a shared, multi-node cluster touches only what it made.

The cluster: the local one the harness started, made multi-node by simulated GPU nodes (kwok, tainted as GKE taints
GPU nodes, so no pod of a run lands where no container runs) beside its real node. On it, another team's objects
(e2e/support/foreign.py: a namespace with a queue, Kueue objects with common names, a PriorityClass, a Workload the
real Kueue admitted) exist before the drills and are compared to the byte afterwards. Then:

- two runs at once: a second `make e2e --only first` from another cache, output and run id, through KUBECONFIG,
  runs beside this run's own release; both pass, and the second leaves nothing.
- killed mid elastic / killed mid capacity fallback: a second run named the real node (E2E_NODE) is SIGKILLed once
  its Lease records the node's cordon (labels); after its Lease expires, a third run removes what it left and puts
  the node back: every label, taint and the cordon as they were before the killed run began.

Only on the local cluster with kwok (the second runs use the images imported into its node); elsewhere "not run".
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from e2e.stages import fleet
from e2e.support import child_run, fleet_nodes, foreign
from e2e.support.child_run import Child
from e2e.support.errors import NotRun, StageError
from e2e.support.harness import Harness
from e2e.support.lease import LEASE_NAMESPACE, LEASE_S, RUN_LABEL, SKEW_S, lease_name, node_record
from e2e.support.session import run_name

SIMULATED_POOL = fleet_nodes.Pool("other-team-gpus", "a3-highgpu-8g", 3)
CHILD_RUN_S = 1200  # a second run's --only first on 2 loaded cores (setup + first: about 6 min, twice beside ours)
RECORDED_S = 600  # until a second run's Lease records its node change (its install and first checkpoint first)


def _local(h: Harness) -> tuple[Path, dict[str, str]]:
    """The local cluster's folder (kwok running) and the images imported into its node; else NotRun."""
    cdir = fleet.cluster_dir(h)
    if not (h.images.head and h.images.worker and h.setup.storage_image):
        raise NotRun("the drills start second runs with the images imported into the local node: they need the "
                     "`images` stage of this run")
    return cdir, {"head": h.images.head, "worker": h.images.worker, "storage": h.setup.storage_image}


def _real_node(h: Harness) -> str:
    real = [n["metadata"]["name"] for n in h.kube.items("nodes", None)
            if RUN_LABEL not in (n["metadata"].get("labels") or {})]
    if len(real) != 1:
        raise StageError(f"the local cluster has nodes {real} not made by this run: want its one real node")
    return real[0]


def _cluster(h: Harness) -> tuple[str, dict[str, str], list[str]]:
    """Multi-node: the real node and the simulated ones (made once per run, the run's own); the other team's
    objects made and snapshotted once (removed by the run's clean-up)."""
    cdir, images = _local(h)
    state = h.record.facts.setdefault("shared", {})
    if "simulated" not in state:
        state["real_node"] = _real_node(h)
        state["simulated"] = sorted(fleet.create_nodes(h, (SIMULATED_POOL,), cdir))
    if not any(kind == "foreign" for kind, _ in h.setup.stack):
        team = foreign.Foreign(tag=h.session.run_id)
        h.setup.stack.append(("foreign", team))  # the clean-up removes it, by uid
        with_prc = h.kube.get("crd", "provisioningrequestconfigs.kueue.x-k8s.io", "default") is not None
        foreign.make(h.kube, team, with_prc)
        h.kube.wait_for("another team's Workload admitted by Kueue", lambda: foreign.admitted(h.kube, team), 120)
        foreign.snapshot(h.kube, team)
    return state["real_node"], images, state["simulated"]


def _team(h: Harness) -> foreign.Foreign:
    return next(obj for kind, obj in h.setup.stack if kind == "foreign")


def _untouched(h: Harness, after: str) -> str:
    diff = foreign.changed(h.kube, _team(h))
    if diff:
        raise StageError(f"after {after}, another team's objects changed: {'; '.join(diff)}")
    return f"another team's {len(_team(h).before)} objects byte-for-byte as before"


def _child(h: Harness, name: str, images: dict[str, str], node: str = "") -> tuple[Path, dict[str, str]]:
    work = h.out_dir / "second-runs" / name
    work.mkdir(parents=True, exist_ok=True)
    run_id = f"{h.session.run_id[:3]}{name[:3]}"[:6]
    return work, child_run.child_env(h.kube.kubeconfig, work, run_id, images, node)


def _passed(child: Child, rc: int) -> str:
    summary = child.summary()
    if rc != 0 or summary.get("result") != "pass":
        raise StageError(f"the second run {child.name} ended {rc} with result {summary.get('result')!r}:\n"
                         f"{child.tail()}")
    return summary.get("reason") or f"{len(summary.get('selected') or [])} selected stages passed"


def _nothing_of(h: Harness, run_id: str) -> list[str]:
    sel = f"{RUN_LABEL}={run_id}"
    left = [f"namespace/{n['metadata']['name']}" for n in h.kube.items("namespaces", None, sel)]
    left += [f"lease/{x['metadata']['name']}" for x in h.kube.items("leases", LEASE_NAMESPACE, sel)]
    return left


# ---------------------------------------------------------------------------------------------- stages
def two_runs(h: Harness) -> str:
    """Another team's objects, then a second make e2e (--only first, its own cache and run id) beside this run's own
    release: both pass, the second leaves nothing, the other team's objects are as they were."""
    node, images, sims = _cluster(h)
    work, env = _child(h, "beside", images)
    child = child_run.start("beside", "first", work, env)
    try:
        ns = h.namespace(run_name("g3r-shared"))
        mine = h.helm_install("shared-a", ns)
        h.wait_run(mine)
        ran = _passed(child, child.wait(CHILD_RUN_S))
    finally:
        child.stop()
    left = _nothing_of(h, child.run_id)
    if left:
        raise StageError(f"the second run {child.run_id} passed but left {left}")
    h.uninstall("shared-a", ns)
    return (f"{len(sims) + 1} nodes; {mine.rayjob} SUCCEEDED beside a second run {child.run_id} (--only first: "
            f"{ran}); {_untouched(h, 'two runs at once')}")


def _node_state(h: Harness, node: str) -> dict[str, Any]:
    got = h.kube.get("node", node, "default") or {}
    return {"labels": got.get("metadata", {}).get("labels") or {},
            "taints": (got.get("spec") or {}).get("taints") or [],
            "unschedulable": bool((got.get("spec") or {}).get("unschedulable"))}


def _killed_then_restored(h: Harness, name: str, only: str, recorded) -> str:
    """A second run named the real node is SIGKILLed once its Lease records the change `recorded` looks for; a
    third run, after that Lease expired, removes what it left and puts the node back as it was."""
    node, images, _ = _cluster(h)
    before = _node_state(h, node)
    work, env = _child(h, name, images, node)
    child = child_run.start(name, only, work, env)
    try:
        def changed() -> bool:
            lease = h.kube.get("lease", lease_name(child.run_id), LEASE_NAMESPACE)
            return bool(lease) and recorded(node_record(lease).get(node) or {})
        child_run.wait_until(child, f"its Lease recording node {node}'s change", changed, RECORDED_S)
        time.sleep(3)  # the change itself follows its record
        child.kill()
    finally:
        child.stop()
    during = _node_state(h, node)
    left = _nothing_of(h, child.run_id)
    time.sleep(LEASE_S + SKEW_S + 5)  # the killed run's Lease expires: only then is it an ended run's
    work3, env3 = _child(h, f"after-{name}", images)
    after = child_run.start(f"after-{name}", "install", work3, env3)  # its preflight pre-cleans
    try:
        rc = after.wait(600)
    finally:
        after.stop()
    said = after.log.read_text(errors="replace") if after.log.is_file() else ""
    if rc != 0 or f"run {child.run_id} (Lease expired" not in said:
        raise StageError(f"the run after the kill (exit {rc}) did not name run {child.run_id}'s leftovers:\n"
                         f"{after.tail()}")
    now = _node_state(h, node)
    if now != before:
        diff = {k: (before[k], now[k]) for k in before if before[k] != now[k]}
        raise StageError(f"node {node} after the killed run's leftovers were removed differs from before: "
                         f"{json.dumps(diff)[:600]}")
    still = _nothing_of(h, child.run_id)
    if still:
        raise StageError(f"after the next run's pre-clean, run {child.run_id}'s {still} remain")
    changed_keys = sorted(k for k in before if before[k] != during[k])
    return (f"run {child.run_id} killed with node {node}'s {', '.join(changed_keys) or 'record'} changed and "
            f"{', '.join(left) or 'nothing'} left; the next run named and removed them; node {node} as before; "
            f"{_untouched(h, name)}")


def killed_elastic(h: Harness) -> str:
    return _killed_then_restored(h, "elastic", "install,elastic", lambda rec: "unschedulable" in rec)


def killed_fallback(h: Harness) -> str:
    return _killed_then_restored(h, "fallback", "capacity fallback", lambda rec: bool(rec.get("labels")))
