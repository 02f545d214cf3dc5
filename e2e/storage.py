"""The e2e's Cloud Storage, one interface (RunStorage) in two modes.

- The emulator (the default): fake-gcs-server run inside the cluster, a Deployment and a Service in a
  namespace of the run. It stands in for Google Cloud Storage (no Google here): the trainer reaches it
  through STORAGE_EMULATOR_HOST (`http://fake-gcs.<namespace>.svc:4443`, so pods of any namespace on any
  cluster reach it), exactly as through the real JSON API. The harness reaches it through `kubectl
  port-forward`; its bucket is the run's own and goes with the namespace.
- A real bucket (E2E_BUCKET=gs://NAME[/prefix], only with KUBECONFIG): no emulator and no
  STORAGE_EMULATOR_HOST; the pods reach the bucket through the chart's Workload Identity values (the
  `iam.gke.io/gcp-service-account` annotation, from E2E_VALUES), the harness through the
  google-cloud-storage client with Application Default Credentials. Everything the run writes is under
  `<prefix>/gemma3-ray-e2e-<run id>/`; at the end that prefix, and only it, is deleted. The bucket is
  never created or deleted.

Either way the harness reads what the job wrote through the JSON API, each object downloaded to a local
mirror (`path()`), as `gcloud storage cp` would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from e2e.kube import Kube, StageError, stop_command

NAME = "fake-gcs"
BINARY = "/bin/fake-gcs-server"  # where e2e/image.sh and fake-gcs-server's own image put it
PORT = 4443
START_TIMEOUT_S = 180
EMULATOR_BUCKET = "gemma3-ray-e2e"  # the emulator's bucket: the run's own
EMULATOR_PROJECT = "gemma3-ray-e2e"
BUCKET_ENV = "E2E_BUCKET"
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"  # what the chart's serviceaccount.yaml sets for Workload Identity
RUN_PREFIX = "gemma3-ray-e2e-"  # + the run id: the folder of the bucket a run writes in
BUCKET_FORM = "gs://NAME[/prefix]"
# Cloud Storage's bucket names: 3-63 characters (222 with dots, 63 a part), lowercase letters, digits, -, _, .;
# a letter or digit first and last; never goog… (https://cloud.google.com/storage/docs/buckets#naming)
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*[a-z0-9]")
T = TypeVar("T")


# ------------------------------------------------------------------ E2E_BUCKET
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

    # the JSON API, by bucket and object name
    def _upload(self, bucket: str, name: str, file: Path) -> None:
        raise NotImplementedError

    def _download(self, bucket: str, name: str) -> bytes:
        raise NotImplementedError

    def list(self, uri: str) -> list[str]:
        """Object names under gs://bucket/prefix."""
        raise NotImplementedError

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


# ------------------------------------------------------------------ the emulator in the cluster
def manifest(namespace: str, image: str, pull_policy: str, labels: dict[str, str]) -> dict:
    """The Deployment and Service; the pod meets the restricted Pod Security Standard."""
    sel = {"app.kubernetes.io/name": NAME}
    meta = {"name": NAME, "namespace": namespace, "labels": {**sel, **labels}}
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    container = {
        "name": NAME, "image": image, "imagePullPolicy": pull_policy,
        # `command`, not only `args`: Kubernetes' args replace the image's Cmd, and e2e/image.sh's image has its
        # binary as Cmd (no Entrypoint), so args alone ran "-scheme" (seen: CrashLoopBackOff, make e2e on main).
        # fake-gcs-server's own image keeps the same binary at the same path.
        "command": [BINARY],
        "args": ["-scheme", "http", "-backend", "filesystem", "-filesystem-root", "/data", "-host", "0.0.0.0",
                 "-port", str(PORT), "-external-url", url, "-log-level", "warn"],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/storage/v1/b", "port": PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
              "spec": {"replicas": 1, "selector": {"matchLabels": sel},
                       "template": {"metadata": {"labels": {**sel, **labels}},
                                    "spec": {"automountServiceAccountToken": False,
                                             # no FAKE_GCS_* service links: fake-gcs-server reads FAKE_GCS_PORT as its
                                             # port and refused the link's "tcp://IP:4443" (seen: CrashLoopBackOff)
                                             "enableServiceLinks": False, "containers": [container],
                                             "volumes": [{"name": "data", "emptyDir": {}},
                                                         {"name": "tmp", "emptyDir": {}}]}}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"selector": sel, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}}
    return {"apiVersion": "v1", "kind": "List", "items": [deploy, svc]}


class EmulatorStorage(RunStorage):
    """fake-gcs-server in the cluster; start() then stop() (the namespace's deletion removes the rest)."""

    mode = "emulator"
    root = f"gs://{EMULATOR_BUCKET}"

    def __init__(self, kube: Kube, namespace: str, image: str, pull_policy: str, mirror: Path, log_path: Path,
                 labels: dict[str, str] | None = None) -> None:
        self.kube, self.namespace, self.image, self.pull_policy = kube, namespace, image, pull_policy
        self.mirror, self.log_path, self.labels = mirror, log_path, labels or {}
        self.forward: subprocess.Popen | None = None
        self.local_port = 0

    @property
    def cluster_url(self) -> str:
        """Where pods reach it (STORAGE_EMULATOR_HOST)."""
        return f"http://{NAME}.{self.namespace}.svc:{PORT}"

    @property
    def url(self) -> str:
        """Where this machine reaches it (the port-forward)."""
        return f"http://127.0.0.1:{self.local_port}"

    def describe(self) -> str:
        return f"{self.cluster_url} (an in-cluster Deployment, image {self.image})"

    def pod_env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.cluster_url}

    def client(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=EMULATOR_PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.url})

    def gcloud_env(self, config_dir: str) -> dict[str, str]:
        """gcloud against the emulator: its endpoint, no credentials, a config of its own."""
        return {"CLOUDSDK_CONFIG": config_dir, "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{self.url}/",
                "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true", "CLOUDSDK_CORE_PROJECT": EMULATOR_PROJECT,
                "CLOUDSDK_CORE_DISABLE_PROMPTS": "1", "CLOUDSDK_STORAGE_USE_GRPC_IF_AVAILABLE": "false",
                "CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK": "true", "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false"}

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.kube.run([self.kube.kubectl, "apply", "-f", "-"], what="storage emulator Deployment",
                      input_text=json.dumps(manifest(self.namespace, self.image, self.pull_policy, self.labels)))
        self.kube.run([self.kube.kubectl, "-n", self.namespace, "rollout", "status", f"deployment/{NAME}",
                       f"--timeout={START_TIMEOUT_S}s"], check=False, timeout=START_TIMEOUT_S + 30)

        def available() -> bool:
            d = self.kube.get("deployment", NAME, self.namespace) or {}
            return bool((d.get("status") or {}).get("availableReplicas"))
        self.kube.wait_for(f"the storage emulator ({self.image}) available in {self.namespace}", available, 30,
                           self.namespace)
        self._port_forward()

    def _port_forward(self) -> None:
        self.stop()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it for its whole life
        proc = subprocess.Popen([self.kube.kubectl, "-n", self.namespace, "port-forward", f"service/{NAME}",
                                 f":{PORT}", "--address", "127.0.0.1"], env=self.kube.environ(),
                                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        log.close()
        self.forward = proc
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline() if proc.stdout else ""
            m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", line or "")
            if m:
                self.local_port = int(m.group(1))
                return
            if proc.poll() is not None:
                break
        self.stop()
        raise StageError(f"kubectl port-forward service/{NAME} -n {self.namespace} did not start (see {self.log_path})")

    def stop(self) -> None:
        proc, self.forward = self.forward, None
        if proc is not None:
            stop_command(proc)

    # ------------------------------------------------------------------ the JSON API
    def _call(self, method: str, path: str, data: bytes | None = None, headers: dict[str, str] | None = None,
              ok404: bool = False) -> bytes | None:
        for attempt in (1, 2):
            req = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=headers or {})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    return r.read()
            except urllib.error.HTTPError as e:
                if ok404 and e.code == 404:
                    return None
                raise StageError(f"storage emulator: {method} {path[:120]}: HTTP {e.code} {e.read()[:200]!r}") from e
            except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
                if attempt == 2:
                    raise StageError(f"storage emulator: {method} {path[:120]} through the port-forward: {e}") from e
                self._port_forward()  # a port-forward ends when its connection breaks: once more on a new one
        return None

    def ensure(self) -> None:
        """The emulator's bucket (the run's own)."""
        try:
            self._call("POST", f"/storage/v1/b?project={EMULATOR_PROJECT}",
                       json.dumps({"name": EMULATOR_BUCKET}).encode(), {"Content-Type": "application/json"})
        except StageError as e:
            if "HTTP 409" not in str(e):  # exists
                raise

    def _upload(self, bucket: str, name: str, file: Path) -> None:
        q = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", file.read_bytes(),
                   {"Content-Type": "application/octet-stream"})

    def _download(self, bucket: str, name: str) -> bytes:
        return self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media") or b""

    def list(self, uri: str) -> list[str]:
        bucket, prefix = _split(uri)
        names, token = [], ""
        while True:
            q = {"prefix": prefix, **({"pageToken": token} if token else {})}
            body = self._call("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(q)}", ok404=True)
            if body is None:
                return names
            page = json.loads(body)
            names += [o["name"] for o in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return names


# ------------------------------------------------------------------ a real bucket
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

    def list(self, uri: str) -> list[str]:
        bucket, prefix = _split(uri)
        return self._do(f"listing {uri}", lambda: [b.name for b in self.client().list_blobs(bucket, prefix=prefix)])

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
