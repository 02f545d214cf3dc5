"""The e2e's Cloud Storage: a fake-gcs-server on an address the pods reach, its bucket on local disk.

It stands in for Google Cloud Storage (no Google here): the trainer reaches it through
STORAGE_EMULATOR_HOST exactly as through the real JSON API, and the e2e reads what the job wrote as
plain files under its root (the server's filesystem backend), as `gcloud storage ls` would list them.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from demo.local_cluster import _fake_gcs_binary, free_port, stop_tree
from e2e.kube import StageError

START_TIMEOUT_S = 30


@dataclass
class Storage:
    """A running fake-gcs-server: its URL (as the pods use it) and its root on this machine."""

    process: subprocess.Popen
    host: str
    port: int
    root: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def path(self, uri: str) -> Path:
        """The local file of a gs://bucket/key object."""
        if not uri.startswith("gs://"):
            raise ValueError(f"not a gs:// URI: {uri}")
        return self.root / uri[len("gs://"):]

    def _request(self, url: str, data: bytes | None = None, method: str = "GET",
                 ctype: str = "application/json") -> bytes:
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.read()

    def create_bucket(self, bucket: str) -> None:
        try:
            self._request(f"{self.url}/storage/v1/b?project=gemma3-ray-e2e", json.dumps({"name": bucket}).encode(),
                          "POST")
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise StageError(f"storage: could not create bucket {bucket}: HTTP {e.code}") from e

    def upload_tree(self, local: Path, uri: str) -> int:
        """Upload a file or a folder's files under gs://bucket/prefix through the JSON API; the count."""
        bucket, _, prefix = uri[len("gs://"):].partition("/")
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.name if local.is_file() else f.relative_to(local).as_posix()
            name = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
            q = urllib.parse.urlencode({"uploadType": "media", "name": name})
            self._request(f"{self.url}/upload/storage/v1/b/{bucket}/o?{q}", f.read_bytes(), "POST",
                          "application/octet-stream")
        return len(files)

    def stop(self) -> None:
        stop_tree(self.process.pid)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_storage(host: str, root: Path, log_path: Path) -> Storage:
    """fake-gcs-server bound to host (the node bridge address the pods reach), objects under root."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://{host}:{port}"
    cmd = [str(_fake_gcs_binary()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(root),
           "-host", host, "-port", str(port), "-external-url", url, "-public-host", f"{host}:{port}",
           "-log-level", "warn"]
    log = open(log_path, "wb")  # noqa: SIM115 - the child's lifetime
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = Storage(proc, host, port, root)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StageError(f"storage: fake-gcs-server exited {proc.returncode} on {url}; see {log_path}")
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as resp:
                if resp.status == 200:
                    return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    server.stop()
    raise StageError(f"storage: fake-gcs-server did not answer at {url}; see {log_path}")
