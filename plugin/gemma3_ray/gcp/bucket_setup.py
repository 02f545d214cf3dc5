"""The bucket the releases share: found, checked and created hardened.

The bucket the releases share: found and checked (this project's, in the cluster's region), created
hardened (uniform bucket-level access, public access prevention, label ``managed-by=gemma3-ray``)."""

from __future__ import annotations

from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.utils import names
from gemma3_ray.utils.errors import BucketOwnedElsewhere, RegionMismatch, call_google, translate

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
        bucket = call_google("read", f"gs://{name}", lambda: storage.get_bucket(name), not_found=True,
                             expect=(gexc.Forbidden,))
    except gexc.NotFound:
        return None
    except gexc.Forbidden as exc:
        # Cloud Storage answers 403 for a bucket of another project and for a missing permission:
        # a bucket listed in this project tells the two apart.
        mine = call_google("list buckets in", f"projects/{dep.project}",
                           lambda: [b.name for b in storage.list_buckets(prefix=name)])
        if name not in mine:
            raise owned_elsewhere(dep) from exc
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


def _set_hardening(bucket: Any, label: bool) -> None:
    bucket.iam_configuration.uniform_bucket_level_access_enabled = True
    bucket.iam_configuration.public_access_prevention = "enforced"
    if label:
        key, value = MANAGED_BY_LABEL
        bucket.labels = {**(bucket.labels or {}), key: value}


def harden(bucket: Any, label: bool = False) -> None:
    """Enforce uniform bucket-level access and public access prevention (and, with ``label``, the
    managed-by label) on an existing bucket: one patch, only if something differs."""
    key, value = MANAGED_BY_LABEL
    if hardened(bucket) and (not label or (bucket.labels or {}).get(key) == value):
        return
    _set_hardening(bucket, label)
    call_google("update", f"gs://{bucket.name}", bucket.patch)


def create_hardened(storage: Any, name: str, location: str) -> bool:
    """Create bucket ``name`` in ``location``, hardened and labelled managed-by=gemma3-ray; False when
    it existed already (a 409: a concurrent run's, or another project's: the caller reads it back)."""
    bucket = storage.bucket(name)
    _set_hardening(bucket, label=True)
    try:
        call_google("create", f"gs://{name}", lambda: storage.create_bucket(bucket, location=location),
                    expect=(gexc.Conflict,))
    except gexc.Conflict:
        return False
    return True


def create(dep: Deployment, clients: Clients, project_number: str | None = None) -> None:
    """The releases' bucket: created, then read back and hardened whatever served the create (emulators
    drop some settings); a name taken by another project is an error."""
    created = create_hardened(clients.get_storage(), dep.bucket, dep.region)
    current = read(dep, clients, project_number)
    if current is None:
        raise owned_elsewhere(dep)
    harden(current, label=created)


def describe(dep: Deployment) -> str:
    return (f"bucket gs://{dep.bucket} in {dep.region} (uniform bucket-level access, public access prevention "
            "enforced)")
