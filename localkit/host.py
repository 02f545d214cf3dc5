"""This machine, checked before the local kit starts anything: free ports, available memory, other Ray
clusters, and the packages Ray's Jobs API needs. Each failure is one sentence saying what to do."""

from __future__ import annotations

import socket

import psutil

from localkit.errors import LocalKitError

LOCALHOST = "127.0.0.1"
# Ray daemons whose presence means another Ray cluster runs on this machine.
RAY_DAEMONS = ("gcs_server", "raylet")
GIB = 1024**3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return int(s.getsockname()[1])


def require_port_free(port: int, flag: str) -> int:
    """``port`` if nothing listens on 127.0.0.1:port, else a LocalKitError naming the flag to change."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOCALHOST, port))
        except OSError as e:
            raise LocalKitError(
                f"port {port} on {LOCALHOST} is in use ({e.strerror}): pass another with {flag}=<port>, "
                f"or leave {flag} out and a free one is picked"
            ) from e
    return port


def require_memory(min_gib: float) -> float:
    """Available memory in GiB; a LocalKitError if below ``min_gib``."""
    available = psutil.virtual_memory().available / GIB
    if available < min_gib:
        raise LocalKitError(
            f"only {available:.1f} GiB of memory is available; a local Ray head and its training workers need "
            f"about {min_gib:.1f} GiB: close other programs (or stop other Ray clusters "
            "you own) and run it again"
        )
    return available


def other_ray_processes() -> list[psutil.Process]:
    """Ray daemons on this machine that this process did not start."""
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["name", "pid"]):
        name = proc.info.get("name") or ""
        if any(name.startswith(d) for d in RAY_DAEMONS) and proc.pid not in mine:
            found.append(proc)
    return found


def describe_other_ray(procs: list[psutil.Process]) -> str:
    gcs = [p for p in procs if (p.info.get("name") or "").startswith("gcs_server")]
    return (
        f"another Ray cluster runs on this machine ({len(gcs)} gcs_server process(es), pids "
        f"{', '.join(str(p.pid) for p in gcs) or '-'}). This run does NOT attach to it: it starts its own "
        f"head on {LOCALHOST} with free ports. To run on an existing cluster of yours instead, set "
        "RAY_ADDRESS=http://127.0.0.1:<its dashboard port> (it must share this machine's files)."
    )


def require_jobs_api_packages() -> None:
    """The Ray Jobs API runs in Ray's dashboard, which needs ``ray[default]``."""
    import ray._private.utils as ray_utils

    error = ray_utils.get_dashboard_dependency_error()
    if error:
        raise LocalKitError(
            f"Ray's Jobs API needs ray[default], and this Python lacks part of it ({error}): "
            "run `make setup` (or `.venv/bin/pip install 'ray[default]==<the ray pin of trainer/requirements.txt>'`)"
        )
