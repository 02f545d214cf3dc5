"""The Google Cloud prerequisites Helm cannot create: plan (read-only), then apply (idempotent).

What it makes, least privilege first:
- the APIs the training run needs, enabled;
- the bucket, in the cluster's region, with uniform bucket-level access and public access
  prevention enforced, labelled ``managed-by=gemma3-ray``;
- the Google service account (GSA) the Ray pods act as;
- on that bucket only: ``roles/storage.objectAdmin`` (read/write/delete objects: checkpoints, the
  adapter, metrics) and ``roles/storage.legacyBucketReader`` (``storage.buckets.get`` and
  ``storage.objects.list``: Ray Train's pyarrow GCS filesystem reads the bucket's metadata) —
  instead of the tutorial's project-wide ``roles/storage.admin``;
- on the GSA only: ``roles/iam.workloadIdentityUser`` for
  ``serviceAccount:PROJECT.svc.id.goog[NAMESPACE/KSA]`` (the Kubernetes service account may act as it);
- optionally, the Hugging Face token Secret in the cluster (the token is read from an environment
  variable, never from the command line, and is never printed).

``plan()`` makes only read calls; ``apply()`` re-checks each step as it goes (another run may have
done it meanwhile) and edits IAM policies by read-modify-write with etags, retried on conflict.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray import iam_policy, names
from gemma3_ray.deployment import Deployment
from gemma3_ray.errors import BucketOwnedElsewhere, RegionMismatch, UserError, translate
from gemma3_ray.gcp_clients import Clients

REQUIRED_SERVICES = (
    "container.googleapis.com",
    "storage.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",  # Workload Identity's token exchange
)
BUCKET_ROLES = ("roles/storage.objectAdmin", "roles/storage.legacyBucketReader")
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
MANAGED_BY_LABEL = ("managed-by", names.PRODUCT)
GSA_DESCRIPTION = f"Ray training pods of {names.PRODUCT} (created by `{names.PRODUCT} prereqs`)"
ENABLE_TIMEOUT_S = 300
# Multi-regions hold their member regions: a bucket there serves a cluster in any of them.
MULTI_REGION_PREFIXES = {"US": ("us-", "northamerica-"), "EU": ("europe-",), "ASIA": ("asia-",)}
SECRET_LABEL = "app.kubernetes.io/managed-by"


@dataclass
class Action:
    """One change the plan makes; ``run`` is idempotent (safe after a concurrent run did it)."""

    text: str
    run: Callable[[], None]


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"  + {a.text}" for a in self.actions] + [f"  = {t}" for t in self.in_place]


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


class Prereqs:
    """Plans and applies the prerequisites of one deployment."""

    def __init__(self, dep: Deployment, clients: Clients, hf_token: str | None = None) -> None:
        self.dep = dep
        self.clients = clients
        self.hf_token = hf_token
        self.project_number: str | None = None

    # -- reads ---------------------------------------------------------------------------------
    def _call(self, action: str, resource: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (gexc.NotFound, UserError):
            raise
        except Exception as exc:
            raise translate(exc, action, resource) from exc

    def _services(self, plan: Plan) -> None:
        su = self.clients.get_service_usage()
        disabled = []
        for service in REQUIRED_SERVICES:
            name = f"projects/{self.dep.project}/services/{service}"
            svc = self._call("read the state of", name, lambda n=name: su.get_service(request={"name": n}))
            if svc.parent.startswith("projects/"):
                self.project_number = svc.parent.removeprefix("projects/")
            if svc.state.name != "ENABLED":
                disabled.append(service)
        if not disabled:
            plan.in_place.append(f"APIs enabled: {', '.join(REQUIRED_SERVICES)}")
            return

        def enable() -> None:
            op = self._call("enable APIs in", f"projects/{self.dep.project}", lambda: su.batch_enable_services(
                request={"parent": f"projects/{self.dep.project}", "service_ids": disabled}))
            op.result(timeout=ENABLE_TIMEOUT_S)

        plan.actions.append(Action(f"enable APIs: {', '.join(disabled)}", enable))

    def _bucket_state(self) -> Any | None:
        """The bucket if it exists and is this project's; raises if the name belongs to another project."""
        storage = self.clients.get_storage()
        name = self.dep.bucket
        try:
            bucket = storage.get_bucket(name)
        except gexc.NotFound:
            return None
        except gexc.Forbidden as exc:
            # Cloud Storage answers 403 for a bucket of another project and for a missing permission:
            # a bucket listed in this project tells the two apart.
            mine = self._call("list buckets in", f"projects/{self.dep.project}",
                              lambda: [b.name for b in storage.list_buckets(prefix=name)])
            if name not in mine:
                raise self._owned_elsewhere() from exc
            raise translate(exc, "read", f"gs://{name}") from exc
        except Exception as exc:
            raise translate(exc, "read", f"gs://{name}") from exc
        if self.project_number and bucket.project_number and str(bucket.project_number) != self.project_number:
            raise self._owned_elsewhere()
        data_locations = list(getattr(bucket, "data_locations", None) or [])
        if bucket.location and not location_holds_region(bucket.location, self.dep.region, data_locations):
            where = f"{bucket.location} ({', '.join(data_locations)})" if data_locations else bucket.location
            raise RegionMismatch(
                f"Bucket gs://{name} is in {where} but the cluster is in {self.dep.region}: pass "
                f"--bucket with a bucket in {self.dep.region} (cross-region checkpoints are slow and billed)."
            )
        return bucket

    def _owned_elsewhere(self) -> BucketOwnedElsewhere:
        return BucketOwnedElsewhere(
            f"The bucket name {self.dep.bucket!r} is taken by another project (bucket names are global): pass "
            "--bucket with another name."
        )

    @staticmethod
    def _bucket_hardened(bucket: Any) -> bool:
        cfg = bucket.iam_configuration
        return bool(cfg.uniform_bucket_level_access_enabled) and cfg.public_access_prevention == "enforced"

    def _harden(self, bucket: Any) -> None:
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = "enforced"
        self._call("update", f"gs://{bucket.name}", lambda: bucket.patch())

    def _create_bucket(self) -> None:
        storage = self.clients.get_storage()
        bucket = storage.bucket(self.dep.bucket)
        bucket.iam_configuration.uniform_bucket_level_access_enabled = True
        bucket.iam_configuration.public_access_prevention = "enforced"
        bucket.labels = dict([MANAGED_BY_LABEL])
        created = True
        try:
            storage.create_bucket(bucket, location=self.dep.region)
        except gexc.Conflict:
            created = False  # created meanwhile: by a concurrent run, or by another project (checked below)
        except Exception as exc:
            raise translate(exc, "create", f"gs://{self.dep.bucket}") from exc
        current = self._bucket_state()
        if current is None:
            raise self._owned_elsewhere()
        # Read back: the settings must hold whatever served the create (emulators drop some of them).
        key, value = MANAGED_BY_LABEL
        if created and (current.labels or {}).get(key) != value:
            current.labels = {**(current.labels or {}), key: value}
            if self._bucket_hardened(current):
                self._call("update", f"gs://{current.name}", lambda: current.patch())
        if not self._bucket_hardened(current):
            self._harden(current)

    def _bucket(self, plan: Plan) -> Any | None:
        bucket = self._bucket_state()
        desc = f"bucket gs://{self.dep.bucket} in {self.dep.region} (uniform bucket-level access, public access prevention enforced)"
        if bucket is None:
            plan.actions.append(Action(f"create {desc}", self._create_bucket))
            return None
        if not self._bucket_hardened(bucket):
            plan.actions.append(Action(
                f"enforce uniform bucket-level access and public access prevention on gs://{bucket.name}",
                lambda: self._harden(self.clients.get_storage().get_bucket(self.dep.bucket))))
        else:
            plan.in_place.append(f"bucket gs://{bucket.name} ({bucket.location})")
        return bucket

    def _gsa_exists(self) -> bool:
        iam = self.clients.get_iam()
        try:
            self._call("read", self.dep.gsa_resource, lambda: iam.get_service_account(request={"name": self.dep.gsa_resource}))
        except gexc.NotFound:
            return False
        return True

    def _create_gsa(self) -> None:
        iam = self.clients.get_iam()
        request = {
            "name": f"projects/{self.dep.project}",
            "account_id": self.dep.gsa_id,
            "service_account": {"display_name": names.PRODUCT, "description": GSA_DESCRIPTION},
        }
        try:
            iam.create_service_account(request=request)
        except gexc.AlreadyExists:
            return  # a concurrent run created it
        except Exception as exc:
            raise translate(exc, "create", self.dep.gsa_resource) from exc

    def _gsa(self, plan: Plan) -> bool:
        if self._gsa_exists():
            plan.in_place.append(f"Google service account {self.dep.gsa_email}")
            return True
        plan.actions.append(Action(f"create Google service account {self.dep.gsa_email}", self._create_gsa))
        return False

    def _binding(self, plan: Plan, access: Callable[[], iam_policy.PolicyAccess], resource: str, role: str,
                 member: str, exists: bool) -> None:
        text = f"{role} on {resource} for {member}"
        if exists:
            policy = self._call("read the IAM policy of", resource, lambda: access().read())
            if access().has(policy, role, member):
                plan.in_place.append(text)
                return

        def grant() -> None:
            self._call("set the IAM policy of", resource,
                       lambda: iam_policy.change_binding(access(), role, member, present=True))

        plan.actions.append(Action(f"grant {text}", grant))

    def _bucket_access(self) -> iam_policy.PolicyAccess:
        return iam_policy.bucket_policy(self.clients.get_storage().bucket(self.dep.bucket))

    def _gsa_access(self) -> iam_policy.PolicyAccess:
        return iam_policy.service_account_policy(self.clients.get_iam(), self.dep.gsa_resource)

    def _hf_secret(self, plan: Plan) -> None:
        if self.hf_token is None:
            return
        from gemma3_ray import cluster

        core = self.clients.core_v1 or cluster.core_v1()
        self.clients.core_v1 = core
        where = f"Secret {self.dep.namespace}/{self.dep.hf_secret}"
        current = cluster.read_secret(core, self.dep.namespace, self.dep.hf_secret)
        wanted = base64.b64encode(self.hf_token.encode()).decode()
        if current is not None and (current.data or {}).get(self.dep.hf_secret_key) == wanted:
            plan.in_place.append(f"{where} (key {self.dep.hf_secret_key})")
            return
        verb = "create" if current is None else "update"
        plan.actions.append(Action(
            f"{verb} {where} with the Hugging Face token under key {self.dep.hf_secret_key} (value not shown)",
            lambda: cluster.put_secret(core, self.dep.namespace, self.dep.hf_secret, self.dep.hf_secret_key,
                                       self.hf_token or "", {SECRET_LABEL: names.PRODUCT})))

    # -- the plan ---------------------------------------------------------------------------------
    def plan(self) -> Plan:
        """Every change needed, found with read calls only."""
        plan = Plan()
        self._services(plan)
        bucket = self._bucket(plan)
        gsa_exists = self._gsa(plan)
        for role in BUCKET_ROLES:
            self._binding(plan, self._bucket_access, f"gs://{self.dep.bucket}", role, self.dep.gsa_member,
                          exists=bucket is not None and gsa_exists)
        self._binding(plan, self._gsa_access, self.dep.gsa_email, WORKLOAD_IDENTITY_ROLE, self.dep.wi_member,
                      exists=gsa_exists)
        self._hf_secret(plan)
        return plan

    def apply(self, plan: Plan, log: Callable[[str], None]) -> None:
        for action in plan.actions:
            log(f"  ... {action.text}")
            action.run()


def teardown_plan(dep: Deployment, clients: Clients, delete_bucket: bool) -> Plan:
    """What `down` removes: the bindings and the GSA `prereqs` made; the bucket only when asked."""
    p = Prereqs(dep, clients)
    plan = Plan()
    iam = clients.get_iam()
    gsa_exists = p._gsa_exists()
    if gsa_exists:
        gsa = p._call("read", dep.gsa_resource, lambda: iam.get_service_account(request={"name": dep.gsa_resource}))
        access = p._gsa_access
        policy = p._call("read the IAM policy of", dep.gsa_email, lambda: access().read())
        if access().has(policy, WORKLOAD_IDENTITY_ROLE, dep.wi_member):
            plan.actions.append(Action(
                f"remove {WORKLOAD_IDENTITY_ROLE} on {dep.gsa_email} for {dep.wi_member}",
                lambda: p._call("set the IAM policy of", dep.gsa_email, lambda: iam_policy.change_binding(
                    access(), WORKLOAD_IDENTITY_ROLE, dep.wi_member, present=False))))
    bucket = None
    try:
        bucket = clients.get_storage().get_bucket(dep.bucket)
    except gexc.NotFound:
        pass
    except Exception as exc:
        raise translate(exc, "read", f"gs://{dep.bucket}") from exc
    if bucket is not None:
        policy = p._call("read the IAM policy of", f"gs://{dep.bucket}", lambda: p._bucket_access().read())
        for role in BUCKET_ROLES:
            if p._bucket_access().has(policy, role, dep.gsa_member):
                plan.actions.append(Action(
                    f"remove {role} on gs://{dep.bucket} for {dep.gsa_member}",
                    lambda r=role: p._call("set the IAM policy of", f"gs://{dep.bucket}", lambda: iam_policy.change_binding(
                        p._bucket_access(), r, dep.gsa_member, present=False))))
    if gsa_exists:
        if getattr(gsa, "description", "") == GSA_DESCRIPTION:
            plan.actions.append(Action(f"delete Google service account {dep.gsa_email}", lambda: _delete_gsa(p, dep)))
        else:
            plan.in_place.append(f"Google service account {dep.gsa_email} kept: `prereqs` did not create it")
    if bucket is not None:
        ours = (bucket.labels or {}).get(MANAGED_BY_LABEL[0]) == MANAGED_BY_LABEL[1]
        if delete_bucket and ours:
            plan.actions.append(Action(f"delete bucket gs://{dep.bucket} and every object in it",
                                       lambda: p._call("delete", f"gs://{dep.bucket}", lambda: _delete_bucket(bucket))))
        elif delete_bucket:
            plan.in_place.append(f"bucket gs://{dep.bucket} kept: `prereqs` did not create it")
        else:
            plan.in_place.append(f"bucket gs://{dep.bucket} kept (pass --delete-bucket to delete it and its objects)")
    return plan


def _delete_gsa(p: Prereqs, dep: Deployment) -> None:
    iam = p.clients.get_iam()
    with contextlib.suppress(gexc.NotFound):
        p._call("delete", dep.gsa_resource, lambda: iam.delete_service_account(request={"name": dep.gsa_resource}))


def _delete_bucket(bucket: Any) -> None:
    for blob in bucket.client.list_blobs(bucket.name):
        blob.delete()
    with contextlib.suppress(gexc.NotFound):
        bucket.delete()
