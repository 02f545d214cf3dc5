"""The current kube context, and the GKE cluster it names (``gke_PROJECT_LOCATION_NAME``)."""

from __future__ import annotations

from dataclasses import dataclass

from gemma3_ray.utils import names
from gemma3_ray.utils.errors import ConfigError

_GKE_PREFIX = "gke"
_GKE_PARTS = 4


@dataclass(frozen=True)
class GkeCluster:
    project: str
    location: str  # a region, or a zone for zonal clusters
    name: str

    @property
    def region(self) -> str:
        return names.region_of_location(self.location)


def parse_gke_context(context: str) -> GkeCluster | None:
    """The cluster a ``gcloud container clusters get-credentials`` context names, else None.

    Project IDs, locations and cluster names never contain ``_``, so the name splits unambiguously.
    """
    parts = context.split("_")
    if len(parts) != _GKE_PARTS or parts[0] != _GKE_PREFIX:
        return None
    _, project, location, name = parts
    try:
        names.project_id(project)
        names.region_of_location(location)
        names.cluster(name)
    except names.InvalidName:
        return None
    return GkeCluster(project=project, location=location, name=name)


def current_context(kubeconfig: str | None = None, context: str | None = None) -> str | None:
    """The name of the kube context in use (``context`` if given), or None without a kubeconfig."""
    from kubernetes import config as kconfig
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=kubeconfig)
    except ConfigException:
        return None
    except Exception as exc:  # a malformed kubeconfig raises yaml errors and the like
        raise ConfigError(f"Cannot read the kubeconfig ({kubeconfig or '$KUBECONFIG or ~/.kube/config'}): {exc}; "
                          "fix it or pass --kubeconfig.") from exc
    if context:
        if not any(c.get("name") == context for c in contexts or []):
            from gemma3_ray.utils.tokens import shown

            raise ConfigError(f"The kube context {shown(context)} does not exist; list contexts with "
                              "`kubectl config get-contexts`.")
        return context
    return active.get("name") if active else None
