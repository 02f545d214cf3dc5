"""The run's storage emulator: fake-gcs-server inside the cluster (a Deployment and a Service in a namespace of
the run), the stand-in for Google Cloud Storage; the trainer reaches it through STORAGE_EMULATOR_HOST
(`http://fake-gcs.<namespace>.svc:4443`, which pods of any namespace reach), the harness through `kubectl
port-forward`. Its bucket is the run's own and goes with the namespace."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from e2e.support.errors import StageError
from e2e.support.kube import Kube, stop_command
from e2e.support.storage.run_storage import RunStorage, _split

NAME = "fake-gcs"
BINARY = "/bin/fake-gcs-server"  # where e2e/build/image.sh and fake-gcs-server's own image put it
PORT = 4443
START_TIMEOUT_S = 180
# fake-gcs-server keeps each resumable upload in memory until its last chunk (a Go slice that doubles as it grows):
# the e2e's checkpoint (the tiny model's trained 262208x64 embedding: 67 MB of weights, 134 MB of Adam state per
# optimizer.pt) from each of two workers at once. 512Mi was OOMKilled mid-upload (make e2e, 2026-12-03) and the
# restarted server lost the upload session: the trainer saw "UploadChunk ... 404". tests/e2e/test_storage_argv.py
# derives the bound from the tiny model's shapes.
MEMORY_LIMIT = "2Gi"
EMULATOR_BUCKET = "gemma3-ray-e2e"  # the emulator's bucket: the run's own
EMULATOR_PROJECT = "gemma3-ray-e2e"


def manifest(namespace: str, image: str, pull_policy: str, labels: dict[str, str]) -> dict:
    """The Deployment and Service; the pod meets the restricted Pod Security Standard."""
    sel = {"app.kubernetes.io/name": NAME}
    meta = {"name": NAME, "namespace": namespace, "labels": {**sel, **labels}}
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    container = {
        "name": NAME, "image": image, "imagePullPolicy": pull_policy,
        # `command`, not only `args`: Kubernetes' args replace the image's Cmd, and e2e/build/image.sh's image has its
        # binary as Cmd (no Entrypoint), so args alone ran "-scheme" (seen: CrashLoopBackOff, make e2e on main).
        # fake-gcs-server's own image keeps the same binary at the same path.
        "command": [BINARY],
        "args": ["-scheme", "http", "-backend", "filesystem", "-filesystem-root", "/data", "-host", "0.0.0.0",
                 "-port", str(PORT), "-external-url", url, "-log-level", "warn"],
        "ports": [{"name": "http", "containerPort": PORT}],
        "readinessProbe": {"httpGet": {"path": "/storage/v1/b", "port": PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": MEMORY_LIMIT}},
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


def restarts_sentence(pods: list[dict[str, Any]], namespace: str) -> str:
    """'' when no container of the emulator restarted, else one sentence naming the restarts and the last end."""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            n = int(cs.get("restartCount") or 0)
            if n:
                last = (cs.get("lastState") or {}).get("terminated") or {}
                why = f"{last.get('reason') or 'exit'} (exit {last.get('exitCode', '?')})" if last else "unknown"
                hint = (f"; its memory limit is {MEMORY_LIMIT} (e2e/support/storage/emulator.py MEMORY_LIMIT)"
                        if last.get("reason") == "OOMKilled" else "")
                return (f"the storage emulator {namespace}/{pod['metadata']['name']} restarted {n} time(s), last "
                        f"ended {why}{hint}: a restart loses the uploads in progress, so the trainer's upload of "
                        f"that moment failed")
    return ""


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

    def health(self) -> str:
        """A restart of the emulator loses its in-memory upload sessions (the trainer then sees UploadChunk 404):
        say so, with why the container ended, instead of leaving the reader at the trainer's error."""
        try:
            pods = self.kube.items("pods", self.namespace, f"app.kubernetes.io/name={NAME}")
        except StageError as e:
            return f"the storage emulator's pods in {self.namespace} are unreadable: {e}"
        return restarts_sentence(pods, self.namespace)

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

    def generations(self, uri: str) -> dict[str, str]:
        bucket, prefix = _split(uri)
        names: dict[str, str] = {}
        token = ""
        while True:
            q = {"prefix": prefix, **({"pageToken": token} if token else {})}
            body = self._call("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(q)}", ok404=True)
            if body is None:
                return names
            page = json.loads(body)
            names.update({o["name"]: str(o.get("generation", "")) for o in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return names
