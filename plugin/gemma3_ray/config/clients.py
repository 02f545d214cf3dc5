"""The API clients — Google Cloud's and the Kubernetes cluster's — made once per command (tests pass their own).

Every connection a command makes is built here, on first use, and kept for the rest of the command:
the Google clients from Application Default Credentials, and the Kubernetes API clients (``Kube``,
the only place they are constructed) on one ``ApiClient`` for the kubeconfig and context the command
was given (``connect``, the only place a Kubernetes connection is made).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma3_ray.utils.errors import ClusterError, MissingBinary, not_logged_in


def default_credentials(project: str | None) -> Any:
    """Application Default Credentials (what `gcloud auth application-default login` writes)."""
    import google.auth
    from google.auth import exceptions as auth_exc

    try:
        credentials, _ = google.auth.default(quota_project_id=project)
    except auth_exc.DefaultCredentialsError as exc:
        raise not_logged_in(str(exc)) from exc
    return credentials


def connect(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The one Kubernetes connection of a command: an ``ApiClient`` for the kube context (its credential
    plugin checked first); a kubeconfig without a usable context is a ClusterError saying how to get one."""
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    _check_credential_plugin(kubeconfig, context)
    try:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, FileNotFoundError) as exc:
        raise ClusterError(
            f"No usable kube context ({exc}): run `gcloud container clusters get-credentials CLUSTER --location "
            "LOCATION` or pass --kubeconfig / --kube-context."
        ) from exc


def _check_credential_plugin(kubeconfig: str | None, context: str | None) -> None:
    """The kube context's exec credential plugin (GKE: gke-gcloud-auth-plugin) must be on PATH: the kubernetes
    client only logs its absence and then talks to the cluster without credentials."""
    import yaml

    path = Path(kubeconfig or (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]).expanduser()
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        name = context or doc.get("current-context")
        ctx = next(c.get("context") or {} for c in doc.get("contexts") or [] if c.get("name") == name)
        user = next(u.get("user") or {} for u in doc.get("users") or [] if u.get("name") == ctx.get("user"))
        command = str((user.get("exec") or {}).get("command") or "")
    except (OSError, yaml.YAMLError, StopIteration, AttributeError, TypeError):
        return  # the kubernetes client reports an unreadable kubeconfig itself
    if command and shutil.which(command) is None:
        hint = ("install it with `gcloud components install gke-gcloud-auth-plugin` (or your package manager's "
                "google-cloud-cli-gke-gcloud-auth-plugin)") if "gke-gcloud-auth-plugin" in command else "install it"
        raise MissingBinary(f"The kube context's credential plugin {command} is not on PATH: {hint}, then run this "
                            "again.")


@dataclass
class Kube:
    """The Kubernetes API clients of one kube context (``kubeconfig``/``context``; None: the current one),
    all on one connection made on first use; any of them may be given up front instead (tests)."""

    kubeconfig: str | None = None
    context: str | None = None
    core: Any = None  # CoreV1Api
    custom: Any = None  # CustomObjectsApi
    api_ext: Any = None  # ApiextensionsV1Api
    _api: Any = field(default=None, repr=False)
    _made: set[str] = field(default_factory=set, repr=False)  # the clients made here on _api (not given)

    def point_at(self, kubeconfig: str | None, context: str | None) -> None:
        """The kube context this command uses; a connection made for another one is dropped with its clients."""
        if (kubeconfig, context) != (self.kubeconfig, self.context):
            for name in self._made:
                setattr(self, name, None)
            self._api, self._made = None, set()
        self.kubeconfig, self.context = kubeconfig, context

    def api_client(self) -> Any:
        if self._api is None:
            self._api = connect(self.kubeconfig, self.context)
        return self._api

    def get_core(self) -> Any:
        if self.core is None:
            from kubernetes import client

            self.core = client.CoreV1Api(self.api_client())
            self._made.add("core")
        return self.core

    def get_custom(self) -> Any:
        if self.custom is None:
            from kubernetes import client

            self.custom = client.CustomObjectsApi(self.api_client())
            self._made.add("custom")
        return self.custom

    def get_api_ext(self) -> Any:
        if self.api_ext is None:
            from kubernetes import client

            self.api_ext = client.ApiextensionsV1Api(self.api_client())
            self._made.add("api_ext")
        return self.api_ext


@dataclass
class Clients:
    """Lazily built API clients; any of them may be given up front instead."""

    project: str
    storage: Any = None
    iam: Any = None
    service_usage: Any = None
    reservations: Any = None
    kube: Kube = field(default_factory=Kube)  # the cluster's (its kubeconfig and context set by the command)
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
