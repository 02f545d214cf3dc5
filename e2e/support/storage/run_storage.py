"""The e2e's Cloud Storage: one interface (RunStorage) the stages use, in two modes, each a module of its own.

- e2e/support/storage/emulator.py (the default): fake-gcs-server inside the cluster, a Deployment and a Service in a
  namespace of the run, standing in for Google Cloud Storage (no Google here); pods reach it through
  STORAGE_EMULATOR_HOST, the harness through `kubectl port-forward`.
- e2e/support/storage/bucket.py (E2E_BUCKET=gs://NAME[/prefix], only with KUBECONFIG): a real bucket, reached by the pods
  through the chart's Workload Identity values and by the harness with Application Default Credentials;
  everything under `<prefix>/gemma3-ray-e2e-<run id>/`, and only that deleted at the end.

Either way the harness reads what the job wrote through the JSON API, each object downloaded to a local
mirror (`path()`), as `gcloud storage cp` would.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from e2e.support.errors import StageError


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("gs://"):
        raise ValueError(f"not a gs:// URI: {uri}")
    bucket, _, key = uri[len("gs://"):].partition("/")
    return bucket, key


# ------------------------------------------------------------------ the interface
class RunStorage:
    """What the stages use of the run's storage, in either mode: the run's root gs:// URI, uploads, listings,
    local copies, what the pods and the chart need to reach it, and the clean-up."""

    mode = ""
    root = ""  # gs://bucket[/key]: everything the run reads and writes is under it
    mirror: Path

    def start(self) -> None:
        """Make it reachable from this machine."""

    def stop(self) -> None:
        """Stop what start() started here (never what is in the bucket)."""

    def ensure(self) -> None:
        """Ready for the run's objects (the emulator: its bucket made; a real bucket: checked, never made)."""
        raise NotImplementedError

    def uri(self, key: str) -> str:
        """gs:// URI of key under the run's root."""
        return f"{self.root}/{key.strip('/')}"

    def pod_env(self) -> dict[str, str]:
        """Environment the pods need to reach it (rayJob.runtimeEnv.envVars)."""
        return {}

    def chart_sets(self, release: str) -> dict[str, str]:
        """Chart values that put a release's outputs under the run's root ({} : values/e2e.yaml's bucket)."""
        return {}

    def client(self) -> Any:
        """A google-cloud-storage client of this storage."""
        raise NotImplementedError

    def gcloud_env(self, config_dir: str) -> dict[str, str]:
        """Environment for a `gcloud storage` command as NOTES print it, against this storage."""
        return {}

    def describe(self) -> str:
        raise NotImplementedError

    def cleanup(self) -> list[str]:
        """Delete what the run wrote that its namespaces' deletion does not; problems as sentences."""
        return []

    def left(self) -> list[str]:
        """What of the run is still in the storage after cleanup() (summary.json's "left")."""
        return []

    def health(self) -> str:
        """One sentence when the storage itself failed the run (the emulator restarted), else ""."""
        return ""

    # the JSON API, by bucket and object name
    def _upload(self, bucket: str, name: str, file: Path) -> None:
        raise NotImplementedError

    def _download(self, bucket: str, name: str) -> bytes:
        raise NotImplementedError

    def generations(self, uri: str) -> dict[str, str]:
        """Object name -> generation under gs://bucket/prefix. Cloud Storage gives every write of an object a new
        generation, and nothing a job does can write an object back with an old one: what a restart cannot fake."""
        raise NotImplementedError

    def list(self, uri: str) -> list[str]:
        """Object names under gs://bucket/prefix."""
        return list(self.generations(uri))

    def upload_tree(self, local: Path, uri: str) -> int:
        """Upload a file, or a folder's files, under gs://bucket/prefix; the count."""
        if uri.rstrip("/") != self.root and not uri.startswith(self.root + "/"):
            raise StageError(f"{uri} is outside the run's prefix {self.root}/: the e2e writes only there "
                             "(a defect of the e2e harness)")
        bucket, prefix = _split(uri)
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.name if local.is_file() else f.relative_to(local).as_posix()
            self._upload(bucket, f"{prefix.rstrip('/')}/{rel}" if prefix else rel, f)
        return len(files)

    def path(self, uri: str) -> Path:
        """A local copy of gs://bucket/key: the object, or the folder of the objects under key/ (absent: neither)."""
        bucket, key = _split(uri)
        local = self.mirror / bucket / key
        if local.is_dir():
            shutil.rmtree(local)
        elif local.exists():
            local.unlink()
        key = key.rstrip("/")
        for name in self.list(uri):
            if name != key and not name.startswith(key + "/"):
                continue  # a sibling sharing the prefix (key2/...)
            dest = self.mirror / bucket / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(self._download(bucket, name))
        return local
