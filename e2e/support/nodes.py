"""The nodes a run may change, and every change undone.

A node of a cluster the harness did not start is never touched unless the user names it (E2E_NODE=<node>);
the one node of the local cluster the harness started is the run's own. A stage that needs a node to itself
gets one from `node_for`, else it is "not run" with the reason. Before a label, taint or cordon is changed,
the node's value before is written into the run's Lease (e2e/support/lease.py); `restore` puts it back (the
stage's own `finally`, the run's clean-up, or, after a hard kill, the next run's pre-clean reading the expired
Lease). A label that was absent is removed again; one that had a value gets it back.
"""

from __future__ import annotations

import json
import os
from typing import Any

from e2e.support.errors import NotRun, StageError
from e2e.support.kube import Kube
from e2e.support.lease import Lease, all_leases, expired, node_record, run_of

NODE_ENV = "E2E_NODE"


def node_for(h: Any, what: str) -> str:
    """The node `what` may label and cordon: E2E_NODE, else the local cluster's one node; else NotRun."""
    named = os.environ.get(NODE_ENV, "").strip()
    if named:
        if h.kube.get("node", named, "default") is None:
            raise StageError(f"{NODE_ENV}={named}: no such node in the cluster (kubectl get nodes lists them)")
        return named
    started_here = any(kind == "cluster" for kind, _ in h.setup.stack)
    nodes = h.kube.items("nodes", None)
    if started_here and len(nodes) == 1:
        return nodes[0]["metadata"]["name"]
    raise NotRun(f"{what} labels and cordons a node, and this cluster is not one the harness started: name a node "
                 f"it may use with {NODE_ENV}=<node> (its labels and cordon are put back at the end)")


def unschedulable(pod: dict[str, Any]) -> bool:
    """The scheduler's own word that the pod cannot be placed: PodScheduled=False, reason Unschedulable (a Pending
    pod pulling its image, or not yet looked at, is not)."""
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _node(kube: Kube, name: str) -> dict[str, Any]:
    node = kube.get("node", name, "default")
    if node is None:
        raise StageError(f"node {name} is gone")
    return node


def held_by_another(kube: Kube, lease: Lease, name: str) -> str:
    """The id of another run whose live Lease records changes to this node ('' when none): its record says what
    to put back, and a second record made now would take its changes for the node's own values."""
    return next((run_of(x) for x in all_leases(kube)
                 if run_of(x) != lease.run_id and not expired(x) and name in node_record(x)), "")


def change(kube: Kube, lease: Lease, name: str, *, labels: dict[str, str] | None = None, cordon: bool = False) -> None:
    """Set these labels (and cordon) on the node, its values before recorded in the Lease first. A node another live
    run has changed is refused (its record would be overwritten by values that are that run's)."""
    other = held_by_another(kube, lease, name)
    if other:
        raise StageError(f"node {name} is being changed by run {other} (its Lease records it): wait for that run to "
                         f"end, or name another node with {NODE_ENV}")
    node = _node(kube, name)
    now = node["metadata"].get("labels") or {}
    record = lease.nodes()
    before = record.setdefault(name, {"labels": {}})
    for key in labels or {}:
        before["labels"].setdefault(key, now.get(key))  # the first value seen is the one to put back
    if cordon and "unschedulable" not in before:
        before["unschedulable"] = bool(node["spec"].get("unschedulable"))
    lease.set_nodes(record)
    if labels:
        kube.k("label", "--overwrite", "node", name, *[f"{k}={v}" for k, v in labels.items()], timeout=60)
    if cordon:
        kube.k("cordon", name, timeout=60)


def restore_node(kube: Kube, name: str, before: dict[str, Any]) -> list[str]:
    """Put the node's recorded labels, taints and schedulability back; problems as sentences."""
    problems: list[str] = []
    node = kube.get("node", name, "default")
    if node is None:
        return []  # nothing to put back on a node that is gone
    add = {k: v for k, v in (before.get("labels") or {}).items() if v is not None}
    drop = [k for k, v in (before.get("labels") or {}).items() if v is None]
    argvs = []
    if add:
        argvs.append(["label", "--overwrite", "node", name, *[f"{k}={v}" for k, v in add.items()]])
    if drop:
        argvs.append(["label", "node", name, *[f"{k}-" for k in drop]])
    if "unschedulable" in before:
        argvs.append(["cordon" if before["unschedulable"] else "uncordon", name])
    if "taints" in before:
        argvs.append(["patch", "node", name, "--type=merge", "-p", json.dumps({"spec": {"taints": before["taints"]}})])
    for argv in argvs:
        proc = kube.k(*argv, check=False, timeout=60)
        if proc.returncode != 0 and "not found" not in proc.stderr:
            problems.append(f"kubectl {' '.join(argv[:3])}: {proc.stderr.strip()[-200:]}")
    return problems


def restore(kube: Kube, lease: Lease) -> list[str]:
    """Every node change the run's Lease records, undone; the record emptied once all went back."""
    record = lease.nodes()
    problems = [p for name, before in sorted(record.items()) for p in restore_node(kube, name, before)]
    if record and not problems:
        lease.set_nodes({})
    return problems
