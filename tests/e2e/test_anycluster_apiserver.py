"""make e2e's preflight and its clean-up of cluster-scoped objects, on the real kube-apiserver of the test
session (../shared/kube-apiserver with KubeRay's and Kueue's CRDs; no controllers, no nodes)."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.support.kube import Kube
from e2e.support.preflight import preflight
from e2e.support.session import RUN_LABEL, Session

OWNER = {"app.kubernetes.io/managed-by": "gemma3-ray-kueue-setup"}
CHART_SPEC = {"entrypoint": "python -m x", "rayClusterSpec": {}, "backoffLimit": 0, "submissionMode": "K8sJobMode"}


def _apply(kube: Kube, *objs: dict) -> None:
    kube.run([kube.kubectl, "apply", "-f", "-"], input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                       "items": list(objs)}))


def _kueue(kind: str, name: str, spec: dict, ns: str = "", labels: dict | None = None) -> dict:
    meta = {"name": name, "labels": labels or {}} | ({"namespace": ns} if ns else {})
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind, "metadata": meta, "spec": spec}


def _cq(name: str, flavor: str) -> dict:
    return _kueue("ClusterQueue", name, {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["cpu"],
                  "flavors": [{"name": flavor, "resources": [{"name": "cpu", "nominalQuota": 1}]}]}]}, labels=OWNER)


def test_preflight_names_kuberay_kueue_and_the_missing_worker_node(kueue_crds: Path, tmp_path: Path) -> None:
    kube = Kube(kueue_crds, tmp_path / "log")
    facts = preflight(kube, CHART_SPEC)
    assert facts.kuberay.startswith("ray.io/v1") and facts.kuberay_problem == ""
    assert facts.kueue.startswith("kueue.x-k8s.io/v1beta2") and facts.kueue_problem == ""
    assert facts.worker_node == "" and "no schedulable worker node" in facts.worker_problem
    assert facts.server.startswith("v1.")
    # No operator Deployment on this bare server, no version label on the CRD files: the line says where it looked.
    assert facts.kuberay == ("ray.io/v1, version unknown: no Deployment in the cluster runs a kuberay image and the "
                             "CRD has no app.kubernetes.io/version label (an operator outside the cluster, as the "
                             "local cluster's host process, is not seen here)"), facts.kuberay
    # a field the cluster's KubeRay does not know: the run stops with one sentence naming it
    facts = preflight(kube, {**CHART_SPEC, "notAKubeRayField": 1})
    assert "spec.notAKubeRayField" in facts.kuberay_problem and "upgrade KubeRay" in facts.kuberay_problem


def test_the_run_removes_exactly_the_cluster_scoped_objects_it_made(kueue_crds: Path, tmp_path: Path) -> None:
    """What the run made carries its id (its namespaces at creation, kueue setup's objects by `claim`); another
    team's objects, there before the run, are never touched (more in tests/e2e/test_e2e_ownership.py)."""
    kube = Kube(kueue_crds, tmp_path / "log")
    kube.k("create", "namespace", "other-team")
    _apply(kube, _kueue("ResourceFlavor", "shared-cpu", {}, labels=OWNER), _cq("other-team-queue", "shared-cpu"),
           _kueue("LocalQueue", "queue", {"clusterQueue": "other-team-queue"}, ns="other-team"))
    run = Session(kube, run_id="t1")
    run.snapshot()
    ns = run.name("g3r-team-a")
    kube.k("create", "namespace", ns)
    kube.k("label", "namespace", ns, *(f"{k}={v}" for k, v in run.labels.items()))
    _apply(kube, _kueue("ResourceFlavor", "e2e-cpu", {}, labels=OWNER), _cq(f"{ns}-queue", "e2e-cpu"),
           _kueue("LocalQueue", "queue", {"clusterQueue": f"{ns}-queue"}, ns=ns),
           {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass", "value": 100,
            "metadata": {"name": "batch-high-t1", "labels": OWNER}})
    kube.k("create", "priorityclass", "ml-training-t1", "--value=900", "--description=e2e: test")
    kube.k("label", "priorityclass", "ml-training-t1", f"{RUN_LABEL}=t1")
    run.claim([("clusterqueues.kueue.x-k8s.io", f"{ns}-queue"), ("resourceflavors.kueue.x-k8s.io", "e2e-cpu"),
               ("workloadpriorityclasses.kueue.x-k8s.io", "batch-high-t1")])

    objs = run.cluster_objects()
    assert sorted(objs) == sorted([("clusterqueues.kueue.x-k8s.io", f"{ns}-queue"),
                                   ("resourceflavors.kueue.x-k8s.io", "e2e-cpu"),
                                   ("workloadpriorityclasses.kueue.x-k8s.io", "batch-high-t1"),
                                   ("priorityclasses", "ml-training-t1")])
    assert set(run.left()) >= {f"namespace/{ns}", f"clusterqueues/{ns}-queue", "resourceflavors/e2e-cpu",
                               "workloadpriorityclasses/batch-high-t1", "priorityclasses/ml-training-t1"}
    assert run.delete(objs, []) == []
    assert run.left() == [f"namespace/{ns}"]  # (no namespace controller here to finish its deletion)
    assert kube.get("clusterqueue", "other-team-queue", "default") is not None
    assert kube.get("resourceflavor", "shared-cpu", "default") is not None
