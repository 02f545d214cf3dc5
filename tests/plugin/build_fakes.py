"""In-process fakes of Artifact Registry and Cloud Build, with the real APIs' semantics the plugin
depends on:

- Artifact Registry: 409 ALREADY_EXISTS on create (a long-running operation whose ``result()`` is the
  repository), 404, 403 naming the permission, etag-checked setIamPolicy (stale -> ABORTED), tags
  appear only when an image is pushed;
- Cloud Build: a build runs as its ``service_account`` (the caller needs iam.serviceAccounts.actAs,
  and the account must exist in the IAM fake: INVALID_ARGUMENT otherwise), else as the project's
  default; ``create_build`` is INVALID_ARGUMENT when the source object cannot be read (checked
  against the real storage emulator) or when the build has no logs bucket / logging mode (a
  user-specified or non-legacy default account cannot log to Cloud Build's own bucket); the build
  then moves QUEUED -> WORKING -> a final state, one step per ``get_build``; it fetches the source
  only if its account holds a role granting storage.objects.get on the source bucket, writes its
  log (``log-ID.txt``) only with one granting storage.objects.create on the logs bucket, and pushes
  only if it holds ``roles/artifactregistry.writer`` on the repository (PUSH_NOT_AUTHORIZED
  otherwise) and the repository exists (PUSH_FAILED). A failing Dockerfile is ``fail_step``.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import artifactregistry_v1 as ar
from google.cloud.devtools import cloudbuild_v1 as cb
from google.iam.v1 import iam_policy_pb2, policy_pb2

from tests.plugin.container_fakes import _req
from tests.plugin.gcp_fakes import ALL, _denied

WRITER = "roles/artifactregistry.writer"
# The predefined Cloud Storage roles that hold each object permission a build needs.
_GRANTING = {
    "storage.objects.get": {"roles/storage.objectViewer", "roles/storage.objectUser", "roles/storage.objectAdmin",
                            "roles/storage.admin"},
    "storage.objects.create": {"roles/storage.objectCreator", "roles/storage.objectUser", "roles/storage.objectAdmin",
                               "roles/storage.admin"},
}


class _Lro:
    """What google.api_core.operation.Operation offers the plugin: ``metadata`` and ``result()``."""

    def __init__(self, result: Any = None, metadata: Any = None) -> None:
        self._result, self.metadata = result, metadata

    def result(self, timeout: float | None = None) -> Any:
        return self._result


@dataclass
class FakeArtifactRegistry:
    allowed: set[str] | str = ALL
    repositories: dict[str, ar.Repository] = field(default_factory=dict)
    policies: dict[str, policy_pb2.Policy] = field(default_factory=dict)
    tags: dict[str, ar.Tag] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    MUTATING = ("create_repository", "set_iam_policy")

    def _check(self, permission: str, resource: str) -> None:
        if self.allowed != ALL and permission not in self.allowed:
            raise _denied(permission, resource)

    def _repo(self, name: str) -> ar.Repository:
        try:
            return self.repositories[name]
        except KeyError:
            raise gexc.NotFound(f"Requested entity was not found: {name}.") from None

    def get_repository(self, request: Any = None) -> ar.Repository:
        name = _req(request, ar.GetRepositoryRequest)["name"]
        self.calls.append(("get_repository", name))
        self._check("artifactregistry.repositories.get", name)
        return ar.Repository(self._repo(name))

    def create_repository(self, request: Any = None) -> _Lro:
        r = _req(request, ar.CreateRepositoryRequest)
        name = f"{r['parent']}/repositories/{r['repository_id']}"
        self.calls.append(("create_repository", name))
        self._check("artifactregistry.repositories.create", r["parent"])
        repo = ar.Repository(r["repository"])
        if repo.format_ == ar.Repository.Format.FORMAT_UNSPECIFIED:
            raise gexc.InvalidArgument("Repository format must be specified.")
        with self._lock:
            if name in self.repositories:
                raise gexc.AlreadyExists(f"the repository already exists: {name}")
            repo.name = name
            location = r["parent"].split("/")[3]
            repo.registry_uri = f"{location}-docker.pkg.dev/{r['parent'].split('/')[1]}/{r['repository_id']}"
            self.repositories[name] = repo
            self.policies[name] = policy_pb2.Policy(version=1, etag=b"\x00\x00\x00\x01")
        return _Lro(result=ar.Repository(repo))

    def get_iam_policy(self, request: Any = None) -> policy_pb2.Policy:
        resource = _req(request, iam_policy_pb2.GetIamPolicyRequest)["resource"]
        self.calls.append(("get_iam_policy", resource))
        self._check("artifactregistry.repositories.getIamPolicy", resource)
        self._repo(resource)
        copy = policy_pb2.Policy()
        copy.CopyFrom(self.policies[resource])
        return copy

    def set_iam_policy(self, request: Any = None) -> policy_pb2.Policy:
        r = _req(request, iam_policy_pb2.SetIamPolicyRequest)
        resource, policy = r["resource"], r["policy"]
        self.calls.append(("set_iam_policy", resource))
        self._check("artifactregistry.repositories.setIamPolicy", resource)
        self._repo(resource)
        with self._lock:
            current = self.policies[resource]
            if policy.etag and policy.etag != current.etag:
                raise gexc.Aborted("There were concurrent policy changes. Please retry the whole read-modify-write.")
            stored = policy_pb2.Policy()
            stored.CopyFrom(policy)
            stored.etag = (int.from_bytes(current.etag, "big") + 1).to_bytes(4, "big")
            self.policies[resource] = stored
        return stored

    def get_tag(self, request: Any = None) -> ar.Tag:
        name = _req(request, ar.GetTagRequest)["name"]
        self.calls.append(("get_tag", name))
        self._check("artifactregistry.tags.get", name)
        self._repo(name.split("/packages/")[0])
        try:
            return self.tags[name]
        except KeyError:
            raise gexc.NotFound(f"Requested entity was not found: {name}.") from None

    def members(self, repo: str, role: str) -> set[str]:
        return {m for b in self.policies.get(repo, policy_pb2.Policy()).bindings if b.role == role for m in b.members}

    def push(self, image: str, content: bytes) -> tuple[str, str]:
        """(outcome, digest) of pushing ``HOST/PROJECT/REPO/PKG:TAG``; outcome '' when pushed."""
        host, project, repo_id, rest = image.split("/", 3)
        package, tag = rest.rsplit(":", 1)
        repo = f"projects/{project}/locations/{host.removesuffix('-docker.pkg.dev')}/repositories/{repo_id}"
        if repo not in self.repositories:
            return f'name unknown: Repository "{repo_id}" not found', ""
        digest = "sha256:" + hashlib.sha256(content).hexdigest()
        self.tags[f"{repo}/packages/{package}/tags/{tag}"] = ar.Tag(
            name=f"{repo}/packages/{package}/tags/{tag}", version=f"{repo}/packages/{package}/versions/{digest}")
        return "", digest

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in self.MUTATING]


B = cb.Build.Status
_NEXT = {B.QUEUED: B.WORKING}


@dataclass
class FakeCloudBuild:
    """``cloudbuild_v1.CloudBuildClient``: default service account, create_build, get_build."""

    project: str
    project_number: str
    registry: FakeArtifactRegistry
    storage: Any  # a google.cloud.storage client on the storage emulator
    allowed: set[str] | str = ALL
    fail_step: str | None = None  # the Docker build step fails with this output
    iam: Any = None  # the IAM fake: a build's service_account must exist there
    builds: dict[str, cb.Build] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)

    @property
    def service_account(self) -> str:
        return f"{self.project_number}-compute@developer.gserviceaccount.com"

    def _check(self, permission: str, resource: str) -> None:
        if self.allowed != ALL and permission not in self.allowed:
            raise _denied(permission, resource)

    def get_default_service_account(self, request: Any = None) -> cb.DefaultServiceAccount:
        name = _req(request, cb.GetDefaultServiceAccountRequest)["name"]
        self.calls.append(("get_default_service_account", name))
        self._check("cloudbuild.builds.get", name)
        return cb.DefaultServiceAccount(name=name, service_account_email=f"projects/{self.project}/serviceAccounts/"
                                                                         f"{self.service_account}")

    def create_build(self, request: Any = None) -> _Lro:
        r = _req(request, cb.CreateBuildRequest)
        build = cb.Build(r["build"])
        self.calls.append(("create_build", r["parent"]))
        self._check("cloudbuild.builds.create", r["parent"])
        if build.service_account:
            email = build.service_account.rsplit("/", 1)[-1]
            self._check("iam.serviceAccounts.actAs", build.service_account)
            if self.iam is not None and email not in self.iam.accounts:
                raise gexc.InvalidArgument(f"invalid value for 'build.service_account': {email} does not exist.")
        src = build.source.storage_source
        blob = self.storage.bucket(src.bucket).get_blob(src.object_) if src.bucket else None
        if blob is None:
            raise gexc.InvalidArgument(f"could not resolve source: gs://{src.bucket}/{src.object_}: 404 Not Found")
        if not build.logs_bucket and build.options.logging not in (cb.BuildOptions.LoggingMode.CLOUD_LOGGING_ONLY,
                                                                     cb.BuildOptions.LoggingMode.NONE):
            raise gexc.InvalidArgument("if 'build.service_account' is specified, the build must either (a) specify "
                                       "'build.logs_bucket', (b) use the REGIONAL_USER_OWNED_BUCKET "
                                       "build.options.default_logs_bucket_behavior option, or (c) use either "
                                       "CLOUD_LOGGING_ONLY / NONE logging options")
        build_id = f"build-{len(self.builds) + 1:04d}"
        build.id, build.project_id, build.status = build_id, self.project, B.QUEUED
        build.name = f"{r['parent']}/builds/{build_id}"
        build.log_url = f"https://console.cloud.google.com/cloud-build/builds;region={r['parent'].split('/')[3]}/{build_id}"
        self.builds[build.name] = build
        return _Lro(metadata=cb.BuildOperationMetadata(build=cb.Build(build)))

    def get_build(self, request: Any = None) -> cb.Build:
        name = _req(request, cb.GetBuildRequest)["name"]
        self.calls.append(("get_build", name))
        self._check("cloudbuild.builds.get", name)
        try:
            build = self.builds[name]
        except KeyError:
            raise gexc.NotFound(f"Requested entity was not found: {name}.") from None
        if build.status in _NEXT:
            build.status = _NEXT[build.status]
        elif build.status == B.WORKING:
            self._finish(build)
        return cb.Build(build)

    def _runner(self, build: cb.Build) -> str:
        return build.service_account.rsplit("/", 1)[-1] if build.service_account else self.service_account

    def _may(self, build: cb.Build, permission: str, bucket: str) -> bool:
        policy = self.storage.bucket(bucket).get_iam_policy(requested_policy_version=3)
        return any(f"serviceAccount:{self._runner(build)}" in b["members"] and b["role"] in _GRANTING[permission]
                   for b in policy.bindings)

    def _finish(self, build: cb.Build) -> None:
        src = build.source.storage_source
        logs = build.logs_bucket.removeprefix("gs://").split("/", 1)
        log: list[str] = [f"starting build {build.id}", f"FETCHSOURCE gs://{src.bucket}/{src.object_}"]
        outcome: tuple[cb.Build.FailureInfo.FailureType, str] | None = None
        runner = self._runner(build)
        if not self._may(build, "storage.objects.get", src.bucket):
            outcome = (cb.Build.FailureInfo.FailureType.FETCH_SOURCE_FAILED,
                       f"{runner} does not have storage.objects.get access to gs://{src.bucket}")
        elif self.fail_step:
            log.append(f"Step #0: {self.fail_step}")
            outcome = (cb.Build.FailureInfo.FailureType.USER_BUILD_STEP,
                       "Build step failure: build step 0 \"gcr.io/cloud-builders/docker\" failed: step exited with "
                       "non-zero status: 1")
        else:
            repos = {f"projects/{i.split('/')[1]}/locations/{i.split('/')[0].removesuffix('-docker.pkg.dev')}/"
                     f"repositories/{i.split('/')[2]}" for i in build.images}
            if any(f"serviceAccount:{runner}" not in self.registry.members(repo, WRITER)
                   for repo in repos if repo in self.registry.repositories):
                outcome = (cb.Build.FailureInfo.FailureType.PUSH_NOT_AUTHORIZED,
                           f"denied: Permission \"artifactregistry.repositories.uploadArtifacts\" denied for "
                           f"{runner}")
            for image in build.images if outcome is None else []:
                err, digest = self.registry.push(image, src.object_.encode())
                if err:
                    outcome = (cb.Build.FailureInfo.FailureType.PUSH_FAILED, err)
                    break
                build.results.images.append(cb.BuiltImage(name=image, digest=digest))
                log.append(f"PUSH {image}@{digest}")
        if outcome is None:
            build.status = B.SUCCESS
            log.append("DONE")
        else:
            build.status = B.FAILURE
            build.failure_info = cb.Build.FailureInfo(type_=outcome[0], detail=outcome[1])
            build.status_detail = outcome[1]
            log.append(f"ERROR: {outcome[1]}")
        if logs[0] and self._may(build, "storage.objects.create", logs[0]):
            prefix = logs[1].rstrip("/") + "/" if len(logs) > 1 and logs[1] else ""
            self.storage.bucket(logs[0]).blob(f"{prefix}log-{build.id}.txt").upload_from_string("\n".join(log) + "\n")

    def mutations(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] == "create_build"]
