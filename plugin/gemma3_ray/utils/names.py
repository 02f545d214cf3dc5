"""Validation and derivation of every name the plugin handles (checked before any API call)."""

from __future__ import annotations

import hashlib
import re

from gemma3_ray.utils.errors import InvalidName

PRODUCT = "gemma3-ray"

# https://cloud.google.com/resource-manager/docs/creating-managing-projects (optionally domain-scoped)
_PROJECT_RE = re.compile(r"^(?:[a-z0-9.-]+:)?[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_ZONE_RE = re.compile(r"^([a-z]+-[a-z]+[0-9]+)-[a-z]$")
# https://cloud.google.com/storage/docs/buckets#naming (names without dots)
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")
# https://cloud.google.com/iam/docs/service-accounts-create#creating
_GSA_ID_RE = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
_GSA_EMAIL_RE = re.compile(r"^([a-z][a-z0-9-]{4,28}[a-z0-9])@([a-z0-9.:-]+)\.iam\.gserviceaccount\.com$")
# Kubernetes: RFC 1123 label / subdomain
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
HELM_RELEASE_MAX = 53
_SECRET_KEY_RE = re.compile(r"^[-._a-zA-Z0-9]+$")
# https://cloud.google.com/kubernetes-engine/docs/how-to/creating-a-zonal-cluster (<= 40 chars)
_CLUSTER_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
# NAME, NAME/reservationBlocks/BLOCK, projects/P/reservations/NAME[/reservationBlocks/BLOCK]: the forms
# GKE takes (`--reservation` of node pools; the reservation-name/-project/-blocks node labels).
_RFC1035 = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_RESERVATION_RE = re.compile(
    rf"^(?:projects/(?P<project>[a-z0-9.:-]+)/reservations/)?(?P<name>{_RFC1035})"
    rf"(?:/reservationBlocks/(?P<block>{_RFC1035}))?$")
# Object name prefix: path segments of letters, digits and . _ = - (what the chart's schema and its
# shell-quoted entrypoint accept); no empty, "." or ".." segments.
_PREFIX_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_.=-]+$")
PREFIX_MAX = 512  # object names are <= 1024 bytes; runs/<run>/checkpoint_.../<file> follow the prefix
_MACHINE_TYPE_RE = re.compile(r"^[a-z][a-z0-9]*-[a-z0-9-]+$")


def _bad(field: str, value: str, rule: str, fix: str) -> InvalidName:
    from gemma3_ray.utils.tokens import shown

    return InvalidName(f"Invalid {field} {shown(value)}: {rule}; {fix}.")


def _not_a_token(flag: str, value: str, fix: str) -> None:
    """A value that becomes part of resource names (and so of the values file and every line naming them) must not
    look like a token: it is refused without being shown."""
    from gemma3_ray.utils.tokens import REVOKE_HINT, looks_like_token

    if looks_like_token(value):
        raise InvalidName(f"{flag} looks like a token (not shown; {REVOKE_HINT}): it would be written into resource "
                          f"names, the values file and every line that names them; {fix}.")


def project_id(value: str) -> str:
    if not _PROJECT_RE.match(value):
        raise _bad("project ID", value, "it must be 6-30 lowercase letters, digits or hyphens, start with a "
                   "letter and not end with a hyphen", "pass --project with the project ID (not its name "
                   "or number)")
    return value


def region(value: str) -> str:
    if not _REGION_RE.match(value):
        raise _bad("region", value, "a region looks like us-central1", "pass --region (a zone such as "
                   "us-central1-a goes to --zone)")
    return value


def zone(value: str) -> str:
    if not _ZONE_RE.match(value):
        raise _bad("zone", value, "a zone looks like us-central1-a", "pass --zone")
    return value


def region_of_location(location: str) -> str:
    """The region of a GKE location (a region, or a zone for zonal clusters)."""
    m = _ZONE_RE.match(location)
    if m:
        return m.group(1)
    return region(location)


def bucket(value: str) -> str:
    _not_a_token("--bucket", value, "pass --bucket with the bucket's name")
    value = value.removeprefix("gs://").rstrip("/")
    if not _BUCKET_RE.match(value) or value.startswith("goog") or "google" in value:
        raise _bad("bucket name", value, "it must be 3-63 lowercase letters, digits, '-' or '_', start and "
                   "end with a letter or digit, and not contain 'google'", "pass --bucket with a valid name")
    return value


def default_bucket(project: str) -> str:
    """``<project>-gemma3-ray`` (domain-scoped ``example.com:p`` becomes ``example-com-p``)."""
    return bucket(re.sub(r"[^a-z0-9-]", "-", project) + f"-{PRODUCT}")


def gsa_account_id(value: str) -> str:
    if not _GSA_ID_RE.match(value):
        raise _bad("Google service account ID", value, "it must be 6-30 lowercase letters, digits or hyphens "
                   "and start with a letter", "pass --gsa-name")
    return value


def gsa_email(account_id: str, project: str) -> str:
    """The email of a user-managed service account (domain-scoped projects reverse the domain part)."""
    gsa_account_id(account_id)
    if ":" in project:
        domain, name = project.split(":", 1)
        return f"{account_id}@{name}.{domain}.iam.gserviceaccount.com"
    return f"{account_id}@{project}.iam.gserviceaccount.com"


def split_gsa_email(email: str) -> tuple[str, str]:
    """(account ID, project part) of a service account email; raises InvalidName otherwise."""
    m = _GSA_EMAIL_RE.match(email)
    if not m:
        raise _bad("Google service account email", email, "it must look like NAME@PROJECT.iam.gserviceaccount.com",
                   "pass --gsa-name with just the NAME part")
    return m.group(1), m.group(2)


def dns_label(field: str, value: str, flag: str, max_len: int = DNS_LABEL_MAX) -> str:
    if len(value) > max_len or not _DNS_LABEL_RE.match(value):
        raise _bad(field, value, f"it must be at most {max_len} lowercase letters, digits or '-', starting "
                   "and ending with a letter or digit", f"pass {flag}")
    return value


def cluster_queue(namespace: str, queue: str) -> str:
    """The default ClusterQueue of a namespace's queue: ``NAMESPACE-QUEUE`` (cluster-scoped, so one per team;
    a name over 63 characters keeps its start and ends in 6 hex digits of the whole)."""
    name = f"{namespace}-{queue}"
    if len(name) <= DNS_LABEL_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_GSA_HASH_LEN]
    return f"{name[:DNS_LABEL_MAX - _GSA_HASH_LEN - 1].rstrip('-')}-{digest}"


def dns_subdomain(field: str, value: str, flag: str) -> str:
    if len(value) > DNS_SUBDOMAIN_MAX or not all(_DNS_LABEL_RE.match(p) for p in value.split(".")):
        raise _bad(field, value, "it must be lowercase RFC 1123 labels separated by '.'", f"pass {flag}")
    return value


def namespace(value: str) -> str:
    return dns_label("Kubernetes namespace", value, "--namespace")


def ksa(value: str) -> str:
    return dns_subdomain("Kubernetes service account name", value, "--ksa")


def release(value: str) -> str:
    return dns_label("Helm release name", value, "--release", HELM_RELEASE_MAX)


def secret_name(value: str) -> str:
    return dns_subdomain("Secret name", value, "--hf-secret")


def secret_key(value: str) -> str:
    _not_a_token("--hf-secret-key", value, "pass the key's name, e.g. hf_api_token")
    if not _SECRET_KEY_RE.match(value):
        raise _bad("Secret key", value, "it may hold only letters, digits, '-', '_' and '.'", "pass --hf-secret-key")
    return value


def cluster(value: str) -> str:
    if not _CLUSTER_RE.match(value):
        raise _bad("GKE cluster name", value, "it must be at most 40 lowercase letters, digits or hyphens and "
                   "start with a letter", "pass --cluster")
    return value


def reservation(value: str) -> tuple[str | None, str]:
    """(owner project or None, reservation name) of any form GKE takes (blocks included)."""
    m = _RESERVATION_RE.match(value)
    if not m:
        raise _bad("reservation", value, "it must be NAME, NAME/reservationBlocks/BLOCK or "
                   "projects/PROJECT/reservations/NAME[/reservationBlocks/BLOCK]", "pass --reservation in one of "
                   "those forms")
    return m.group("project"), m.group("name")


def reservation_block(value: str) -> str | None:
    m = _RESERVATION_RE.match(value)
    return m.group("block") if m else None


def prefix(value: str) -> str:
    """The release's folder in the bucket: ``a/b/c`` (slashes at either end are dropped)."""
    _not_a_token("--prefix", value, "pass --prefix like team-a/gemma3-ray")
    stripped = value.strip("/")
    segments = stripped.split("/")
    if not stripped or len(stripped) > PREFIX_MAX or not all(
            _PREFIX_SEGMENT_RE.match(s) and s not in {".", ".."} for s in segments):
        raise _bad("--prefix", value, f"it must be folder names of letters, digits, '.', '_', '=' or '-' joined by '/' "
                   f"(at most {PREFIX_MAX} characters, no empty, '.' or '..' folder)", "pass --prefix like "
                   "team-a/gemma3-ray")
    return stripped


def machine_type(value: str) -> str:
    if not _MACHINE_TYPE_RE.match(value):
        raise _bad("machine type", value, "a machine type looks like a3-highgpu-8g", "pass --machine-type")
    return value


def workload_identity_member(project: str, ns: str, ksa_name: str) -> str:
    """The IAM principal of a Kubernetes service account under GKE Workload Identity."""
    return f"serviceAccount:{project}.svc.id.goog[{ns}/{ksa_name}]"


CHART_FULLNAME_MAX = 40  # the chart's fullname helper keeps names within 40 (KubeRay's derived names)
_CHART_HASH_LEN = 5  # the chart's gemma3-ray.shorten: "-" and 5 hex of the whole name's sha256
_GSA_PREFIX = "g3r-"
_GSA_HASH_LEN = 6
_GSA_ID_MAX = 30


def chart_fullname(release_name: str) -> str:
    """The chart's ``gemma3-ray.fullname`` (no overrides): the release, or ``RELEASE-gemma3-ray``; one over 40
    characters keeps its first 34 (less trailing '-') and ends in '-' and 5 hex of its sha256 (``gemma3-ray.shorten``
    in the chart's templates/_names.tpl), so releases sharing their first 40 characters get different names."""
    name = release_name if PRODUCT in release_name else f"{release_name}-{PRODUCT}"
    if len(name) <= CHART_FULLNAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_CHART_HASH_LEN]
    return f"{name[:CHART_FULLNAME_MAX - _CHART_HASH_LEN - 1].rstrip('-')}-{digest}"


def release_gsa_id(ns: str, release_name: str) -> str:
    """The Google service account of one release: ``g3r-<release>-<hash of namespace/release>``.

    One per (namespace, release), so no two releases share an identity; the hash keeps equal release
    names in different namespaces apart and the ID within IAM's 30 characters.
    """
    digest = hashlib.sha256(f"{ns}/{release_name}".encode()).hexdigest()[:_GSA_HASH_LEN]
    room = _GSA_ID_MAX - len(_GSA_PREFIX) - 1 - _GSA_HASH_LEN
    readable = release_name[:room].rstrip("-")
    return gsa_account_id(f"{_GSA_PREFIX}{readable}-{digest}")
