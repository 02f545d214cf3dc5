"""Another team's objects on the shared cluster, for the `shared` drills (issue #42): made before a run as that team
would make them (no run label, common names such as `batch-high`), read back to the byte, and compared afterwards.

The set: a namespace with a LocalQueue, a ResourceFlavor and a ClusterQueue selecting only that namespace, a
WorkloadPriorityClass `batch-high-<tag>` and a PriorityClass, a ProvisioningRequestConfig where Kueue serves it, and a
Workload admitted by the real Kueue controller (a running job's admission: it holds quota in its ClusterQueue).
Names end in a tag of the drill's run (two drills on one cluster never meet), and carry no RUN_LABEL: a run's
clean-up that removed them would have removed "another team's" objects, which is what the drill must catch.

What is compared: for kinds no controller writes (the priority classes, the flavor, the ProvisioningRequestConfig),
the whole object as the API server returns it, resourceVersion included; for kinds whose status a controller keeps
(the namespace, the queues, the Workload), everything but `status` and the resourceVersion/managedFields that a
status write moves. The drill deletes them at its end by name and uid (the drill made them).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from e2e.support.errors import StageError
from e2e.support.kube import Kube

KUEUE = "kueue.x-k8s.io/v1beta2"
DRILL_LABEL = "gemma3-ray.dev/e2e-drill"  # the drill's own mark: how a person finds them after a hard kill
# kinds whose status a controller writes while the drill runs: status and its write's stamps are not compared
STATUS_KINDS = {"namespaces", "localqueues.kueue.x-k8s.io", "clusterqueues.kueue.x-k8s.io",
                "workloads.kueue.x-k8s.io"}


@dataclass
class Foreign:
    """One team's objects: (kind, namespace or '', name) in creation order, and their snapshot."""

    tag: str
    refs: list[tuple[str, str, str]] = field(default_factory=list)
    uids: dict[tuple[str, str, str], str] = field(default_factory=dict)
    before: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return f"other-team-{self.tag}"

    @property
    def names(self) -> dict[str, str]:
        t = self.tag
        return {"flavor": f"other-cpu-{t}", "cq": f"other-cq-{t}", "lq": "other-queue", "wpc": f"batch-high-{t}",
                "pc": f"other-training-{t}", "prc": f"other-prc-{t}", "wl": "other-running-job"}


def manifests(f: Foreign, with_prc: bool) -> list[tuple[str, dict[str, Any]]]:
    """(kind, object) of another team, in creation order."""
    n, ns, mark = f.names, f.namespace, {DRILL_LABEL: f.tag}
    out: list[tuple[str, dict[str, Any]]] = [
        ("namespaces", {"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": ns, "labels": {**mark, "team": "other"}}}),
        ("priorityclasses", {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": 500,
                             "metadata": {"name": n["pc"], "labels": mark}, "description": "another team's"}),
        ("workloadpriorityclasses.kueue.x-k8s.io", {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass",
                                                    "value": 100, "metadata": {"name": n["wpc"], "labels": mark}}),
        ("resourceflavors.kueue.x-k8s.io", {"apiVersion": KUEUE, "kind": "ResourceFlavor",
                                            "metadata": {"name": n["flavor"], "labels": mark}, "spec": {}}),
        ("clusterqueues.kueue.x-k8s.io", {
            "apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": n["cq"], "labels": mark},
            "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                     "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                         {"name": n["flavor"], "resources": [{"name": "cpu", "nominalQuota": "100m"},
                                                             {"name": "memory", "nominalQuota": "64Mi"}]}]}]}}),
        ("localqueues.kueue.x-k8s.io", {"apiVersion": KUEUE, "kind": "LocalQueue",
                                        "metadata": {"name": n["lq"], "namespace": ns, "labels": mark},
                                        "spec": {"clusterQueue": n["cq"]}}),
        ("workloads.kueue.x-k8s.io", {
            "apiVersion": KUEUE, "kind": "Workload", "metadata": {"name": n["wl"], "namespace": ns, "labels": mark},
            "spec": {"queueName": n["lq"], "priorityClassRef": {"group": "kueue.x-k8s.io",
                                                                "kind": "WorkloadPriorityClass", "name": n["wpc"]},
                     "priority": 100,
                     "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                         "restartPolicy": "Never", "containers": [{
                             "name": "c", "image": "registry.invalid/never-pulled:1",
                             "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}}}]}}}]}}),
    ]
    if with_prc:
        out.insert(4, ("provisioningrequestconfigs.kueue.x-k8s.io", {
            "apiVersion": KUEUE, "kind": "ProvisioningRequestConfig", "metadata": {"name": n["prc"], "labels": mark},
            "spec": {"provisioningClassName": "queued-provisioning.gke.io", "managedResources": ["nvidia.com/gpu"]}}))
    return out


def _ref(kind: str, obj: dict[str, Any]) -> tuple[str, str, str]:
    return kind, obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def get(kube: Kube, ref: tuple[str, str, str]) -> dict[str, Any] | None:
    kind, ns, name = ref
    return kube.get(kind, name, ns or "default")


def comparable(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    """What must not change: the whole object, or, for a kind a controller keeps the status of, all but the status
    and the stamps its write moves."""
    out = copy.deepcopy(obj)
    if kind in STATUS_KINDS:
        out.pop("status", None)
        out["metadata"].pop("resourceVersion", None)
        out["metadata"].pop("managedFields", None)
    return out


def make(kube: Kube, f: Foreign, with_prc: bool) -> None:
    """Create the team's objects (an existing one is refused: it is nobody's drill object) and record their uids."""
    for kind, obj in manifests(f, with_prc):
        proc = kube.k("create", "-f", "-", input_text=json.dumps(obj), check=False, timeout=60)
        if proc.returncode != 0:
            raise StageError(f"another team's {kind.split('.')[0]} {obj['metadata']['name']}: kubectl create exited "
                             f"{proc.returncode}: {proc.stderr.strip()[-300:]}")
        ref = _ref(kind, obj)
        f.refs.append(ref)
        got = get(kube, ref)
        if got is None:
            raise StageError(f"another team's {kind.split('.')[0]} {obj['metadata']['name']} is gone right after "
                             "its creation")
        f.uids[ref] = got["metadata"]["uid"]


def admitted(kube: Kube, f: Foreign) -> bool:
    wl = get(kube, ("workloads.kueue.x-k8s.io", f.namespace, f.names["wl"])) or {}
    return any(c.get("type") == "Admitted" and c.get("status") == "True"
               for c in (wl.get("status") or {}).get("conditions") or [])


def snapshot(kube: Kube, f: Foreign) -> None:
    for ref in f.refs:
        got = get(kube, ref)
        if got is None:
            raise StageError(f"another team's {ref[0].split('.')[0]} {ref[2]} is gone before the runs began")
        f.before[ref] = comparable(ref[0], got)


def changed(kube: Kube, f: Foreign) -> list[str]:
    """Every object of the team that is gone or differs from its snapshot, as 'kind name: what'."""
    out = []
    for ref, was in f.before.items():
        now = get(kube, ref)
        what = f"{ref[0].split('.')[0]} {ref[2]}"
        if now is None:
            out.append(f"{what}: deleted")
            continue
        now = comparable(ref[0], now)
        if now != was:
            keys = sorted(k for k in {*was, *now} if was.get(k) != now.get(k))
            meta = sorted(k for k in {*was["metadata"], *now["metadata"]}
                          if was["metadata"].get(k) != now["metadata"].get(k))
            out.append(f"{what}: {', '.join(keys)} changed" + (f" (metadata: {', '.join(meta)})" if meta else ""))
    return out


def remove(kube: Kube, f: Foreign) -> list[str]:
    """Delete what the drill made, newest first, each only while its uid is the one made (a kubectl precondition:
    an object of the same name made by someone else since is left alone)."""
    problems = []
    for ref in reversed(f.refs):
        kind, ns, name = ref
        if kind in {"localqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io"}:
            continue  # in the namespace, which goes with them
        body = json.dumps({"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": f.uids[ref]}})
        path = _path(kind, ns, name)
        proc = kube.k("delete", "--raw", path, "-f", "-", input_text=body, check=False, timeout=120)
        gone = ("NotFound", "not found", "UID in the precondition")  # ours is gone (one of that name is another's)
        if proc.returncode != 0 and not any(g in proc.stderr for g in gone):
            problems.append(f"deleting another team's {kind.split('.')[0]} {name}: {proc.stderr.strip()[-200:]}")
    return problems


def _path(kind: str, ns: str, name: str) -> str:
    resource, _, group = kind.partition(".")
    if not group:
        base = "/api/v1" if resource == "namespaces" else "/apis/scheduling.k8s.io/v1"
    else:
        base = f"/apis/{group}/v1beta2"
    return f"{base}/{f'namespaces/{ns}/' if ns else ''}{resource}/{name}"
