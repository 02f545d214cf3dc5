"""What one release may do on the shared bucket: its conditional IAM bindings, and how they are told apart.

Every release (namespace + release name) gets its own Google service account and, on the bucket,
one binding for that account with an IAM condition titled ``gemma3-ray NAMESPACE/RELEASE`` (the
title is how `down --prereqs` finds exactly this release's grant, and nothing else):
``roles/storage.objectUser`` limited to the release's prefix: ``storage.objects.{create, delete,
get, list, restore, update}`` and ``storage.multipartUploads.*`` (plus folder/managed-folder
permissions that uniform bucket-level access makes moot) — what the job does: write and overwrite
checkpoints, the adapter, metrics and the summary, read them back to resume, delete old checkpoints
(Ray Train's ``num_to_keep``), multipart uploads of large shards. It lacks
``storage.objects.getIamPolicy``/``setIamPolicy`` (object ACLs), which ``roles/storage.objectAdmin``
adds and the job never needs. The condition matches object names under ``PREFIX/`` and, for
``storage.objects.list`` (whose resource is the bucket), list requests whose prefix is under
``PREFIX/`` (the ``storage.googleapis.com/objectListPrefix`` request attribute).

No bucket-level role: pyarrow's GCS file system (Ray Train writes through it) creates a directory
by walking up from it until an existing directory object answers (any error counts as "missing"),
and reads the bucket's metadata only when none does (arrow's ``CreateDirMarkerRecursive`` in
``cpp/src/arrow/filesystem/gcsfs.cc``). `prereqs` creates the directory object ``PREFIX/``, so the
walk stops inside the prefix: no ``storage.buckets.get``, no object outside the prefix.

Another release's objects — even in the same bucket — are out of reach of these grants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gemma3_ray.utils import names

OBJECT_ROLE = "roles/storage.objectUser"
ROLES = (OBJECT_ROLE,)
TITLE_PREFIX = f"{names.PRODUCT} "
_TITLE_RE = re.compile(rf"^{re.escape(TITLE_PREFIX)}(?P<ns>[a-z0-9-]+)/(?P<release>[a-z0-9-]+)$")
_EXPR_PREFIX_RE = re.compile(r'objects/(?P<prefix>[^"]*)/"\)')


@dataclass(frozen=True)
class Grant:
    """One conditional binding of a release on the bucket."""

    role: str
    member: str
    title: str
    expression: str

    def condition(self, description: str) -> dict[str, str]:
        return {"title": self.title, "description": description, "expression": self.expression}

    def text(self, bucket: str) -> str:
        return f"{self.role} on gs://{bucket} for {self.member} (condition '{self.title}': its prefix only)"


def title(namespace: str, release: str) -> str:
    return f"{TITLE_PREFIX}{namespace}/{release}"


def object_expression(bucket: str, prefix: str) -> str:
    return (f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}/") || '
            f'api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("{prefix}/")')


def for_release(bucket: str, prefix: str, namespace: str, release: str, member: str) -> tuple[Grant, ...]:
    t = title(namespace, release)
    return (Grant(OBJECT_ROLE, member, t, object_expression(bucket, prefix)),)


def description(prefix: str) -> str:
    return f"objects under {prefix}/ only (written by `{names.PRODUCT} prereqs`)"


# --- reading a bucket policy (google.cloud.storage Policy: bindings are dicts) ------------------------

def has(policy: Any, grant: Grant) -> bool:
    return any(b["role"] == grant.role and grant.member in b["members"] and _same_condition(b, grant)
               for b in policy.bindings)


def _same_condition(binding: dict[str, Any], grant: Grant) -> bool:
    cond = binding.get("condition") or {}
    return cond.get("title") == grant.title and cond.get("expression") == grant.expression


def add(policy: Any, grant: Grant, desc: str) -> None:
    policy.version = 3  # conditional bindings need policy version 3
    for b in policy.bindings:
        if b["role"] == grant.role and _same_condition(b, grant):
            b["members"] = set(b["members"]) | {grant.member}
            return
    policy.bindings.append({"role": grant.role, "members": {grant.member}, "condition": grant.condition(desc)})


def remove_release(policy: Any, namespace: str, release: str) -> list[str]:
    """Drop every binding titled for this release; returns what was dropped (role: members)."""
    t = title(namespace, release)
    dropped = [f"{b['role']} for {', '.join(sorted(b['members']))}" for b in policy.bindings
               if (b.get("condition") or {}).get("title") == t]
    policy.bindings[:] = [b for b in policy.bindings if (b.get("condition") or {}).get("title") != t]
    policy.version = 3
    return dropped


@dataclass(frozen=True)
class Holder:
    """A release that holds grants on the bucket (read back from a condition title)."""

    namespace: str
    release: str
    members: frozenset[str]
    prefixes: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.release}"


def holders(policy: Any) -> list[Holder]:
    """Every release with gemma3-ray grants on the bucket."""
    found: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
    for b in policy.bindings:
        cond = b.get("condition") or {}
        m = _TITLE_RE.match(cond.get("title", ""))
        if not m:
            continue
        members, prefixes = found.setdefault((m["ns"], m["release"]), (set(), set()))
        members.update(b["members"])
        prefixes.update(p["prefix"] for p in _EXPR_PREFIX_RE.finditer(cond.get("expression", "")))
    return [Holder(ns, rel, frozenset(mem), frozenset(pre)) for (ns, rel), (mem, pre) in sorted(found.items())]


def overlaps(a: str, b: str) -> bool:
    """Whether two prefixes share objects (one is a folder of the other)."""
    return (a + "/").startswith(b + "/") or (b + "/").startswith(a + "/")
