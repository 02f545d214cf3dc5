"""E2E_BUCKET=gs://NAME[/prefix]: a real bucket for the run's storage (only with KUBECONFIG). No emulator and
no STORAGE_EMULATOR_HOST: the pods reach the bucket through the chart's Workload Identity values (the
`iam.gke.io/gcp-service-account` annotation, from E2E_VALUES), the harness through google-cloud-storage with
Application Default Credentials. Everything the run writes is under `<prefix>/gemma3-ray-e2e-<run id>/`; at
the end that prefix, and only it, is deleted; the bucket is never created or deleted."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from e2e.support.errors import StageError
from e2e.support.storage.run_storage import RunStorage, _split

BUCKET_ENV = "E2E_BUCKET"
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"  # what the chart's serviceaccount.yaml sets for Workload Identity
RUN_PREFIX = "gemma3-ray-e2e-"  # + the run id: the folder of the bucket a run writes in
BUCKET_FORM = "gs://NAME[/prefix]"
# Cloud Storage's bucket names: 3-63 characters (222 with dots, 63 a part), lowercase letters, digits, -, _, .;
# a letter or digit first and last; never goog… (https://cloud.google.com/storage/docs/buckets#naming)
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
T = TypeVar("T")


def parse_bucket(text: str) -> tuple[str, str]:
    """gs://NAME[/prefix] as (NAME, prefix without its slashes); anything else one sentence."""
    value = text.strip()

    def bad(why: str) -> StageError:
        return StageError(f"E2E_BUCKET={value!r}: {why}; give {BUCKET_FORM}, a bucket that exists (make e2e "
                          "never creates one), e.g. E2E_BUCKET=gs://my-bucket/e2e")

    if not value.startswith("gs://"):
        raise bad("not a gs:// URI")
    name, _, prefix = value[len("gs://"):].partition("/")
    prefix = prefix.rstrip("/")  # gs://b/p/ is gs://b/p; gs://b//p is refused below
    if not name:
        raise bad("no bucket name")
    if (not BUCKET_NAME.fullmatch(name) or len(name) > 222 or any(not 0 < len(p) <= 63 for p in name.split("."))
            or len(name) < 3 or name.startswith("goog") or ".." in name):
        raise bad(f"{name!r} is not a Cloud Storage bucket name (3-63 lowercase letters, digits, '-', '_', '.'; "
                  "a letter or digit first and last; not goog…)")
    parts = prefix.split("/") if prefix else []
    if any(p in ("", ".", "..") for p in parts) or re.search(r"[\s\x00-\x1f#\[\]*?]", prefix):
        raise bad(f"the prefix {prefix!r} has an empty, '.' or '..' part, a space or a wildcard")
    return name, prefix


def bucket_from_env(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """E2E_BUCKET as (bucket, prefix), None when unset; refused without KUBECONFIG."""
    value = (environ.get(BUCKET_ENV) or "").strip()
    if not value:
        return None
    if not environ.get("KUBECONFIG"):
        raise StageError("E2E_BUCKET is set but KUBECONFIG is not: the local cluster cannot reach Google Cloud "
                         "Storage, so a real bucket needs a cluster whose pods reach it (set KUBECONFIG), or unset "
                         "E2E_BUCKET for the in-cluster storage emulator")
    return parse_bucket(value)


def _merged(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """Values files merged as helm merges them: maps key by key, anything else replaced by the later file."""
    def merge(a: Any, b: Any) -> Any:
        if isinstance(a, dict) and isinstance(b, dict):
            return {**a, **{k: merge(a.get(k), v) for k, v in b.items()}}
        return b
    out: dict[str, Any] = {}
    for d in docs:
        out = merge(out, d or {})
    return out


def gsa_from_values(docs: list[dict[str, Any]]) -> str:
    """The Google service account the chart's ServiceAccount is annotated with for these values ('' none):
    serviceAccount.gcpServiceAccount, else serviceAccount.annotations, else commonAnnotations (the chart's order)."""
    v = _merged(docs)
    sa = v.get("serviceAccount") or {}
    return str(sa.get("gcpServiceAccount") or (sa.get("annotations") or {}).get(GSA_ANNOTATION)
               or (v.get("commonAnnotations") or {}).get(GSA_ANNOTATION) or "")


def require_gsa(docs: list[dict[str, Any]]) -> str:
    gsa = gsa_from_values(docs)
    if not gsa:
        raise StageError(f"E2E_BUCKET is set but no E2E_VALUES file sets the Workload Identity annotation the "
                         f"pods reach the bucket with ({GSA_ANNOTATION}): set serviceAccount.gcpServiceAccount to a "
                         "Google service account that can read and write the bucket in a values file given as "
                         "E2E_VALUES")
    return gsa


def adc_client() -> Any:
    """A google-cloud-storage client with this machine's Application Default Credentials; one sentence when none."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        raise StageError(f"E2E_BUCKET names a real bucket but STORAGE_EMULATOR_HOST="
                         f"{os.environ['STORAGE_EMULATOR_HOST']} is set in this shell, which would send the "
                         "harness's requests to that emulator: unset it")
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        creds, project = google.auth.default()
    except DefaultCredentialsError as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise StageError(f"E2E_BUCKET is set but this machine has no Application Default Credentials ({first}): "
                         "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a "
                         "key file") from None
    from google.cloud import storage

    return storage.Client(project=project, credentials=creds)


def _google_errors() -> tuple[type[BaseException], ...]:
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError

    return GoogleAPIError, GoogleAuthError, OSError  # requests' errors are OSErrors


class BucketStorage(RunStorage):
    """gs://bucket/prefix/gemma3-ray-e2e-<run id>/ of a bucket that exists, through google-cloud-storage."""

    mode = "bucket"

    def __init__(self, bucket: str, prefix: str, run_id: str, mirror: Path, client: Any = None) -> None:
        self.bucket, self.prefix, self.run_id, self.mirror = bucket, prefix.strip("/"), run_id, mirror
        self.key = "/".join(filter(None, [self.prefix, f"{RUN_PREFIX}{run_id}"]))
        self.root = f"gs://{bucket}/{self.key}"
        self._client = client

    def client(self) -> Any:
        if self._client is None:
            self._client = adc_client()
        return self._client

    def describe(self) -> str:
        return f"{self.root}/ (the bucket E2E_BUCKET names; no emulator)"

    def chart_sets(self, release: str) -> dict[str, str]:
        """The release's outputs under the run's prefix (the chart's default is gemma3-ray/<release>)."""
        return {"storage.bucket": self.bucket, "storage.prefix": f"{self.key}/{release or 'ct'}"}

    def _do(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except _google_errors() as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0][:240]
            raise StageError(f"E2E_BUCKET gs://{self.bucket}: {what}: {first}") from None

    def ensure(self) -> None:
        """Read, write and delete under the run's prefix, once each, before anything is made in the cluster;
        refused when the prefix already holds objects (never the run's to delete). Leaves nothing."""
        from google.api_core.exceptions import Forbidden, NotFound, Unauthorized

        c = self.client()
        try:
            there = list(c.list_blobs(self.bucket, prefix=self.key + "/", max_results=1))
        except NotFound:
            raise StageError(f"E2E_BUCKET gs://{self.bucket}: no such bucket: name one that exists (make e2e never "
                             "creates or deletes a bucket)") from None
        except (Forbidden, Unauthorized) as e:
            raise StageError(f"E2E_BUCKET gs://{self.bucket}: these Application Default Credentials cannot list "
                             f"it ({str(e).splitlines()[0][:200]}): grant them roles/storage.objectAdmin on the "
                             "bucket, or log in as an account that has it (make e2e never creates a bucket)") from None
        except _google_errors() as e:
            raise StageError(f"E2E_BUCKET gs://{self.bucket}: cannot read it ({str(e).splitlines()[0][:200]}): "
                             "check the name and the network (make e2e never creates a bucket)") from None
        if there:
            raise StageError(f"{self.root}/ already holds objects ({there[0].name}): another run's with the same "
                             f"E2E_RUN_ID={self.run_id}, which this run will not touch: set another E2E_RUN_ID, or "
                             "remove them")
        blob = c.bucket(self.bucket).blob(f"{self.key}/.e2e-check")
        self._do(f"writing {self.root}/.e2e-check", lambda: blob.upload_from_string(b"make e2e"))
        self._do(f"reading {self.root}/.e2e-check", blob.download_as_bytes)
        self._do(f"deleting {self.root}/.e2e-check", blob.delete)

    def _upload(self, bucket: str, name: str, file: Path) -> None:
        blob = self.client().bucket(bucket).blob(name)
        self._do(f"uploading gs://{bucket}/{name}", lambda: blob.upload_from_filename(str(file)))

    def _download(self, bucket: str, name: str) -> bytes:
        return self._do(f"reading gs://{bucket}/{name}", self.client().bucket(bucket).blob(name).download_as_bytes)

    def generations(self, uri: str) -> dict[str, str]:
        bucket, prefix = _split(uri)
        return self._do(f"listing {uri}", lambda: {b.name: str(b.generation)
                                                   for b in self.client().list_blobs(bucket, prefix=prefix)})

    def cleanup(self) -> list[str]:
        """Delete every object under the run's prefix (with its slash: never a sibling sharing its start)."""
        try:
            names = self.list(self.root + "/")
        except StageError as e:
            return [f"listing {self.root}/ to delete it: {e}"]
        problems = []
        bucket = self.client().bucket(self.bucket)
        for name in names:
            try:
                self._do(f"deleting gs://{self.bucket}/{name}", bucket.blob(name).delete)
            except StageError as e:
                if "404" not in str(e) and "No such object" not in str(e):
                    problems.append(str(e))
                if len(problems) >= 3:
                    break
        return problems

    def left(self) -> list[str]:
        try:
            n = len(self.list(self.root + "/"))
        except StageError as e:
            return [f"{self.root}/ (could not list it: {e})"]
        return [f"{self.root}/ ({n} object{'s' if n != 1 else ''})"] if n else []
