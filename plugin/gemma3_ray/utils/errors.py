"""User-facing errors: one clear sentence each, and the translation of Google API errors into them.

Every error a user can meet is a :class:`UserError`; the CLI prints its message (one sentence that
says what is wrong and how to fix it) to stderr and exits with its ``exit_code``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from google.api_core import exceptions as gexc

EXIT_USAGE = 2
EXIT_FAILURE = 1
EXIT_BUG = 70  # EX_SOFTWARE: an error in the plugin itself


class UserError(Exception):
    """An error with a one-sentence, actionable message for the person at the terminal."""

    exit_code = EXIT_FAILURE


class InvalidName(UserError):
    """A name or value given by flag or read from configuration is not valid; raised before any API call."""

    exit_code = EXIT_USAGE


class MissingSetting(UserError):
    """A setting neither a flag, the kube context nor the gcloud configuration provides."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """The gcloud or kube configuration on disk cannot be read."""


class NotLoggedIn(UserError):
    """No usable Google credentials."""


class ApiDisabled(UserError):
    """A Google API is disabled in the project."""


class PermissionDenied(UserError):
    """The caller lacks an IAM permission."""


class BucketOwnedElsewhere(UserError):
    """The bucket name is taken by a bucket of another project (bucket names are global)."""


class RegionMismatch(UserError):
    """The bucket lives in a location that does not hold the cluster's region."""


class NotFound(UserError):
    """Something the command needs does not exist."""


class MissingBinary(UserError):
    """A program the command runs is not installed (or not on PATH)."""


class ClusterError(UserError):
    """The Kubernetes cluster or a resource in it is not in the state the command needs."""


# The predefined role that grants each permission this tool needs, with the least privilege that
# still grants it (https://cloud.google.com/iam/docs/understanding-roles).
ROLE_FOR_PERMISSION: dict[str, str] = {
    "storage.buckets.create": "roles/storage.admin",
    "storage.buckets.get": "roles/storage.admin",
    "storage.buckets.update": "roles/storage.admin",
    "storage.buckets.delete": "roles/storage.admin",
    "storage.buckets.getIamPolicy": "roles/storage.admin",
    "storage.buckets.setIamPolicy": "roles/storage.admin",
    "storage.objects.list": "roles/storage.objectViewer",
    "storage.objects.get": "roles/storage.objectViewer",
    "storage.objects.delete": "roles/storage.objectUser",  # down --delete-data
    "iam.serviceAccounts.create": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.get": "roles/iam.serviceAccountViewer",
    "iam.serviceAccounts.delete": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.getIamPolicy": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.setIamPolicy": "roles/iam.serviceAccountAdmin",
    "serviceusage.services.get": "roles/serviceusage.serviceUsageViewer",
    "serviceusage.services.enable": "roles/serviceusage.serviceUsageAdmin",
    "compute.reservations.get": "roles/compute.viewer",
    "container.clusters.get": "roles/container.clusterViewer",
    # cluster create/delete (gke_cluster), image build (image_build, artifact_registry)
    "container.operations.get": "roles/container.clusterViewer",
    "container.clusters.create": "roles/container.clusterAdmin",
    "container.clusters.update": "roles/container.clusterAdmin",
    "container.clusters.delete": "roles/container.clusterAdmin",
    "cloudbuild.builds.create": "roles/cloudbuild.builds.editor",
    "cloudbuild.builds.get": "roles/cloudbuild.builds.viewer",
    "artifactregistry.repositories.get": "roles/artifactregistry.reader",
    "artifactregistry.repositories.create": "roles/artifactregistry.admin",
    "artifactregistry.repositories.getIamPolicy": "roles/artifactregistry.admin",
    "artifactregistry.repositories.setIamPolicy": "roles/artifactregistry.admin",
    "artifactregistry.tags.get": "roles/artifactregistry.reader",
    "storage.objects.create": "roles/storage.objectCreator",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",  # image build runs as the build's account
}

# "Permission 'x.y.z' denied" (IAM, GCS) and "does not have x.y.z access" (GCS); the generic pattern
# skips e-mail domains such as iam.gserviceaccount.com that appear earlier in the same message.
_PERMISSION_RES = (
    re.compile(r"Permission '([a-z]+\.[A-Za-z]+\.[A-Za-z]+)'"),
    re.compile(r"does not have ([a-z]+\.[A-Za-z]+\.[A-Za-z]+) access"),
    re.compile(r"(?<![@\w.])((?:storage|iam|serviceusage|compute|container|resourcemanager|cloudbuild|artifactregistry)\.(?!gserviceaccount\b)"
               r"[A-Za-z]+\.[A-Za-z]+)\b"),
)
_DISABLED_RE = re.compile(r"([a-z0-9-]+\.googleapis\.com)")


def permission_denied(permission: str, resource: str) -> PermissionDenied:
    role = ROLE_FOR_PERMISSION.get(permission, "a role that contains it")
    return PermissionDenied(
        f"Permission denied: you need '{permission}' on {resource}; ask a project owner to grant you "
        f"{role} (or a custom role with that permission)."
    )


def _reason_and_metadata(exc: gexc.GoogleAPICallError) -> tuple[str, dict[str, str]]:
    """The google.rpc.ErrorInfo reason and metadata the error carries (google.api_core reads them)."""
    return str(exc.reason or ""), dict(exc.metadata or {})


def translate(exc: Exception, action: str, resource: str) -> UserError:
    """Turn a Google API error met while doing ``action`` on ``resource`` into one clear sentence."""
    if isinstance(exc, UserError):
        return exc
    from google.auth import exceptions as auth_exc

    if isinstance(exc, (auth_exc.DefaultCredentialsError, auth_exc.RefreshError)):
        return not_logged_in(str(exc))
    if isinstance(exc, gexc.Unauthenticated):
        return not_logged_in(exc.message or str(exc))
    if isinstance(exc, gexc.PermissionDenied | gexc.Forbidden):
        text = str(exc)
        reason, metadata = _reason_and_metadata(exc)
        if reason in {"SERVICE_DISABLED", "accessNotConfigured"} or "has not been used in project" in text:
            service = metadata.get("service") or next(iter(_DISABLED_RE.findall(text)), "the required API")
            return api_disabled(service, metadata.get("consumer", "").removeprefix("projects/"))
        permission = metadata.get("permission") or next(
            (m.group(1) for r in _PERMISSION_RES if (m := r.search(text))), "")
        if permission:
            return permission_denied(permission, resource)
        return PermissionDenied(f"Permission denied while trying to {action} {resource}: {exc.message}.")
    if isinstance(exc, gexc.BadRequest) and "identity pool does not exist" in str(exc).lower():
        return workload_pool_missing(resource)
    if isinstance(exc, gexc.NotFound):
        return NotFound(f"Could not {action} {resource}: Google Cloud answered 404 (it does not exist, or this "
                        "endpoint does not serve it); check the name, or run `gemma3-ray prereqs --apply` to create it.")
    if isinstance(exc, gexc.RetryError):
        cause = exc.cause
        if isinstance(cause, gexc.GoogleAPICallError):
            detail = f"{cause.code} {_first_line(cause.message or '')}".strip()
            return UserError(f"Could not {action} {resource}: Google answered {detail}, and the client retried until "
                             f"it gave up ({_first_line(exc.message or '')}); {_fix_for(cause)}.")
        if cause is not None and (net := unreachable(cause)) is not None:
            return UserError(f"{str(net).rstrip('.')} (retried until the client gave up: {_first_line(exc.message or '')}).")
        return UserError(f"Could not {action} {resource}: the client retried until it gave up "
                         f"({_first_line(exc.message or '')}); try again in a minute.")
    if isinstance(exc, gexc.GoogleAPICallError):
        detail = f"{exc.code} {_first_line(exc.message or '')}".strip()
        return UserError(f"Could not {action} {resource}: {detail}; {_fix_for(exc)}.")
    net = unreachable(exc)
    if net is not None:
        return net
    return UserError(f"Could not {action} {resource}: {type(exc).__name__}: {_first_line(str(exc))}; this is a bug, "
                     "please report it.")


def is_transport_error(exc: BaseException) -> bool:
    """A failure to talk to a server at all (refused, reset, DNS, TLS, timeout), from any client library."""
    import requests
    import urllib3
    from google.auth import exceptions as auth_exc

    return isinstance(exc, (urllib3.exceptions.HTTPError, requests.exceptions.RequestException,
                            auth_exc.TransportError, ConnectionError, TimeoutError)) or (
        type(exc).__name__ == "ApiException" and getattr(exc, "status", None) == 0)


def kube_unreachable(where: str, why: str) -> ClusterError:
    """The one sentence for a Kubernetes API server that does not answer (from the kubernetes client or helm)."""
    return ClusterError(
        f"Cannot reach the Kubernetes API server{f' at {where}' if where else ''} ({why}): check that the cluster is up "
        "and that the kube context is the right one (`kubectl config current-context`; `gcloud container clusters "
        "get-credentials CLUSTER --location LOCATION` writes it), or pass --kube-context/--kubeconfig; then run this again.")


def unreachable(exc: BaseException) -> UserError | None:
    """A connection error as one sentence with the fix (None: not one). urllib3's own errors come from the
    kubernetes client (the Google clients wrap theirs in requests' or google.auth's)."""
    import urllib3

    if not is_transport_error(exc):
        return None
    why = _first_line(str(getattr(exc, "reason", None) or exc))
    why = "connection refused" if "refused" in why.lower() else why.split(": ", 1)[-1][:160]
    if isinstance(exc, urllib3.exceptions.HTTPError) or type(exc).__name__ == "ApiException":
        pool = getattr(exc, "pool", None)
        return kube_unreachable(f"{pool.host}:{pool.port}" if pool is not None else "", why)
    return UserError(f"Cannot reach Google Cloud ({why}): check your network (and HTTPS_PROXY, if you use one), "
                     "then run this again.")


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].rstrip(".")


def _fix_for(exc: gexc.GoogleAPICallError) -> str:
    if isinstance(exc, gexc.TooManyRequests | gexc.ServiceUnavailable | gexc.DeadlineExceeded
                  | gexc.InternalServerError | gexc.BadGateway | gexc.GatewayTimeout):
        return "a Google-side or quota error: try again in a minute"
    if isinstance(exc, gexc.Conflict):
        return "someone changed it at the same time: run the command again"
    if isinstance(exc, gexc.PreconditionFailed):
        return "it changed since it was read: run the command again"
    return "check the names and flags the message mentions"


def workload_pool_missing(resource: str) -> UserError:
    """Real IAM answers 400 "Identity Pool does not exist" while no cluster of the project has Workload
    Identity: permanent until someone enables it, so never retried."""
    project = resource.split("/")[1] if resource.startswith("projects/") else "PROJECT"
    return UserError(
        f"The Workload Identity pool {project}.svc.id.goog does not exist yet (no cluster of project {project} has "
        "Workload Identity): enable it with `gcloud container clusters update CLUSTER --location LOCATION "
        f"--workload-pool={project}.svc.id.goog` (Autopilot clusters have it), then run `gemma3-ray prereqs --apply` again."
    )


def not_logged_in(detail: str = "") -> NotLoggedIn:
    del detail  # the library's text names files and env vars that confuse more than they help
    return NotLoggedIn(
        "Not logged in to Google Cloud: run `gcloud auth login` and `gcloud auth application-default login`, "
        "then try again."
    )


def api_disabled(service: str, project: str = "") -> ApiDisabled:
    where = f" --project {project}" if project else ""
    also = "" if service == SERVICE_USAGE else " (or run `gemma3-ray prereqs --apply`, which enables it)"
    return ApiDisabled(
        f"The {service} API is disabled in project {project or '(unknown)'}: enable it with "
        f"`gcloud services enable {service}{where}`{also}, then try again."
    )


SERVICE_USAGE = "serviceusage.googleapis.com"  # prereqs enables the others through it, never itself


def call_google(action: str, resource: str, fn: Callable[[], Any], *, not_found: bool = False,
                expect: tuple[type[Exception], ...] = (),
                explain: Callable[[Exception], UserError | None] | None = None) -> Any:
    """``fn()``, its Google errors as one sentence (the one wrapper every Google call goes through).

    Errors of the types in ``expect`` (and, with ``not_found``, a 404) are raised as they are: they are
    the caller's answer (exists already, gone meanwhile). ``explain`` may give a caller's own sentence
    for an error (None: the general translation).
    """
    from google.auth import exceptions as auth_exc

    passthrough = (*expect, *((gexc.NotFound,) if not_found else ()))
    try:
        return fn()
    except UserError:
        raise
    except passthrough:
        raise
    except Exception as exc:
        mine = explain(exc) if explain else None
        if mine is not None:
            raise mine from exc
        if isinstance(exc, gexc.NotFound):
            raise translate(gexc.NotFound(resource), action, resource) from None
        if not isinstance(exc, gexc.GoogleAPIError | auth_exc.GoogleAuthError) and not is_transport_error(exc):
            raise  # not Google's answer: a bug in the plugin, reported as one by the CLI
        raise translate(exc, action, resource) from exc
