"""The `fleet` group (issue #43): every shipped values file placed by the real kube-scheduler on GKE-shaped GPU
nodes simulated by kwok, beside the local cluster's real node.

Each case (e2e/support/fleet_cases.py) gets its pools' Node objects (e2e/support/fleet_nodes.py: labels, taints,
GPUs and allocatable as GKE gives them), a namespace of the run, and `helm install` of the values file as shipped;
then the RayCluster's pods KubeRay makes are looked at: every worker bound by the scheduler to a node of the GPU
pool, one per node, requesting the node's GPUs, the head on a node without GPUs; or, for a file that cannot fit,
the workers left Pending with the scheduler's own reason. Then the release is uninstalled and the nodes deleted.

Pods on simulated nodes never run a container: kwok marks them Running. What this proves is placement (the chart's
node selectors, tolerations and requests against GKE's labels, taints and allocatable, decided by the real
scheduler), not training. The images are the values files' own and are never pulled there.

Only on the local cluster the harness started, with kwok running (its part built: e2e/build/parts.sh build kwok);
elsewhere each stage is "not run" with the reason: on a cluster the harness did not start, a simulated CPU node
without a taint would take other teams' pods. The nodes carry the run's label and are the run's: deleted at each
case's end, else by the run's clean-up or the next run after a hard kill (e2e/support/session.py, "nodes").
tests/e2e/test_fleet_stage.py runs this module with kubectl's and helm's answers replaced (no cluster here).
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

from e2e.support import fleet_cases, fleet_nodes
from e2e.support.errors import NotRun, StageError
from e2e.support.fleet_cases import Case
from e2e.support.nodes import unschedulable
from e2e.support.session import run_name

NODES_READY_S = 90
PODS_S = 180
NODE_TYPE = "ray.io/node-type"  # KubeRay's label: head | worker


def cluster_dir(h: Any) -> Path:
    """The local cluster's folder when kwok runs beside it; else NotRun with the reason."""
    cdir = next((d for kind, d in h.setup.stack if kind == "cluster"), None)
    if cdir is None:
        raise NotRun("the fleet group adds simulated GKE nodes, which it does only on the local cluster the harness "
                     "starts (its kwok manages exactly them); on a cluster the harness did not start an untainted "
                     "simulated node would take other teams' pods: run it without KUBECONFIG")
    pid_file = Path(cdir) / "run" / "kwok.pid"
    pid = pid_file.read_text().split()[0] if pid_file.is_file() else ""
    if not pid or not os.path.isdir(f"/proc/{pid}"):
        raise NotRun("kwok does not run beside the local cluster: build its part once (e2e/build/parts.sh build "
                     "kwok; not part of make e2e-parts) and run again")
    return Path(cdir)


def _kwok_log(cdir: Path) -> str:
    log = cdir / "logs" / "kwok.log"
    return "\n".join(log.read_text(errors="replace").splitlines()[-8:]) if log.is_file() else ""


CASE_TAGS = itertools.count(1)  # each case's nodes get names of their own


def create_nodes(h: Any, pools: tuple[fleet_nodes.Pool, ...], cdir: Path) -> dict[str, dict[str, Any]]:
    """The pools' nodes, created and waited on until kwok has them Ready (and the not-ready taint is gone)."""
    objs = fleet_nodes.nodes(list(pools), h.session.run_id, f"c{next(CASE_TAGS)}")
    h.kube.k("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}),
             timeout=120)
    names = {o["metadata"]["name"] for o in objs}

    def ready() -> bool:
        got = [n for n in h.kube.items("nodes", None, f"{fleet_nodes.RUN_LABEL}={h.session.run_id}")
               if n["metadata"]["name"] in names]
        return len(got) == len(names) and all(
            any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or [])
            and not any(t["key"] == "node.kubernetes.io/not-ready" for t in (n.get("spec") or {}).get("taints") or [])
            for n in got)

    try:
        h.kube.wait_for(f"kwok: {len(names)} simulated nodes Ready", ready, NODES_READY_S)
    except StageError as e:  # made, never Ready: not left behind either
        delete_nodes(h, sorted(names))
        raise StageError(f"{e}\nkwok's log ({cdir}/logs/kwok.log):\n{_kwok_log(cdir)}") from None
    return {o["metadata"]["name"]: o for o in objs}


def delete_nodes(h: Any, names: list[str]) -> None:
    if names:
        h.kube.k("delete", "nodes", *sorted(names), "--ignore-not-found", "--wait=false", check=False, timeout=120)


def ray_pods(h: Any, ns: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    pods = h.kube.items("pods", ns, NODE_TYPE)
    return ([p for p in pods if p["metadata"]["labels"][NODE_TYPE] == "head"],
            [p for p in pods if p["metadata"]["labels"][NODE_TYPE] == "worker"])


def settled(heads: list[dict[str, Any]], workers: list[dict[str, Any]], case: Case) -> bool:
    """The head bound and every worker the file asks for either bound or refused by the scheduler."""
    return (len(heads) == 1 and bool(heads[0]["spec"].get("nodeName")) and len(workers) == case.replicas
            and all(w["spec"].get("nodeName") or unschedulable(w) for w in workers))


def _gpus(obj: dict[str, Any]) -> int:
    return int(((obj.get("status") or {}).get("allocatable") or {}).get(fleet_nodes.GPU, 0) or 0)


def _requested_gpus(pod: dict[str, Any]) -> int:
    return sum(int(((c.get("resources") or {}).get("requests") or {}).get(fleet_nodes.GPU, 0) or 0)
               for c in pod["spec"]["containers"])


def _scheduled_message(pod: dict[str, Any]) -> str:
    return next((c.get("message", "") for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == "PodScheduled"), "")


def check(case: Case, heads: list[dict[str, Any]], workers: list[dict[str, Any]],
          nodes: dict[str, dict[str, Any]], head_node: dict[str, Any] | None) -> str:
    """The claim for one case, from the pods and nodes as the API server returned them; StageError when false."""
    pool = case.gpu_pool
    pool_nodes = {n for n, o in nodes.items() if o["metadata"]["labels"].get(fleet_nodes.POOL) == pool.name}
    where = f"{case.name} ({case.values.name})"
    if len(heads) != 1 or len(workers) != case.replicas:
        raise StageError(f"{where}: {len(heads)} head and {len(workers)} worker pods, expected 1 and {case.replicas}")
    head_on = heads[0]["spec"].get("nodeName", "")
    if head_node is None or _gpus(head_node):
        raise StageError(f"{where}: the head pod is on {head_on or 'no node'}, a node with GPUs (or gone): the head "
                         "belongs on a CPU node")
    bound = [w for w in workers if w["spec"].get("nodeName")]
    want = case.replicas if case.placed < 0 else case.placed
    if len(bound) != want:
        said = "; ".join(f"{w['metadata']['name']}: {_scheduled_message(w)}" for w in workers if w not in bound)
        raise StageError(f"{where}: {len(bound)} of {case.replicas} workers bound, expected {want}" +
                         (f" (the scheduler: {said})" if said else ""))
    on = [w["spec"]["nodeName"] for w in bound]
    if not set(on) <= pool_nodes:
        raise StageError(f"{where}: workers on {', '.join(sorted(set(on) - pool_nodes))}, not in pool {pool.name} "
                         f"({pool.machine_type})")
    if len(set(on)) != len(on):
        raise StageError(f"{where}: two workers on one node ({', '.join(on)}): one worker per node")
    for w in bound:
        if not _requested_gpus(w) == pool.gpus == _gpus(nodes[w["spec"]["nodeName"]]):
            raise StageError(f"{where}: worker {w['metadata']['name']} requests {_requested_gpus(w)} GPUs on a node "
                             f"of {_gpus(nodes[w['spec']['nodeName']])}")
    refused = [w for w in workers if w not in bound]
    for w in refused:
        if not unschedulable(w) or case.pending not in _scheduled_message(w):
            raise StageError(f"{where}: worker {w['metadata']['name']} is Pending without the scheduler saying "
                             f"{case.pending!r} (it says: {_scheduled_message(w) or 'nothing'})")
    text = (f"{where}: {len(bound)} of {case.replicas} workers on pool {pool.name} ({pool.nodes} x {pool.machine_type}, "
            f"{pool.gpus} x {pool.accelerator}{', ' + pool.capacity if pool.capacity != 'none' else ''}), one per node, "
            f"{pool.gpus} GPUs each; head on {head_on}")
    if refused:
        text += f"; {len(refused)} Pending: {_scheduled_message(refused[0])}"
    return text


def place(h: Any, case: Case, cdir: Path) -> str:
    """One case: its nodes, its release in a namespace of the run, the check; release and nodes gone after."""
    ns = h.namespace(run_name(case.name))
    nodes = create_nodes(h, case.pools, cdir)
    try:
        h.kube.h("install", case.name, str(fleet_cases.CHART), "-n", ns, "-f", str(case.values), timeout=180,
                 what=f"helm install {case.name} -f {case.values.name}")
        h.installed.append((ns, case.name))

        def pods() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            got = ray_pods(h, ns)
            return got if settled(*got, case) else None

        heads, workers = h.kube.wait_for(f"{case.name}: head bound, {case.replicas} workers bound or refused", pods,
                                         PODS_S, ns)
        head_on = heads[0]["spec"]["nodeName"]
        head_node = nodes.get(head_on) or h.kube.get("node", head_on, "default")
        text = check(case, heads, workers, nodes, head_node)
        h.uninstall(case.name, ns)
        # the next case makes nodes of the same names: a pod of this one still bound there would hold their CPUs
        # and memory (2026-12-04: a3-edgegpu-8g's workers "Insufficient cpu" beside a2-ultragpu-8g's)
        h.kube.wait_for(f"{case.name}: its pods gone before its nodes", lambda: not any(ray_pods(h, ns)), PODS_S, ns)
        return text
    finally:
        delete_nodes(h, list(nodes))


def values_files(h: Any) -> str:
    cdir = cluster_dir(h)
    cases, left = fleet_cases.values_cases()
    lines = [place(h, c, cdir) for c in cases]
    return "\n".join(lines + [f"{name}: not placed here ({why})" for name, why in sorted(left.items())])


def machine_families(h: Any) -> str:
    cdir = cluster_dir(h)
    out = h.out_dir / "fleet"
    return "\n".join(place(h, fleet_cases.family_case(mt, fleet_cases.family_values(mt, out)), cdir)
                     for mt in fleet_cases.families())


def cannot_fit(h: Any) -> str:
    cdir = cluster_dir(h)
    return "\n".join(place(h, c, cdir) for c in fleet_cases.cannot_fit_cases())
