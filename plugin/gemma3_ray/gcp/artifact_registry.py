"""The Artifact Registry repository and build staging bucket `prereqs --image` adds.

What `prereqs --image` adds for building the training image without local Docker: the Artifact
Registry repository and a build staging bucket, with grants on those two resources only.

- the Artifact Registry and Cloud Build APIs, enabled;
- a Docker repository ``gemma3-ray`` in the cluster's region;
- a staging bucket ``PROJECT-gemma3-ray-build`` in that region (uniform access, public access
  prevention enforced, label ``managed-by=gemma3-ray``): the build's source tarball and its log;
- ``roles/artifactregistry.reader`` on the repository for the cluster's node pull identity (the
  service account of its nodes; the Compute Engine default one unless the cluster names another),
  and nothing on the staging bucket;
- the build's own service account ``gemma3-ray-build`` (builds run as it: never the node identity,
  never Cloud Build's default account): ``roles/artifactregistry.writer`` on the repository, and on
  the staging bucket ``roles/storage.objectViewer`` (fetch the source) and
  ``roles/storage.objectCreator`` (write the build log: a user-specified build account must log to
  a bucket of the user's or to Cloud Logging; the build logs GCS_ONLY to this bucket, so no
  ``roles/logging.logWriter``) — nothing project-wide.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import bucket_setup, iam_policy, services
from gemma3_ray.gcp.bucket_setup import MANAGED_BY_LABEL
from gemma3_ray.gke import cluster as gke_cluster
from gemma3_ray.utils import names
from gemma3_ray.utils.errors import NotLoggedIn, call_google, not_logged_in
from gemma3_ray.utils.plan import Action, Plan

REPOSITORY_ID = names.PRODUCT
IMAGE_NAME = "trainer"
SERVICES = ("artifactregistry.googleapis.com", "cloudbuild.googleapis.com")
READER = "roles/artifactregistry.reader"
WRITER = "roles/artifactregistry.writer"
STAGING_ROLES = ("roles/storage.objectViewer", "roles/storage.objectCreator")  # fetch the source, write the log
BUILD_SA_ID = f"{names.PRODUCT}-build"
LEGACY_STAGING_ROLE = "roles/storage.objectAdmin"  # what earlier versions gave the (node-shared) build account
CREATE_TIMEOUT_S = 300


@dataclass(frozen=True)
class Registry:
    project: str
    region: str
    repository: str = REPOSITORY_ID

    @property
    def path(self) -> str:
        return f"projects/{self.project}/locations/{self.region}/repositories/{self.repository}"

    @property
    def host(self) -> str:
        return f"{self.region}-docker.pkg.dev/{self.project}/{self.repository}"

    def image(self, tag: str) -> str:
        return f"{self.host}/{IMAGE_NAME}:{tag}"

    def tag_path(self, tag: str) -> str:
        return f"{self.path}/packages/{IMAGE_NAME}/tags/{tag}"

    @property
    def staging_bucket(self) -> str:
        return names.bucket(re.sub(r"[^a-z0-9-]", "-", self.project) + f"-{names.PRODUCT}-build")


def registry_of(dep: Deployment) -> Registry:
    return Registry(dep.project, dep.region)


def project_number(clients: Clients, project: str) -> str:
    rm = clients.get_resource_manager()
    got = call_google("read", f"projects/{project}", lambda: rm.get_project(request={"name": f"projects/{project}"}))
    return str(got.name).removeprefix("projects/")


def compute_default_sa(number: str) -> str:
    return f"{number}-compute@developer.gserviceaccount.com"


def node_pull_identities(dep: Deployment, clients: Clients) -> tuple[list[str], str]:
    """The service accounts the cluster's nodes pull images as, and where that was read from."""
    number = project_number(clients, dep.project)
    spec = gke_cluster.spec_from(dep, standard=False)
    cluster = gke_cluster.get(clients.get_container(), spec) if dep.cluster else None
    if cluster is None:
        return [compute_default_sa(number)], "the Compute Engine default service account (what `cluster create` nodes use)"
    found = [p.config.service_account for p in cluster.node_pools]
    if cluster.autopilot.enabled or not found:  # Autopilot: its auto-provisioning default (create-auto --service-account)
        found.append(cluster.autoscaling.autoprovisioning_node_pool_defaults.service_account)
    emails = sorted({compute_default_sa(number) if sa in ("", "default") else sa for sa in found})
    return emails, f"the nodes of cluster {spec.name}"


def build_account(project: str) -> str:
    """The service account the image builds run as (made by `prereqs --image`)."""
    return names.gsa_email(BUILD_SA_ID, project)


class RegistryPrereqs:
    """Plans and applies the image prerequisites of one deployment (read calls only in ``extend``)."""

    def __init__(self, dep: Deployment, clients: Clients) -> None:
        self.dep, self.clients, self.reg = dep, clients, registry_of(dep)

    def _services(self, plan: Plan) -> None:
        off = services.read(self.clients, self.dep.project, SERVICES).disabled
        if not off:
            plan.in_place.append(f"APIs enabled: {', '.join(SERVICES)}")
            return
        plan.actions.append(Action(f"enable APIs: {', '.join(off)}",
                                   lambda: services.enable(self.clients, self.dep.project, off)))

    def _repository_exists(self) -> bool:
        registry = self.clients.get_artifact_registry()
        try:
            call_google("read", self.reg.path, lambda: registry.get_repository(request={"name": self.reg.path}), not_found=True)
        except gexc.NotFound:
            return False
        return True

    def _create_repository(self) -> None:
        from google.cloud import artifactregistry_v1 as ar

        registry = self.clients.get_artifact_registry()
        repo = ar.Repository(format_=ar.Repository.Format.DOCKER, labels=dict([MANAGED_BY_LABEL]),
                             description=f"{names.PRODUCT} training images (created by `{names.PRODUCT} prereqs --image`)")
        request = {"parent": self.reg.path.rsplit("/repositories/", 1)[0], "repository_id": self.reg.repository,
                   "repository": repo}
        with contextlib.suppress(gexc.AlreadyExists):  # a concurrent run created it
            call_google("create", self.reg.path, lambda: registry.create_repository(request=request).result(
                timeout=CREATE_TIMEOUT_S), expect=(gexc.AlreadyExists,))

    def _staging_bucket(self) -> Any | None:
        storage = self.clients.get_storage()
        try:
            return call_google("read", f"gs://{self.reg.staging_bucket}", lambda: storage.get_bucket(self.reg.staging_bucket),
                         not_found=True)
        except gexc.NotFound:
            return None

    def _create_staging_bucket(self) -> None:
        storage = self.clients.get_storage()
        name = self.reg.staging_bucket
        bucket_setup.create_hardened(storage, name, self.dep.region)  # made meanwhile: its settings are checked all the same
        bucket_setup.harden(call_google("read", f"gs://{name}", lambda: storage.get_bucket(name)), label=True)

    def _grant(self, plan: Plan, access: Callable[[], iam_policy.PolicyAccess], resource: str, role: str,
               member: str, exists: bool) -> None:
        text = f"{role} on {resource} for {member}"
        if exists and access().has(call_google("read the IAM policy of", resource, lambda: access().read()), role, member):
            plan.in_place.append(text)
            return
        plan.actions.append(Action(f"grant {text}", lambda: call_google(
            "set the IAM policy of", resource, lambda: iam_policy.change_binding(access(), role, member, present=True))))

    def _revoke(self, plan: Plan, access: Callable[[], iam_policy.PolicyAccess], resource: str, role: str,
                member: str, exists: bool) -> None:
        if not exists or not access().has(call_google("read the IAM policy of", resource, lambda: access().read()),
                                          role, member):
            return
        plan.actions.append(Action(f"revoke {role} on {resource} from {member} (the nodes' identity only reads the "
                                   "repository; builds run as their own account)", lambda: call_google(
            "set the IAM policy of", resource, lambda: iam_policy.change_binding(access(), role, member, present=False))))

    def extend(self, plan: Plan) -> None:
        """Add the image prerequisites to ``plan`` (without credentials: what it would ensure, unchecked)."""
        try:
            self._extend(plan)
        except NotLoggedIn:
            self.offline(plan)

    def offline(self, plan: Plan) -> None:
        def refuse() -> None:
            raise not_logged_in()

        for text in (f"APIs enabled: {', '.join(SERVICES)}",
                     f"Artifact Registry Docker repository {self.reg.host}",
                     f"build staging bucket gs://{self.reg.staging_bucket} in {self.dep.region} (uniform bucket-level "
                     "access, public access prevention enforced)",
                     f"{READER} on {self.reg.host} for the cluster's node pull identity",
                     f"the build's service account {build_account(self.dep.project)}",
                     f"{WRITER} on {self.reg.host} for the build's service account",
                     *(f"{role} on gs://{self.reg.staging_bucket} for the build's service account" for role in STAGING_ROLES)):
            plan.actions.append(Action(f"{text} [not checked: not logged in]", refuse))

    def _extend(self, plan: Plan) -> None:
        self._services(plan)
        repo_exists = self._repository_exists()
        if repo_exists:
            plan.in_place.append(f"Artifact Registry repository {self.reg.host}")
        else:
            plan.actions.append(Action(f"create Artifact Registry Docker repository {self.reg.host} ({self.reg.path})",
                                       self._create_repository))
        bucket = self._staging_bucket()
        if bucket is not None:
            plan.in_place.append(f"build staging bucket gs://{bucket.name} ({bucket.location})")
        else:
            plan.actions.append(Action(f"create build staging bucket gs://{self.reg.staging_bucket} in {self.dep.region} "
                                       "(uniform bucket-level access, public access prevention enforced)",
                                       self._create_staging_bucket))
        pullers, how = node_pull_identities(self.dep, self.clients)
        registry = self.clients.get_artifact_registry()

        def repo_access() -> iam_policy.PolicyAccess:
            return iam_policy.service_account_policy(registry, self.reg.path)  # the same google.iam.v1 calls

        def bucket_access() -> iam_policy.PolicyAccess:
            return iam_policy.bucket_policy(self.clients.get_storage().bucket(self.reg.staging_bucket))

        for sa in pullers:
            self._grant(plan, repo_access, self.reg.host, READER, f"serviceAccount:{sa}", repo_exists)
            # what builds running as the nodes' account needed before builds had their own: the nodes only read
            self._revoke(plan, repo_access, self.reg.host, WRITER, f"serviceAccount:{sa}", repo_exists)
            self._revoke(plan, bucket_access, f"gs://{self.reg.staging_bucket}", LEGACY_STAGING_ROLE,
                         f"serviceAccount:{sa}", bucket is not None)
        plan.in_place.append(f"node pull identity: {', '.join(pullers)} ({how})")
        builder = f"serviceAccount:{build_account(self.dep.project)}"
        sa_exists = self._build_account(plan)
        self._grant(plan, repo_access, self.reg.host, WRITER, builder, repo_exists and sa_exists)
        for role in STAGING_ROLES:
            self._grant(plan, bucket_access, f"gs://{self.reg.staging_bucket}", role, builder,
                        bucket is not None and sa_exists)

    def _build_account(self, plan: Plan) -> bool:
        """The build's own service account: in place (True), or its creation planned."""
        iam = self.clients.get_iam()
        email = build_account(self.dep.project)
        resource = f"projects/{self.dep.project}/serviceAccounts/{email}"
        try:
            call_google("read", resource, lambda: iam.get_service_account(request={"name": resource}), not_found=True)
            plan.in_place.append(f"the build's service account {email}")
            return True
        except gexc.NotFound:
            pass
        request = {"name": f"projects/{self.dep.project}", "account_id": BUILD_SA_ID,
                   "service_account": {"display_name": f"{names.PRODUCT} image builds",
                                       "description": f"Cloud Build of the {names.PRODUCT} training image (created by "
                                                      f"`{names.PRODUCT} prereqs --image`)"}}

        def create() -> None:
            with contextlib.suppress(gexc.AlreadyExists):  # a concurrent run made it
                call_google("create", resource, lambda: iam.create_service_account(request=request),
                            expect=(gexc.AlreadyExists,))

        plan.actions.append(Action(f"create the build's service account {email} (builds run as it, not as the nodes)",
                                   create))
        return False
