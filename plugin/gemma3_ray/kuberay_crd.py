"""Which RayJob fields the installed KubeRay CRD knows, so the chart's newer options are used only
where the operator understands them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SERVED_VERSION = "v1"
# RayJob spec fields the chart can set that older KubeRay releases lack: field → (values key, since).
OPTIONAL_FIELDS: dict[str, tuple[str, str]] = {
    "preRunningDeadlineSeconds": ("rayJob.preRunningDeadlineSeconds", "KubeRay 1.5"),
    "deletionStrategy": ("(rendered by the chart when the CRD has it)", "KubeRay 1.5"),
}
# Fields the chart always renders; a CRD without them is too old for the chart.
REQUIRED_FIELDS = ("entrypoint", "rayClusterSpec", "runtimeEnvYAML", "shutdownAfterJobFinishes",
                   "ttlSecondsAfterFinished", "activeDeadlineSeconds", "submitterPodTemplate", "clusterSelector")


@dataclass(frozen=True)
class CrdReport:
    version: str
    spec_fields: frozenset[str]

    @property
    def missing_required(self) -> list[str]:
        return [f for f in REQUIRED_FIELDS if f not in self.spec_fields]

    def supports(self, field: str) -> bool:
        return field in self.spec_fields


def rayjob_spec_fields(crd: dict[str, Any]) -> CrdReport:
    """The top-level ``spec`` fields of the served RayJob version in a CRD object."""
    versions = crd.get("spec", {}).get("versions", [])
    for v in versions:
        if v.get("name") == SERVED_VERSION and v.get("served", True):
            props = v["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            return CrdReport(version=SERVED_VERSION, spec_fields=frozenset(props))
    served = ", ".join(v.get("name", "?") for v in versions) or "none"
    raise ValueError(f"the RayJob CRD serves no {SERVED_VERSION} version (it serves: {served})")


def unsupported_values(report: CrdReport, values: dict[str, Any]) -> list[str]:
    """Values keys set to something that the installed CRD cannot accept."""
    out = []
    ray_job = values.get("rayJob") or {}
    if ray_job.get("preRunningDeadlineSeconds") is not None and not report.supports("preRunningDeadlineSeconds"):
        out.append("rayJob.preRunningDeadlineSeconds (needs KubeRay >= 1.5; set it to null)")
    return out
