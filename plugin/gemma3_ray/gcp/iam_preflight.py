"""The permission preflight: which permissions a command needs the caller lacks, before any change.

The permission preflight: Resource Manager's ``projects.testIamPermissions`` says which of the
permissions a command needs the caller lacks on the project, before that command changes anything."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gemma3_ray.config.clients import Clients
from gemma3_ray.utils.errors import ROLE_FOR_PERMISSION, ApiDisabled, PermissionDenied, call_google


def role_for(permission: str) -> str:
    return ROLE_FOR_PERMISSION.get(permission, "a role that contains it")


@dataclass(frozen=True)
class Preflight:
    needed: tuple[str, ...]
    missing: tuple[str, ...]
    unchecked: str = ""  # why the permissions could not be tested (then nothing is refused up front)

    @property
    def mark(self) -> str:
        return "?" if self.unchecked else "!" if self.missing else "="

    def line(self) -> str:
        if self.unchecked:
            return f"permissions: not checked ({self.unchecked})"
        if not self.missing:
            return f"permissions: you hold all {len(self.needed)} this needs ({', '.join(self.needed)})"
        return "permissions MISSING on the project: " + "; ".join(
            f"{p} (in {role_for(p)})" for p in self.missing)

    def require(self, project: str, only: Iterable[str] | None = None) -> None:
        """Refuse before any change when a permission is missing (with ``only``: one of those, the ones that
        can only come from the project; the others may be granted on the resource itself)."""
        missing = [p for p in self.missing if only is None or p in set(only)]
        if missing:
            roles = sorted({role_for(p) for p in missing})
            raise PermissionDenied(
                f"Permission denied before any change: you lack {', '.join(missing)} on project {project}; "
                f"ask a project owner to grant you {' and '.join(roles)} (or a custom role with those permissions).")


def check(clients: Clients, project: str, permissions: Iterable[str]) -> Preflight:
    """Which of ``permissions`` the caller lacks on ``projects/PROJECT`` (one testIamPermissions call)."""
    needed = tuple(dict.fromkeys(permissions))
    resource = f"projects/{project}"
    rm = clients.get_resource_manager()
    try:
        granted = set(call_google("test your permissions on", resource, lambda: rm.test_iam_permissions(
            request={"resource": resource, "permissions": list(needed)})).permissions)
    except ApiDisabled as err:  # a new project may not have the Resource Manager API on yet
        return Preflight(needed, (), unchecked=str(err).split(":", 1)[0])
    return Preflight(needed, tuple(p for p in needed if p not in granted))
