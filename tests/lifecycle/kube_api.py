"""The session's real kube-apiserver (../shared/kube-apiserver) as the lifecycle tests use it, and a small JSON client.

`apiserver.sh start DIR` runs etcd + kube-apiserver v1.32 on 127.0.0.1 with the KubeRay CRDs; there is
no controller-manager, scheduler or kubelet (see its README). The client speaks plain REST with the
admin token, or with any bearer token (a ServiceAccount's, from the TokenRequest API).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180
REQUEST_TIMEOUT_S = 30


def shared_dir() -> Path | None:
    """$GEMMA3_SHARED_DIR, else shared/ beside the checkout (as in CI), else /work/shared."""
    for candidate in (os.environ.get("GEMMA3_SHARED_DIR"), str(ROOT.parent / "shared"), "/work/shared"):
        if candidate and (Path(candidate) / "kuberay-crds" / "v1.7.0").is_dir():
            return Path(candidate)
    return None


class ApiError(RuntimeError):
    def __init__(self, code: int, body: dict[str, Any]):
        super().__init__(f"HTTP {code}: {body.get('message', body)}")
        self.code, self.body = code, body


@dataclass
class Kube:
    """REST calls against one API server with one bearer token."""

    server: str
    ca_file: str
    token: str

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json", "Content-Type": content_type})
        tls = ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S, context=tls) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                parsed = json.loads(raw or b"{}")
            except ValueError:
                parsed = {"message": raw.decode(errors="replace")}
            raise ApiError(e.code, parsed) from None

    def get(self, path: str) -> dict[str, Any] | None:
        try:
            return self.call("GET", path)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def items(self, path: str) -> list[dict[str, Any]]:
        return self.call("GET", path).get("items", [])

    def create(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self.call("POST", path, obj)

    def merge_patch(self, path: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.call("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any] | None:
        try:
            return self.call("DELETE", path, body)
        except ApiError as e:
            if e.code == 404:
                return None
            raise


@dataclass
class ApiServer:
    """A running API server: its directory, kubeconfig, URL, CA and admin client."""

    dir: Path
    kubeconfig: Path
    admin: Kube
    crds: Path

    @property
    def server(self) -> str:
        return self.admin.server

    def env(self) -> dict[str, str]:
        """Environment for helm/kubectl: this server only (never a user's kubeconfig)."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HELM_CACHE_HOME": str(self.dir / "helm-cache"),
                "HELM_CONFIG_HOME": str(self.dir / "helm-config"), "HELM_DATA_HOME": str(self.dir / "helm-data")}

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["kubectl", *args], capture_output=True, text=True, env=self.env(), check=check, timeout=120)

    def use_crds(self, version: str) -> None:
        """Serve the KubeRay CRDs of `version` (v1.7.0, v1.5.0 or v1.4.2) from now on."""
        from tests.plugin.kube_apiserver import serve_kuberay

        serve_kuberay(self.kubeconfig, version)

    def served_rayjob_schema(self) -> dict[str, Any]:
        crd = self.admin.call("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayjobs.ray.io")
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        return v1["schema"]["openAPIV3Schema"]

    def namespace(self, name: str) -> str:
        """A fresh namespace with the `default` ServiceAccount a controller-manager would have made."""
        self.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.admin.create(f"/api/v1/namespaces/{name}/serviceaccounts",
                          {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        return name

    def token_for(self, namespace: str, service_account: str, seconds: int = 3600) -> str:
        """A real ServiceAccount token (TokenRequest API, what `kubectl create token` calls)."""
        resp = self.admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                                 {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                  "spec": {"expirationSeconds": seconds}})
        return resp["status"]["token"]


def connect(kubeconfig: Path) -> ApiServer:
    """The API server of an admin kubeconfig written by `apiserver.sh start`."""
    shared = shared_dir()
    assert shared is not None, "no ../shared/kuberay-crds beside the checkout (set GEMMA3_SHARED_DIR)"
    cfg = yaml.safe_load(kubeconfig.read_text())
    cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
    return ApiServer(kubeconfig.parent, kubeconfig, Kube(cluster["server"], cluster["certificate-authority"], user["token"]),
                     shared / "kuberay-crds" / "v1.7.0")
