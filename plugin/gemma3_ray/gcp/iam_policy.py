"""IAM read-modify-write with etags: add or remove one (role, member) binding without losing others.

Both IAM flavours the plugin edits go through here: service account policies (``google.iam.v1``
protos from the IAM Admin API, which answers a stale etag with ABORTED/409) and bucket policies
(``google.cloud.storage`` ``Policy`` objects; Cloud Storage answers a stale etag with 412). On either,
the whole read-modify-write is retried with jittered exponential backoff, so concurrent writers never
drop each other's bindings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.exceptions import RetryError
from google.api_core.retry import Retry

BACKOFF_BASE_S = 0.05
BACKOFF_MAX_S = 8.0
RETRY_TIMEOUT_S = 120.0  # a new service account can take tens of seconds to reach IAM
# A Google service account created a moment ago may not be visible to IAM yet: setIamPolicy then
# answers 400 "... does not exist". It appears within seconds (eventual consistency).
_NEW_MEMBER_HINTS = ("does not exist", "not found")
# ... except this one: a project none of whose clusters has Workload Identity has no pool at all.
_PERMANENT_HINT = "identity pool does not exist"


@dataclass(frozen=True)
class PolicyAccess:
    """How to read and write one resource's policy and edit its bindings."""

    read: Callable[[], Any]
    write: Callable[[Any], Any]
    has: Callable[[Any, str, str], bool]
    add: Callable[[Any, str, str], None]
    remove: Callable[[Any, str, str], None]


def _retryable(exc: Exception, just_created: bool) -> bool:
    if isinstance(exc, gexc.Conflict | gexc.PreconditionFailed):  # Aborted is a Conflict
        return True
    if isinstance(exc, gexc.NotFound):
        # IAM answers 404 on getIamPolicy/setIamPolicy for a service account created a moment ago.
        return just_created
    if isinstance(exc, gexc.BadRequest | gexc.InvalidArgument):
        text = str(exc).lower()
        if _PERMANENT_HINT in text:  # no Workload Identity pool: permanent, never propagation
            return False
        return any(h in text for h in _NEW_MEMBER_HINTS)
    return False


def update(read: Callable[[], Any], write: Callable[[Any], Any], edit: Callable[[Any], bool], *,
           just_created: bool = False) -> bool:
    """Read-modify-write one policy: ``edit`` changes it in place and says whether it did; the whole
    cycle is retried (google.api_core's Retry: jittered exponential backoff) on a stale etag and, for a
    resource ``just_created``, on IAM's early 404."""
    def cycle() -> bool:
        policy = read()
        if not edit(policy):
            return False
        write(policy)
        return True

    retry = Retry(predicate=lambda exc: _retryable(exc, just_created), initial=BACKOFF_BASE_S, maximum=BACKOFF_MAX_S,
                  multiplier=2.0, timeout=RETRY_TIMEOUT_S)
    try:
        return bool(retry(cycle)())
    except RetryError as exc:
        raise exc.cause or exc from None


def change_binding(access: PolicyAccess, role: str, member: str, *, present: bool, just_created: bool = False) -> bool:
    """Make the unconditional (role, member) binding present or absent; True if the policy was written."""
    def edit(policy: Any) -> bool:
        if access.has(policy, role, member) == present:
            return False
        (access.add if present else access.remove)(policy, role, member)
        return True

    return update(access.read, access.write, edit, just_created=just_created)


# --- google.iam.v1 Policy protos (IAM Admin API: service accounts) ---------------------------------

def _proto_has(policy: Any, role: str, member: str) -> bool:
    return any(b.role == role and member in b.members and not b.condition.expression for b in policy.bindings)


def _proto_add(policy: Any, role: str, member: str) -> None:
    for b in policy.bindings:
        if b.role == role and not b.condition.expression:
            b.members.append(member)
            return
    policy.bindings.add(role=role, members=[member])


def _proto_remove(policy: Any, role: str, member: str) -> None:
    for i, b in enumerate(list(policy.bindings)):
        if b.role == role and member in b.members and not b.condition.expression:
            b.members.remove(member)
            if not b.members:
                del policy.bindings[i]
            return


def service_account_policy(iam: Any, resource: str) -> PolicyAccess:
    return PolicyAccess(
        read=lambda: iam.get_iam_policy(request={"resource": resource}),
        write=lambda p: iam.set_iam_policy(request={"resource": resource, "policy": p}),
        has=_proto_has, add=_proto_add, remove=_proto_remove,
    )


# --- google.cloud.storage Policy (bucket IAM) --------------------------------------------------------

REQUESTED_POLICY_VERSION = 3


def _bucket_has(policy: Any, role: str, member: str) -> bool:
    return any(b["role"] == role and member in b["members"] and not b.get("condition") for b in policy.bindings)


def _bucket_add(policy: Any, role: str, member: str) -> None:
    for b in policy.bindings:
        if b["role"] == role and not b.get("condition"):
            b["members"] = set(b["members"]) | {member}
            return
    policy.bindings.append({"role": role, "members": {member}})


def _bucket_remove(policy: Any, role: str, member: str) -> None:
    for b in list(policy.bindings):
        if b["role"] == role and member in b["members"] and not b.get("condition"):
            b["members"] = set(b["members"]) - {member}
            if not b["members"]:
                policy.bindings.remove(b)
            return


def bucket_policy(bucket: Any) -> PolicyAccess:
    return PolicyAccess(
        read=lambda: bucket.get_iam_policy(requested_policy_version=REQUESTED_POLICY_VERSION),
        write=bucket.set_iam_policy,
        has=_bucket_has, add=_bucket_add, remove=_bucket_remove,
    )
