"""What a release has on the API server: its objects by kind, the live RayJob, and what they reference."""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kube_api import ApiServer

HELM_TIMEOUT_S = 240
# Every namespaced kind the chart, its hooks or KubeRay (here: cluster_sim) create.
KINDS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "RayJob": "/apis/ray.io/v1/namespaces/{ns}/rayjobs",
    "RayCluster": "/apis/ray.io/v1/namespaces/{ns}/rayclusters",
}
# What a namespace holds before any release: the `default` ServiceAccount.
BASELINE = {("ServiceAccount", "default")}


@dataclass
class Snapshot:
    objects: dict[str, dict[str, dict[str, Any]]]  # kind -> name -> object

    def names(self, kind: str) -> set[str]:
        return set(self.objects.get(kind, {}))

    def all(self) -> set[tuple[str, str]]:
        return {(k, n) for k, objs in self.objects.items() for n in objs}

    def rayjob(self) -> dict[str, Any]:
        (job,) = self.objects["RayJob"].values()
        return job

    def flags(self) -> dict[str, str]:
        words = shlex.split(self.rayjob()["spec"]["entrypoint"])
        return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)

    def runtime_env(self) -> dict[str, Any]:
        return yaml.safe_load(self.rayjob()["spec"]["runtimeEnvYAML"])


def snapshot(api: ApiServer, ns: str) -> Snapshot:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for kind, path in KINDS.items():
        items = api.admin.items(path.format(ns=ns))
        if items:
            out[kind] = {i["metadata"]["name"]: i for i in items}
    return Snapshot(out)


def _pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "RayJob":
        out = [spec["submitterPodTemplate"]["spec"]]
        cluster = spec.get("rayClusterSpec")
    else:
        out, cluster = [], spec
    if cluster:
        out.append(cluster["headGroupSpec"]["template"]["spec"])
        out += [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    return out


def references(obj: dict[str, Any]) -> set[tuple[str, str]]:
    """(kind, name) of every ConfigMap, Secret and ServiceAccount the object's pods would use."""
    refs: set[tuple[str, str]] = set()
    for pod in _pod_specs(obj):
        refs.add(("ServiceAccount", pod.get("serviceAccountName", "default")))
        for vol in pod.get("volumes") or []:
            if "configMap" in vol:
                refs.add(("ConfigMap", vol["configMap"]["name"]))
            if "secret" in vol:
                refs.add(("Secret", vol["secret"]["secretName"]))
        for c in pod["containers"]:
            for env in c.get("env") or []:
                ref = (env.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    refs.add(("Secret", ref["name"]))
    return refs


def dangling(snap: Snapshot) -> set[tuple[str, str, str]]:
    """(referrer, kind, name) for every reference of a live RayJob/RayCluster to a missing object."""
    have = snap.all()
    out = set()
    for kind in ("RayJob", "RayCluster"):
        for name, obj in snap.objects.get(kind, {}).items():
            out |= {(f"{kind}/{name}", k, n) for k, n in references(obj) if (k, n) not in have}
    return out


def helm(api: ApiServer, helm_bin: str, *args: str) -> str:
    waits = args[0] in ("install", "upgrade", "rollback", "uninstall")
    timeout = ["--timeout", f"{HELM_TIMEOUT_S // 2}s"] if waits else []
    proc = subprocess.run([helm_bin, *args, *timeout], capture_output=True, text=True,
                          env=api.env(), timeout=HELM_TIMEOUT_S, check=False)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def changed_trainer_chart(chart: Path, dest: Path) -> Path:
    """A copy of the chart whose trainer differs by one comment line (a new trainer revision)."""
    import shutil

    copy = dest / "gemma3-ray"
    shutil.copytree(chart, copy)
    script = copy / "files" / "trainer" / "vision_train.py"
    script.write_text(script.read_text() + "\n# a trainer change (tests/lifecycle)\n")
    return copy
