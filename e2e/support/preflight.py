"""What the cluster has, asked before `make e2e` changes anything on it; each gap is one sentence.

- KubeRay: the RayJob/RayCluster CRDs (ray.io/v1) and a schema that knows every field the chart sets
  on a RayJob (an older KubeRay drops what it does not know); its version from the operator's
  Deployment image or the CRDs' `app.kubernetes.io/version` label. Missing: the run stops here.
- Kueue: its CRDs (kueue.x-k8s.io, the version the plugin writes). Missing: the Kueue stages do not run.
- A worker node for the elastic stage: Ready, schedulable, no NoSchedule/NoExecute taint, never the
  control plane (node-role labels). Missing: that stage does not run.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from e2e.support.errors import StageError
from e2e.support.kube import Kube

CONTROL_PLANE_LABELS = ("node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master")
KUEUE_API = "v1beta2"  # what `gemma3-ray kueue setup` writes (plugin/gemma3_ray/kueue/objects.py)


@dataclass
class ClusterFacts:
    server: str = ""
    kuberay: str = ""  # "" when absent; else "ray.io/v1, operator <version>"
    kuberay_problem: str = ""
    kueue: str = ""
    kueue_problem: str = ""
    worker_node: str = ""
    worker_problem: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def sentence(self) -> str:
        """What is missing, in one sentence ('' when nothing)."""
        gaps = [p for p in (self.kuberay_problem, self.kueue_problem, self.worker_problem) if p]
        return "; ".join(gaps)


def _json(kube: Kube, *args: str) -> dict[str, Any] | None:
    proc = kube.k(*args, "-o", "json", check=False, timeout=60)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr or "not found" in proc.stderr or "the server doesn't have" in proc.stderr:
            return None
        raise StageError(f"kubectl {' '.join(args)}: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout)


def _crd_version_label(crd: dict[str, Any]) -> str:
    return ((crd.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/version", "")


def _version_unknown(image_part: str) -> str:
    """Where the preflight looked for an operator's version, when it found none."""
    return (f"version unknown: no Deployment in the cluster runs a {image_part} image and the CRD has no "
            "app.kubernetes.io/version label (an operator outside the cluster, as the local cluster's host "
            "process, is not seen here)")


def _operator_version(kube: Kube, image_part: str) -> str:
    """The tag of a Deployment image naming image_part, in any namespace ('' when none is in the cluster)."""
    proc = kube.k("get", "deployments", "-A", "-o", "json", check=False, timeout=60)
    if proc.returncode != 0:
        return ""
    for d in json.loads(proc.stdout).get("items", []):
        for c in (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers", []):
            img = c.get("image", "")
            if image_part in img:
                return img.rsplit(":", 1)[-1] if ":" in img.rsplit("/", 1)[-1] else img
    return ""


def unknown_fields(crd: dict[str, Any], version: str, spec: dict[str, Any]) -> list[str]:
    """spec's top-level fields that the CRD's schema of `version` does not declare."""
    for v in crd.get("spec", {}).get("versions", []):
        if v.get("name") == version:
            props = (((v.get("schema") or {}).get("openAPIV3Schema") or {}).get("properties") or {}).get("spec", {})
            known = set((props.get("properties") or {}).keys())
            if props.get("x-kubernetes-preserve-unknown-fields"):
                return []
            return sorted(k for k in spec if k not in known)
    return sorted(spec)


def worker_node(nodes: list[dict[str, Any]]) -> tuple[str, str]:
    """(name, '') of a node the elastic stage may cordon, or ('', why none)."""
    seen = []
    for n in nodes:
        meta, spec, status = n.get("metadata", {}), n.get("spec", {}), n.get("status", {})
        name = meta.get("name", "?")
        labels = meta.get("labels") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions", []))
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in {"NoSchedule", "NoExecute"}]
        if any(lbl in labels for lbl in CONTROL_PLANE_LABELS):
            seen.append(f"{name} (control plane)")
        elif spec.get("unschedulable"):
            seen.append(f"{name} (cordoned)")
        elif taints:
            seen.append(f"{name} (tainted {taints[0].get('key')}:{taints[0].get('effect')})")
        elif not ready:
            seen.append(f"{name} (not Ready)")
        else:
            return name, ""
    return "", ("no schedulable worker node that is not the control plane (have: "
                f"{', '.join(seen) or 'no nodes'}): the elastic stage cordons one, so it does not run")


def preflight(kube: Kube, rayjob_spec: dict[str, Any]) -> ClusterFacts:
    """Ask the cluster; rayjob_spec is the spec the chart renders with the e2e values."""
    f = ClusterFacts()
    version = _json(kube, "version")
    if version is None:
        raise StageError("the cluster of KUBECONFIG does not answer `kubectl version`")
    f.server = (version.get("serverVersion") or {}).get("gitVersion", "")

    rayjob = _json(kube, "get", "crd", "rayjobs.ray.io")
    raycluster = _json(kube, "get", "crd", "rayclusters.ray.io")
    if rayjob is None or raycluster is None:
        f.kuberay_problem = ("KubeRay is not installed: the cluster has no RayJob/RayCluster CRDs (ray.io); "
                             "install the KubeRay operator (its Helm chart, kuberay-operator)")
    else:
        served = [v["name"] for v in rayjob["spec"]["versions"] if v.get("served")]
        if "v1" not in served:
            f.kuberay_problem = f"KubeRay's RayJob CRD serves {served}, not ray.io/v1 the chart writes: upgrade KubeRay"
        else:
            unknown = unknown_fields(rayjob, "v1", rayjob_spec)
            op = _operator_version(kube, "kuberay") or _crd_version_label(rayjob) or _version_unknown("kuberay")
            f.kuberay = f"ray.io/v1, {op}"
            if unknown:
                f.kuberay_problem = (f"KubeRay ({op}) is older than the chart: its RayJob CRD does not know "
                                     f"spec.{', spec.'.join(unknown)}: upgrade KubeRay")

    cq = _json(kube, "get", "crd", "clusterqueues.kueue.x-k8s.io")
    if cq is None:
        f.kueue_problem = "Kueue is not installed (no clusterqueues.kueue.x-k8s.io CRD): the Kueue stages do not run"
    else:
        served = [v["name"] for v in cq["spec"]["versions"] if v.get("served")]
        op = _operator_version(kube, "kueue") or _crd_version_label(cq) or _version_unknown("kueue")
        if KUEUE_API not in served:
            f.kueue_problem = (f"Kueue ({op}) serves {served}, not kueue.x-k8s.io/{KUEUE_API} that gemma3-ray kueue "
                               "setup writes: the Kueue stages do not run")
        else:
            f.kueue = f"kueue.x-k8s.io/{KUEUE_API}, {op}"

    nodes = (_json(kube, "get", "nodes") or {}).get("items", [])
    f.worker_node, f.worker_problem = worker_node(nodes)
    return f
