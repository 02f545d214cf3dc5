"""The scheduler's filters a pod template meets on a node, as pure logic: node selector, required node affinity,
NoSchedule/NoExecute taints against tolerations, and requests against allocatable.

A stand-in for kube-scheduler's NodeAffinity, TaintToleration and NodeResourcesFit filters, used where no
scheduler runs (tests/e2e/test_fleet_nodes.py cross-checks every values file against the pools of
e2e/support/fleet_nodes.py with it); the `fleet` stages let the real kube-scheduler decide instead.
"""

from __future__ import annotations

from typing import Any

_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "m": 1e-3}


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity as a number ("500m" -> 0.5, "2Gi" -> 2147483648)."""
    s = str(text)
    for unit in sorted(_UNITS, key=len, reverse=True):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * _UNITS[unit]
    return float(s)


def requests(pod_spec: dict[str, Any]) -> dict[str, float]:
    """The pod's requests, summed over its containers (limits stand in for a missing request, as the API does)."""
    out: dict[str, float] = {}
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        for k, v in {**(res.get("limits") or {}), **(res.get("requests") or {})}.items():
            out[k] = out.get(k, 0.0) + quantity(v)
    return out


def _expr(e: dict[str, Any], labels: dict[str, str]) -> bool:
    key, op, values = e["key"], e["operator"], e.get("values") or []
    return {"In": lambda: labels.get(key) in values, "NotIn": lambda: labels.get(key) not in values,
            "Exists": lambda: key in labels, "DoesNotExist": lambda: key not in labels}[op]()


def tolerated(taint: dict[str, str], tolerations: list[dict[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if not t.get("key") and t.get("operator") == "Exists":
            return True
        if t.get("key") != taint["key"]:
            continue
        if t.get("operator") == "Exists" or t.get("value", "") == taint.get("value", ""):
            return True
    return False


def why_not(pod_spec: dict[str, Any], node: dict[str, Any]) -> str:
    """'' when the pod fits the (empty) node, else the first filter it fails, in the scheduler's words."""
    labels = node["metadata"].get("labels") or {}
    sel = pod_spec.get("nodeSelector") or {}
    terms = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    if any(labels.get(k) != v for k, v in sel.items()) or (
            terms and not any(all(_expr(e, labels) for e in t.get("matchExpressions") or []) for t in terms)):
        return "node(s) didn't match Pod's node affinity/selector"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint["effect"] in ("NoSchedule", "NoExecute") and not tolerated(taint, pod_spec.get("tolerations") or []):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    alloc = node["status"]["allocatable"]
    for k, v in requests(pod_spec).items():
        if v > quantity(alloc.get(k, 0)):
            return f"Insufficient {k}"
    return ""
