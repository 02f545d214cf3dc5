"""The local cluster: a private Ray head on 127.0.0.1, the Ray cluster the chart's RayJob runs on.

``ray start --head --block`` on free (or given) ports bound to 127.0.0.1, a temp dir of its own, token
authentication ON with a fresh random token (passed in the environment, never argv). Started as a
child process of its caller and stopped by its process ids (and those of its descendants): never
``ray stop``, which would stop every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from localkit.errors import LocalKitError
from localkit.host import LOCALHOST, free_port, require_port_free
from localkit.processes import Owned, OwnsProcess, Stopped

RAY_START_TIMEOUT_S = 90.0
# The head's dashboard agent runs the Jobs API's jobs; the Jobs API answers before it does (2 s later on an
# idle 2-core machine here). A head whose agent never comes up refuses every job ("No available agent to
# submit job"): seen once in CI, its logs gone with the temp dir. Waited for here, and the head started again.
AGENT_START_TIMEOUT_S = 90.0
HEAD_START_ATTEMPTS = 2
POLL_S = 0.5
# Ray's shared-memory object store: the job passes no large objects; keep it small on shared machines.
OBJECT_STORE_BYTES = 512 * 1024**2


def _temp_dir_name() -> Path:
    # Unix socket paths are limited to ~107 bytes: a short temp dir under /tmp. Named first, made in
    # start(): an interrupt in between leaves nothing to remove.
    return Path("/tmp") / f"g3r-local-{secrets.token_hex(6)}"


@dataclass
class RayHead(OwnsProcess):
    """A local Ray head of this process: described first, then started; stop() ends it on any path."""

    num_cpus: int
    log_path: Path
    gcs_port: int
    dashboard_port: int
    token: str = field(repr=False, default_factory=lambda: secrets.token_hex(32))
    temp_dir: Path = field(default_factory=_temp_dir_name)
    agent_port: int = field(default_factory=free_port)  # the dashboard agent's HTTP port
    agent_timeout_s: float = field(default=AGENT_START_TIMEOUT_S, kw_only=True)
    # Where start() says that it starts the head again, and why.
    note: Callable[[str], None] = field(default=print, repr=False, kw_only=True)
    attempts: list[str] = field(default_factory=list, kw_only=True)  # why each earlier start was given up
    # Ports the user chose are kept when the head starts again; the others are picked afresh.
    gcs_port_given: bool = field(default=False, kw_only=True)
    dashboard_port_given: bool = field(default=False, kw_only=True)

    @property
    def gcs_address(self) -> str:
        return f"{LOCALHOST}:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://{LOCALHOST}:{self.dashboard_port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def seen(self) -> dict[int, psutil.Process]:
        return self.owned.seen if self.owned else {}

    def remember_pids(self) -> None:
        """Record the head's process tree now (worker processes come and go)."""
        if self.owned:
            self.owned.remember()

    @property
    def agent_url(self) -> str:
        return f"http://{LOCALHOST}:{self.agent_port}"

    @property
    def logs_copy(self) -> Path:
        """Where a failed start leaves the head's logs (its temp dir is removed when it stops)."""
        return self.log_path.parent / "ray-head-logs"

    def start(self) -> None:
        """``ray start --head --block``; returns once its Jobs API and its job agent answer. A start that
        fails is stopped, its logs kept in ``logs_copy``, and the head started again on fresh ports and a
        fresh temp dir, up to HEAD_START_ATTEMPTS times; then a LocalKitError naming the logs."""
        for attempt in range(1, HEAD_START_ATTEMPTS + 1):
            try:
                self._start_once()
                return
            except HeadStartFailed as exc:
                kept = self.keep_logs(f"start-attempt-{attempt}")
                stopped = self.owned.stop() if self.owned else Stopped(None)
                remove_temp_dir(self.temp_dir)
                self.attempts.append(str(exc))
                if attempt == HEAD_START_ATTEMPTS:
                    self.stopped = stopped
                    raise LocalKitError(
                        f"the local Ray head did not start after {attempt} attempt{'s' if attempt > 1 else ''} "
                        f"(the last: {exc}); its logs: "
                        f"{kept or self.log_path}. Run it again; if it fails the same way, the "
                        "logs name the cause (dashboard_agent.log, raylet.out)") from None
                self.note(f"the local Ray head did not start ({exc}); stopped its {len(stopped.stopped)} "
                          f"processes, logs kept in {kept or self.log_path}; starting it again on fresh ports")
                self.owned = None
                self.temp_dir = _temp_dir_name()
                self.agent_port = free_port()
                if not self.gcs_port_given:
                    self.gcs_port = free_port()
                if not self.dashboard_port_given:
                    self.dashboard_port = free_port()

    def keep_logs(self, label: str) -> Path | None:
        """Copy the head's session logs and its `ray start` output to ``logs_copy/label`` (the temp dir
        goes when the head stops); the copy's path, or None when nothing could be copied."""
        dest = self.logs_copy / label
        with contextlib.suppress(OSError, shutil.Error):
            dest.mkdir(parents=True, exist_ok=True)
            src = self.temp_dir / "session_latest" / "logs"
            if src.is_dir():
                shutil.copytree(src, dest, symlinks=False, ignore_dangling_symlinks=True, dirs_exist_ok=True)
            if self.log_path.is_file():
                shutil.copy2(self.log_path, dest / "ray-start.log")
        return dest if dest.is_dir() and any(dest.iterdir()) else None

    def _start_once(self) -> None:
        env = dict(os.environ)
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            RAY_USAGE_STATS_ENABLED="0",
            # Ray resolves --node-ip-address=127.0.0.1 to the machine's routable address (and binds its
            # servers there) unless it runs as a single-machine cluster: this keeps every Ray server
            # (GCS, raylet, agents, workers) on 127.0.0.1.
            RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
            # Ray 2.60's `ray start --block` drains its node on SIGTERM for up to this long before it stops
            # anything (for Ray Serve's proxies); a node holding an actor (Ray Train's detached state actor, after
            # every job) never drains, so each stop waited the whole 30 s default and ended in SIGKILL. This head
            # serves one job of ours and stops after it: nothing to drain for.
            RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",
            # The job's `python` is this Python (the entry point says `python ...`).
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        )
        cmd = [
            _ray_cli(), "start", "--head", "--block",
            f"--node-ip-address={LOCALHOST}",
            f"--port={self.gcs_port}",
            "--include-dashboard=true",
            f"--dashboard-host={LOCALHOST}",
            f"--dashboard-port={self.dashboard_port}",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={self.agent_port}",
            f"--metrics-export-port={free_port()}",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            "--disable-usage-stats",
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.owned = Owned(marker=f"--temp-dir={self.temp_dir}")
        self.temp_dir.mkdir(mode=0o700)
        with open(self.log_path, "wb") as log:
            proc = self.owned.popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        self._wait_for("its Jobs API", lambda: _answers(f"{self.dashboard_url}/api/version", self.token),
                       RAY_START_TIMEOUT_S, proc)
        self._wait_for("its job agent", lambda: _answers(f"{self.agent_url}/api/healthz", self.token),
                       self.agent_timeout_s, proc)

    def _wait_for(self, what: str, up: Callable[[], bool], timeout_s: float, proc: subprocess.Popen) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
                hint = ""
                if any("already in use" in ln for ln in lines[-25:]):
                    hint = " (a port is in use: pass free ones with --ray-port/--dashboard-port, or omit them)"
                last = f": {lines[-1][:200]}" if lines else ""
                raise HeadStartFailed(f"`ray start --head` exited with code {proc.returncode}{hint}{last}")
            if up():
                self.remember_pids()
                return
            self.remember_pids()
            if time.monotonic() >= deadline:
                raise HeadStartFailed(f"{what} did not answer within {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def stop(self) -> list[int]:
        """Stop every process of this head by id and remove its temp dir; idempotent."""
        if self.stopped is None:
            self.stopped = self.owned.stop() if self.owned else Stopped(None)
        remove_temp_dir(self.temp_dir)
        return self.stopped.stopped

    def stop_sentence(self) -> str:
        """What stop() did, in one sentence (only what it did)."""
        self.stop()
        s = self.stopped
        removed = f"; removed {self.temp_dir}" if not self.temp_dir.exists() else f"; could not remove {self.temp_dir}"
        if s.root is None and not s.stopped:
            return "the local Ray head had not started a process" + removed
        head = (f"stopped the local Ray head by process id: pid {s.root} and {len(s.stopped) - 1} descendants"
                if s.root else f"stopped {len(s.stopped)} processes of the local Ray head by process id")
        if s.left:
            return (f"{head}, but pids {', '.join(map(str, s.left))} still run: stop them with "
                    f"`kill -9 {' '.join(map(str, s.left))}`{removed}")
        return head + removed


def _ray_cli() -> str:
    exe = Path(sys.executable).with_name("ray")
    if not exe.exists():
        raise LocalKitError(f"the `ray` command is missing next to {sys.executable}: run `make setup`")
    return str(exe)


class HeadStartFailed(LocalKitError):
    """One start of the head failed (it exited, or a server of it never answered): start() tries again."""


def _answers(url: str, token: str) -> bool:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def ray_head(num_cpus: int, log_path: Path, gcs_port: int | None = None,
             dashboard_port: int | None = None) -> RayHead:
    """A head on free (or the given, checked) ports; nothing started yet: call start(), and stop() in a finally."""
    return RayHead(num_cpus, log_path,
                   require_port_free(gcs_port, "--ray-port") if gcs_port else free_port(),
                   require_port_free(dashboard_port, "--dashboard-port") if dashboard_port else free_port(),
                   gcs_port_given=bool(gcs_port), dashboard_port_given=bool(dashboard_port))


def start_ray_head(num_cpus: int, log_path: Path, gcs_port: int | None = None,
                   dashboard_port: int | None = None) -> RayHead:
    """Start a head bound to 127.0.0.1 and return once its Jobs API answers; on any failure or interrupt
    during the start, everything it started is stopped before the exception goes on."""
    head = ray_head(num_cpus, log_path, gcs_port, dashboard_port)
    try:
        head.start()
    except BaseException:
        head.stop()
        raise
    return head


def remove_temp_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
