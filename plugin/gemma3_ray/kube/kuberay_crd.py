"""Which RayJob fields the installed KubeRay CRD knows (the chart's newer options need them).

Which RayJob fields the installed KubeRay CRD knows, so the chart's newer options are used only
where the operator understands them."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gemma3_ray.config.render import merged

SERVED_VERSION = "v1"
CLUSTER_SPEC = "rayClusterSpec"


@dataclass(frozen=True)
class OptionalField:
    """A chart value that needs a newer KubeRay than 1.4, and the RayJob CRD field (``spec.X`` or
    ``spec.rayClusterSpec.X``) whose presence shows the installed KubeRay is new enough."""

    path: str
    values_key: str
    since: str
    is_set: Callable[[dict[str, Any]], bool]
    off: str  # how to turn the value off ("it" stands for values_key)
    # What happens on an older KubeRay: the API server prunes the field (a warning only), or worse.
    older: str = "the API server would drop it without an error"


def _deletion_set(values: dict[str, Any]) -> bool:
    deletion = (values.get("rayJob") or {}).get("deletion") or {}
    return any(deletion.get(k) is not None for k in ("workersAfterSeconds", "clusterAfterSeconds"))


def _collector_set(values: dict[str, Any]) -> bool:
    return bool(((values.get("historyServer") or {}).get("collector") or {}).get("image"))


def _dashboard_port(values: dict[str, Any]) -> int:
    return int((values.get("service") or {}).get("dashboardPort") or DEFAULT_DASHBOARD_PORT)


DEFAULT_DASHBOARD_PORT = 8265
OPTIONAL_FIELDS = (
    OptionalField("preRunningDeadlineSeconds", "rayJob.preRunningDeadlineSeconds", "KubeRay 1.6.0",
                  lambda v: (v.get("rayJob") or {}).get("preRunningDeadlineSeconds") is not None, "set it to null"),
    OptionalField(f"{CLUSTER_SPEC}.authOptions", "rayTokenAuth", "KubeRay 1.5.1",
                  lambda v: bool(v.get("rayTokenAuth")), "set it to false"),
    # KubeRay 1.6.0 made the head's probes follow rayStartParams' dashboard-port (#4041) and added
    # spec.preRunningDeadlineSeconds (#4525); v1.4.2's initLivenessAndReadinessProbe probes 8265.
    OptionalField("preRunningDeadlineSeconds", "service.dashboardPort", "KubeRay 1.6.0",
                  lambda v: _dashboard_port(v) != DEFAULT_DASHBOARD_PORT, f"set it to {DEFAULT_DASHBOARD_PORT}",
                  older=f"its head probes hard-code port {DEFAULT_DASHBOARD_PORT}, so the head would never be ready"),
    # spec.deletionStrategy.deletionRules is in the CRD since 1.5.0, but 1.5.0's rule condition requires
    # jobStatus (no jobDeploymentStatus) and its RayJobDeletionPolicy feature gate is alpha, off by default
    # (its operator then fails the RayJob); 1.6.0 made the gate beta, on by default
    # (ray-operator/pkg/features/features.go). 1.6.0 is told apart by spec.preRunningDeadlineSeconds.
    OptionalField("preRunningDeadlineSeconds", "rayJob.deletion", "KubeRay 1.6.0", _deletion_set,
                  "set rayJob.deletion.workersAfterSeconds and clusterAfterSeconds to null",
                  older="KubeRay 1.4 drops spec.deletionStrategy, and 1.5 refuses the chart's rules (its CRD lacks "
                        "jobDeploymentStatus) or, with its RayJobDeletionPolicy feature gate off by default, fails "
                        "the RayJob"),
    OptionalField(f"{CLUSTER_SPEC}.historyServerOptions", "historyServer.collector.image", "KubeRay 1.7.0",
                  _collector_set, 'set it to ""'),
)
# Fields the chart always renders; a CRD without them is too old for the chart.
REQUIRED_FIELDS = ("entrypoint", CLUSTER_SPEC, "runtimeEnvYAML", "shutdownAfterJobFinishes",
                   "ttlSecondsAfterFinished", "activeDeadlineSeconds", "submitterPodTemplate", "clusterSelector")


@dataclass(frozen=True)
class CrdReport:
    version: str
    spec_fields: frozenset[str]  # spec.X as "X", spec.rayClusterSpec.X as "rayClusterSpec.X"

    @property
    def missing_required(self) -> list[str]:
        return [f for f in REQUIRED_FIELDS if f not in self.spec_fields]

    def supports(self, field: str) -> bool:
        return field in self.spec_fields


def rayjob_spec_fields(crd: dict[str, Any]) -> CrdReport:
    """The ``spec`` and ``spec.rayClusterSpec`` fields of the served RayJob version in a CRD object."""
    versions = crd.get("spec", {}).get("versions", [])
    for v in versions:
        if v.get("name") == SERVED_VERSION and v.get("served", True):
            props = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            nested = (props.get(CLUSTER_SPEC) or {}).get("properties", {})
            return CrdReport(version=SERVED_VERSION,
                             spec_fields=frozenset([*props, *(f"{CLUSTER_SPEC}.{k}" for k in nested)]))
    served = ", ".join(v.get("name", "?") for v in versions) or "none"
    raise ValueError(f"the RayJob CRD serves no {SERVED_VERSION} version (it serves: {served})")


def refusals(report: CrdReport, values: dict[str, Any]) -> list[str]:
    """One sentence for each value the installed KubeRay cannot honour (empty: all fine)."""
    return [f"{f.values_key} needs {f.since} or newer, and the cluster's RayJob CRD is older (it lacks spec.{f.path}): "
            f"{f.older}; upgrade the KubeRay operator or {_IT.sub(f.values_key, f.off, count=1)}"
            for f in OPTIONAL_FIELDS if f.is_set(values) and not report.supports(f.path)]


_IT = re.compile(r"\bit\b")


def check_before_install(api_ext: Any, values: list[dict[str, Any]]) -> str:
    """Before `up` changes anything: the installed RayJob CRD knows every field the values set.
    Returns the line to print; raises a UserError (one sentence) otherwise."""
    from gemma3_ray.kube import cluster
    from gemma3_ray.utils.errors import ClusterError, UserError

    want = merged(values)
    needs = [f.values_key for f in OPTIONAL_FIELDS if f.is_set(want)]
    try:
        crd = cluster.crd(api_ext, cluster.RAYJOB_CRD)
    except UserError as exc:
        if not needs:
            return f"KubeRay CRD not read ({str(exc).rstrip('.')}); the values use no field newer than KubeRay 1.4."
        raise ClusterError(f"Cannot check that the cluster's KubeRay supports {', '.join(needs)} ({str(exc).rstrip('.')}): "
                           "ask for read access to customresourcedefinitions, or unset those values; nothing was "
                           "changed.") from exc
    if crd is None:
        raise ClusterError("The RayJob CRD is not installed: install the KubeRay operator first (GKE: "
                           "`gcloud container clusters update CLUSTER --update-addons=RayOperator=ENABLED`); nothing "
                           "was changed.")
    try:
        report = rayjob_spec_fields(crd)
    except ValueError as exc:
        raise ClusterError(f"The cluster's KubeRay is too old: {exc}; upgrade the KubeRay operator.") from exc
    if report.missing_required:
        raise ClusterError(f"The cluster's RayJob CRD lacks {', '.join(report.missing_required)}: upgrade the KubeRay "
                           "operator (the chart needs 1.4 or newer); nothing was changed.")
    why = refusals(report, want)
    if why:
        raise ClusterError(f"{why[0]}; nothing was changed.")
    return f"KubeRay CRD checked: it keeps every field these values set{' (' + ', '.join(needs) + ')' if needs else ''}."
