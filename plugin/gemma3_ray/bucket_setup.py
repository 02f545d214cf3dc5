"""The bucket the releases share: found and checked (this project's, in the cluster's region), created
hardened (uniform bucket-level access, public access prevention, label ``managed-by=gemma3-ray``)."""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray import names
from gemma3_ray.deployment import Deployment
from gemma3_ray.errors import BucketOwnedElsewhere, RegionMismatch, translate
from gemma3_ray.gcp_clients import Clients

MANAGED_BY_LABEL = ("managed-by", names.PRODUCT)
# Multi-regions hold their member regions: a bucket there serves a cluster in any of them.
MULTI_REGION_PREFIXES = {"US": ("us-", "northamerica-"), "EU": ("europe-",), "ASIA": ("asia-",)}
# Predefined dual-regions and their two regions (https://cloud.google.com/storage/docs/locations).
DUAL_REGIONS = {
    "NAM4": ("us-central1", "us-east1"),
    "EUR4": ("europe-north1", "europe-west4"),
    "ASIA1": ("asia-northeast1", "asia-northeast2"),
}


def location_holds_region(location: str, region: str, data_locations: list[str] | None = None) -> bool:
    """Whether a bucket's location stores data in ``region``: a region, a predefined dual-region, a
    configurable dual-region (location = its multi-region, ``data_locations`` = its two regions), or a
    multi-region."""
    loc, region = location.upper(), region.lower()
    if data_locations:
        return region in {d.lower() for d in data_locations}
    if loc in DUAL_REGIONS:
        return region in DUAL_REGIONS[loc]
    if loc == region.upper():
        return True
    return any(region.startswith(p) for p in MULTI_REGION_PREFIXES.get(loc, ()))


def owned_elsewhere(dep: Deployment) -> BucketOwnedElsewhere:
    return BucketOwnedElsewhere(
        f"The bucket name {dep.bucket!r} is taken by another project (bucket names are global): pass "
        "--bucket with another name."
    )


def read(dep: Deployment, clients: Clients, project_number: str | None = None) -> Any | None:
    """The bucket if it exists and is this project's; raises if the name belongs to another project or
    the bucket is outside the cluster's region."""
    storage = clients.get_storage()
    name = dep.bucket
    try:
        bucket = storage.get_bucket(name)
    except gexc.NotFound:
        return None
    except gexc.Forbidden as exc:
        # Cloud Storage answers 403 for a bucket of another project and for a missing permission:
        # a bucket listed in this project tells the two apart.
        try:
            mine = [b.name for b in storage.list_buckets(prefix=name)]
        except Exception as exc2:
            raise translate(exc2, "list buckets in", f"projects/{dep.project}") from exc2
        if name not in mine:
            raise owned_elsewhere(dep) from exc
        raise translate(exc, "read", f"gs://{name}") from exc
    except Exception as exc:
        raise translate(exc, "read", f"gs://{name}") from exc
    if project_number and bucket.project_number and str(bucket.project_number) != project_number:
        raise owned_elsewhere(dep)
    data_locations = list(getattr(bucket, "data_locations", None) or [])
    if bucket.location and not location_holds_region(bucket.location, dep.region, data_locations):
        where = f"{bucket.location} ({', '.join(data_locations)})" if data_locations else bucket.location
        raise RegionMismatch(
            f"Bucket gs://{name} is in {where} but the cluster is in {dep.region}: pass "
            f"--bucket with a bucket in {dep.region} (cross-region checkpoints are slow and billed)."
        )
    return bucket


def hardened(bucket: Any) -> bool:
    cfg = bucket.iam_configuration
    return bool(cfg.uniform_bucket_level_access_enabled) and cfg.public_access_prevention == "enforced"


def harden(bucket: Any) -> None:
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    try:
        bucket.patch()
    except Exception as exc:
        raise translate(exc, "update", f"gs://{bucket.name}") from exc


def create(dep: Deployment, clients: Clients, project_number: str | None = None) -> None:
    storage = clients.get_storage()
    bucket = storage.bucket(dep.bucket)
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    bucket.labels = dict([MANAGED_BY_LABEL])
    created = True
    try:
        storage.create_bucket(bucket, location=dep.region)
    except gexc.Conflict:
        created = False  # created meanwhile: by a concurrent run, or by another project (checked below)
    except Exception as exc:
        raise translate(exc, "create", f"gs://{dep.bucket}") from exc
    current = read(dep, clients, project_number)
    if current is None:
        raise owned_elsewhere(dep)
    # Read back: the settings must hold whatever served the create (emulators drop some of them).
    key, value = MANAGED_BY_LABEL
    if created and (current.labels or {}).get(key) != value:
        current.labels = {**(current.labels or {}), key: value}
        if hardened(current):
            try:
                current.patch()
            except Exception as exc:
                raise translate(exc, "update", f"gs://{current.name}") from exc
    if not hardened(current):
        harden(current)


def describe(dep: Deployment) -> str:
    return (f"bucket gs://{dep.bucket} in {dep.region} (uniform bucket-level access, public access prevention "
            "enforced)")
