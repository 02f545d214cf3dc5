"""The e2e's Cloud Storage: the demo's fake-gcs-server on an address the pods reach, its bucket on local disk.

It stands in for Google Cloud Storage (no Google here): the trainer reaches it through
STORAGE_EMULATOR_HOST exactly as through the real JSON API, and the e2e reads what the job wrote as
plain files under its root (the server's filesystem backend), as `gcloud storage ls` would list them.
"""

from __future__ import annotations

import urllib.parse
import urllib.request
from pathlib import Path

from demo.local_cluster import FakeGcs, start_fake_gcs


class Storage(FakeGcs):
    """demo's FakeGcs, bound to the node bridge, with uploads through the JSON API."""

    def path(self, uri: str) -> Path:
        """The local file of a gs://bucket/key object."""
        if not uri.startswith("gs://"):
            raise ValueError(f"not a gs:// URI: {uri}")
        return self.local_path(uri)

    def upload_tree(self, local: Path, uri: str) -> int:
        """Upload a file or a folder's files under gs://bucket/prefix through the JSON API; the count."""
        bucket, _, prefix = uri[len("gs://"):].partition("/")
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.name if local.is_file() else f.relative_to(local).as_posix()
            name = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
            q = urllib.parse.urlencode({"uploadType": "media", "name": name})
            req = urllib.request.Request(f"{self.url}/upload/storage/v1/b/{bucket}/o?{q}", data=f.read_bytes(),
                                         method="POST", headers={"Content-Type": "application/octet-stream"})
            with urllib.request.urlopen(req, timeout=60):
                pass
        return len(files)


def start_storage(host: str, root: Path, log_path: Path) -> Storage:
    """fake-gcs-server bound to host (the node bridge address the pods reach), objects under root."""
    return start_fake_gcs(root, log_path, host=host, kind=Storage)
