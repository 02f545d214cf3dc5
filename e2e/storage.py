"""The e2e's Cloud Storage: fake-gcs-server run inside the cluster, a Deployment and a Service in a namespace of the run.

It stands in for Google Cloud Storage (no Google here): the trainer reaches it through
STORAGE_EMULATOR_HOST (`http://fake-gcs.<namespace>.svc:4443`, so pods of any namespace on any cluster
reach it), exactly as through the real JSON API. The harness reaches it through `kubectl port-forward`
and reads what the job wrote through the same JSON API, each object downloaded to a local mirror
(`path()`), as `gcloud storage cp` would.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from e2e.kube import Kube, StageError, stop_command

NAME = "fake-gcs"
PORT = 4443
START_TIMEOUT_S = 180


def manifest(namespace: str, image: str, pull_policy: str, labels: dict[str, str]) -> dict:
    """The Deployment and Service; the pod meets the restricted Pod Security Standard."""
    sel = {"app.kubernetes.io/name": NAME}
    meta = {"name": NAME, "namespace": namespace, "labels": {**sel, **labels}}
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    container = {
        "name": NAME, "image": image, "imagePullPolicy": pull_policy,
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
                                    "spec": {"automountServiceAccountToken": False, "containers": [container],
                                             "volumes": [{"name": "data", "emptyDir": {}},
                                                         {"name": "tmp", "emptyDir": {}}]}}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": meta,
           "spec": {"selector": sel, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}}
    return {"apiVersion": "v1", "kind": "List", "items": [deploy, svc]}


class Storage:
    """fake-gcs-server in the cluster; start() then stop() (the namespace's deletion removes the rest)."""

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

    def create_bucket(self, bucket: str) -> None:
        try:
            self._call("POST", "/storage/v1/b?project=gemma3-ray-e2e", json.dumps({"name": bucket}).encode(),
                       {"Content-Type": "application/json"})
        except StageError as e:
            if "HTTP 409" not in str(e):  # exists
                raise

    def upload_tree(self, local: Path, uri: str) -> int:
        """Upload a file or a folder's files under gs://bucket/prefix through the JSON API; the count."""
        bucket, _, prefix = uri[len("gs://"):].partition("/")
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for f in files:
            rel = f.name if local.is_file() else f.relative_to(local).as_posix()
            name = f"{prefix.rstrip('/')}/{rel}" if prefix else rel
            q = urllib.parse.urlencode({"uploadType": "media", "name": name})
            self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{q}", f.read_bytes(),
                       {"Content-Type": "application/octet-stream"})
        return len(files)

    def list(self, uri: str) -> list[str]:
        """Object names under gs://bucket/prefix."""
        bucket, _, prefix = uri[len("gs://"):].partition("/")
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

    def path(self, uri: str) -> Path:
        """A local copy of gs://bucket/key: the object, or the folder of the objects under key/ (absent: neither)."""
        if not uri.startswith("gs://"):
            raise ValueError(f"not a gs:// URI: {uri}")
        bucket, _, key = uri[len("gs://"):].partition("/")
        local = self.mirror / bucket / key
        if local.is_dir():
            shutil.rmtree(local)
        elif local.exists():
            local.unlink()
        key = key.rstrip("/")
        for name in self.list(uri):
            if name != key and not name.startswith(key + "/"):
                continue  # a sibling sharing the prefix (key2/...)
            body = self._call("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")
            dest = self.mirror / bucket / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(body or b"")
        return local
