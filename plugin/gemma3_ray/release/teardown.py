"""What `down --prereqs` removes: exactly what `prereqs` made for this release.

What `down --prereqs` removes: exactly what `prereqs` made for this release — never what another
release still uses (that is kept, and the releases using it are named)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import grants, iam_policy
from gemma3_ray.release.prereqs import WORKLOAD_IDENTITY_ROLE, Prereqs, gsa_owner
from gemma3_ray.utils.errors import call_google
from gemma3_ray.utils.plan import Action


@dataclass
class Removal:
    """What a `down` step removes (``actions``), keeps (with why) and finds already gone."""

    actions: list[Action] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    absent: list[str] = field(default_factory=list)

    def extend(self, other: Removal) -> None:
        self.actions += other.actions
        self.kept += other.kept
        self.absent += other.absent


def _wi_members(policy: Any) -> set[str]:
    return {m for b in policy.bindings if b.role == WORKLOAD_IDENTITY_ROLE and not b.condition.expression
            for m in b.members}


def plan(dep: Deployment, clients: Clients, delete_data: bool) -> Removal:
    """Read-only: what removing this release's prerequisites takes."""
    p = Prereqs(dep, clients)
    out = Removal()
    storage = clients.get_storage()
    where = f"gs://{dep.bucket}"
    try:
        bucket = call_google("read", where, lambda: storage.get_bucket(dep.bucket), not_found=True)
    except gexc.NotFound:
        bucket = None

    others: list[grants.Holder] = []
    if bucket is None:
        out.absent.append(f"bucket {where} (does not exist: no grants or objects to remove)")
    else:
        access = iam_policy.bucket_policy(storage.bucket(dep.bucket))
        policy = call_google("read the IAM policy of", where, access.read)
        others = [h for h in grants.holders(policy) if h.name != dep.owner]
        mine = [h for h in grants.holders(policy) if h.name == dep.owner]
        if mine:
            roles = sorted({b["role"] for b in policy.bindings
                            if (b.get("condition") or {}).get("title") == grants.title(dep.namespace, dep.release)})

            def drop() -> None:
                call_google("set the IAM policy of", where, lambda: iam_policy.update(
                    access.read, access.write, lambda pol: bool(grants.remove_release(pol, dep.namespace, dep.release))))

            out.actions.append(Action(f"this release's grants on {where} ({', '.join(roles)})", drop))
        else:
            out.absent.append(f"grants of release {dep.owner} on {where}")

    gsa = p.read_gsa()
    if gsa is None:
        out.absent.append(f"Google service account {dep.gsa_email}")
    else:
        out.extend(_gsa_removal(dep, p, gsa, others))

    if bucket is not None:
        out.extend(_data_removal(dep, clients, others, delete_data))
        users = f"; also used by {', '.join(h.name for h in others)}" if others else ""
        out.kept.append(f"bucket {where} (shared by the releases; never deleted by `down`{users})")
    return out


def _gsa_removal(dep: Deployment, p: Prereqs, gsa: Any, others: list[grants.Holder]) -> Removal:
    out = Removal()
    access = p.gsa_policy()
    policy = call_google("read the IAM policy of", dep.gsa_email, access.read)
    members = _wi_members(policy)
    if dep.wi_member in members:
        out.actions.append(Action(
            f"{WORKLOAD_IDENTITY_ROLE} on {dep.gsa_email} for {dep.wi_member}",
            lambda: call_google("set the IAM policy of", dep.gsa_resource, lambda: iam_policy.change_binding(
                p.gsa_policy(), WORKLOAD_IDENTITY_ROLE, dep.wi_member, present=False))))
    else:
        out.absent.append(f"{WORKLOAD_IDENTITY_ROLE} on {dep.gsa_email} for {dep.wi_member}")
    owner = gsa_owner(gsa.description)
    users = sorted(members - {dep.wi_member}) + [f"release {h.name} (bucket grants)" for h in others
                                                  if dep.gsa_member in h.members]
    # The references: every release using the account has its Workload Identity binding on the account's own
    # policy (and grants naming it on the bucket); the last release to go deletes it, whichever created it.
    if owner is None:
        out.kept.append(f"Google service account {dep.gsa_email} (not created by `prereqs`)")
    elif users:
        out.kept.append(f"Google service account {dep.gsa_email} (still used by {', '.join(users)})")
    else:
        last = "" if owner == dep.owner else f" (created for release {owner}; no release uses it any more)"
        out.actions.append(Action(f"Google service account {dep.gsa_email}{last}", lambda: _delete_gsa(p, dep)))
    return out


def _data_removal(dep: Deployment, clients: Clients, others: list[grants.Holder], delete_data: bool) -> Removal:
    out = Removal()
    folder = f"gs://{dep.bucket}/{dep.prefix}/"
    if not delete_data:
        out.kept.append(f"objects under {folder} (checkpoints, adapter, metrics; --delete-data deletes them)")
        return out
    sharing = [h.name for h in others if any(grants.overlaps(x, dep.prefix) for x in h.prefixes)]
    if sharing:
        out.kept.append(f"objects under {folder} (not deleted: release {', '.join(sharing)} uses that prefix too)")
        return out
    storage = clients.get_storage()
    blobs = call_google("list", folder, lambda: list(storage.list_blobs(dep.bucket, prefix=dep.prefix + "/")))
    if not blobs:
        out.absent.append(f"objects under {folder}")
        return out
    out.actions.append(Action(f"{len(blobs)} object(s) under {folder}",
                              lambda: call_google("delete objects under", folder, lambda: _delete_blobs(blobs))))
    return out


def _delete_gsa(p: Prereqs, dep: Deployment) -> None:
    iam = p.clients.get_iam()
    with contextlib.suppress(gexc.NotFound):  # gone meanwhile
        call_google("delete", dep.gsa_resource, lambda: iam.delete_service_account(request={"name": dep.gsa_resource}),
                    not_found=True)


def _delete_blobs(blobs: list[Any]) -> None:
    for blob in blobs:
        with contextlib.suppress(gexc.NotFound):
            blob.delete()
