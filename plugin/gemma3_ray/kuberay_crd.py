"""Which RayJob fields the installed KubeRay CRD knows, so the chart's newer options are used only
where the operator understands them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SERVED_VERSION = "v1"
CLUSTER_SPEC = "rayClusterSpec"


@dataclass(frozen=True)
class OptionalField:
    """A RayJob field (``spec.X`` or ``spec.rayClusterSpec.X``) older KubeRay lacks, and the chart value that sets it."""

    path: str
    values_key: str
    since: str
    is_set: Callable[[dict[str, Any]], bool]
    off: str  # how to turn the value off


OPTIONAL_FIELDS = (
    OptionalField("preRunningDeadlineSeconds", "rayJob.preRunningDeadlineSeconds", "KubeRay 1.5",
                  lambda v: (v.get("rayJob") or {}).get("preRunningDeadlineSeconds") is not None, "set it to null"),
    OptionalField(f"{CLUSTER_SPEC}.authOptions", "rayTokenAuth", "KubeRay 1.5.1",
                  lambda v: bool(v.get("rayTokenAuth")), "set it to false"),
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


def unsupported_values(report: CrdReport, values: dict[str, Any]) -> list[str]:
    """Values keys set to something that the installed CRD cannot accept."""
    return [f"{f.values_key} (needs {f.since}+; {f.off})" for f in OPTIONAL_FIELDS
            if f.is_set(values) and not report.supports(f.path)]
