"""The Google APIs a command needs: which are off, and turning them on.

The Google APIs a command needs: which are off (Service Usage reads only), and turning them on
(one batch request, its long-running operation awaited)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gemma3_ray.config.clients import Clients
from gemma3_ray.utils.errors import call_google

ENABLE_TIMEOUT_S = 300


@dataclass(frozen=True)
class State:
    disabled: tuple[str, ...]
    project_number: str | None  # as Service Usage names the project (projects/NUMBER)


def read(clients: Clients, project: str, services: Iterable[str]) -> State:
    """Which of ``services`` are not enabled in ``project``."""
    su = clients.get_service_usage()
    off: list[str] = []
    number = None
    for service in services:
        name = f"projects/{project}/services/{service}"
        svc = call_google("read the state of", name, lambda n=name: su.get_service(request={"name": n}))
        if svc.parent.startswith("projects/"):
            number = svc.parent.removeprefix("projects/")
        if svc.state.name != "ENABLED":
            off.append(service)
    return State(tuple(off), number)


def enable(clients: Clients, project: str, services: Iterable[str]) -> None:
    """Enable ``services`` in ``project`` and wait until Service Usage says they are on."""
    su = clients.get_service_usage()
    parent = f"projects/{project}"
    ids = list(services)
    op = call_google("enable APIs in", parent, lambda: su.batch_enable_services(
        request={"parent": parent, "service_ids": ids}))
    call_google("enable APIs in", parent, lambda: op.result(timeout=ENABLE_TIMEOUT_S))
