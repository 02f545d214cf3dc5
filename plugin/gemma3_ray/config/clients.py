"""The Google Cloud clients, made once per command (and injectable: tests pass their own)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gemma3_ray.utils.errors import not_logged_in


def default_credentials(project: str | None) -> Any:
    """Application Default Credentials (what `gcloud auth application-default login` writes)."""
    import google.auth
    from google.auth import exceptions as auth_exc

    try:
        credentials, _ = google.auth.default(quota_project_id=project)
    except auth_exc.DefaultCredentialsError as exc:
        raise not_logged_in(str(exc)) from exc
    return credentials


@dataclass
class Clients:
    """Lazily built API clients; any of them may be given up front instead."""

    project: str
    storage: Any = None
    iam: Any = None
    service_usage: Any = None
    reservations: Any = None
    core_v1: Any = None
    container: Any = None
    resource_manager: Any = None
    cloud_build: Any = None
    artifact_registry: Any = None
    _credentials: Any = field(default=None, repr=False)

    def credentials(self) -> Any:
        if self._credentials is None:
            self._credentials = default_credentials(self.project)
        return self._credentials

    def get_storage(self) -> Any:
        if self.storage is None:
            from google.cloud import storage

            self.storage = storage.Client(project=self.project, credentials=self.credentials())
        return self.storage

    def get_iam(self) -> Any:
        if self.iam is None:
            from google.cloud import iam_admin_v1

            self.iam = iam_admin_v1.IAMClient(credentials=self.credentials())
        return self.iam

    def get_service_usage(self) -> Any:
        if self.service_usage is None:
            from google.cloud import service_usage_v1

            self.service_usage = service_usage_v1.ServiceUsageClient(credentials=self.credentials())
        return self.service_usage

    def get_reservations(self) -> Any:
        if self.reservations is None:
            from google.cloud import compute_v1

            self.reservations = compute_v1.ReservationsClient(credentials=self.credentials())
        return self.reservations

    # -- GKE, the permission preflight and the image build (gke_cluster, iam_preflight, image_build) --
    def get_container(self) -> Any:
        if self.container is None:
            from google.cloud import container_v1

            self.container = container_v1.ClusterManagerClient(credentials=self.credentials())
        return self.container

    def get_resource_manager(self) -> Any:
        if self.resource_manager is None:
            from google.cloud import resourcemanager_v3

            self.resource_manager = resourcemanager_v3.ProjectsClient(credentials=self.credentials())
        return self.resource_manager

    def get_cloud_build(self) -> Any:
        if self.cloud_build is None:
            from google.cloud.devtools import cloudbuild_v1

            self.cloud_build = cloudbuild_v1.CloudBuildClient(credentials=self.credentials())
        return self.cloud_build

    def get_artifact_registry(self) -> Any:
        if self.artifact_registry is None:
            from google.cloud import artifactregistry_v1

            self.artifact_registry = artifactregistry_v1.ArtifactRegistryClient(credentials=self.credentials())
        return self.artifact_registry
