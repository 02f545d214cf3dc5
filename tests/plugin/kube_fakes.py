"""A small in-process stand-in for the Kubernetes API objects the plugin reads (no API server can run
in the test environment): it answers with the kubernetes client's own ApiException codes (404/409)
and model classes, and serves the real KubeRay CRD manifests."""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.kuberay_crds import crd_folder


@functools.cache
def _load_crd(path: Path) -> dict[str, Any]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the manifests are large: the C loader is ~10x faster
    return yaml.load(path.read_text(), Loader=loader)  # noqa: S506 - a safe loader


def crd_manifest(version: str, name: str) -> dict[str, Any]:
    """KubeRay `version`'s CRD manifest `name` (rayclusters, rayjobs): tests/kuberay_crds.py finds them."""
    return copy.deepcopy(_load_crd(crd_folder(version) / f"ray.io_{name}.yaml"))


@dataclass
class FakeCore:
    secrets: dict[tuple[str, str], client.V1Secret] = field(default_factory=dict)
    service_accounts: dict[tuple[str, str], client.V1ServiceAccount] = field(default_factory=dict)
    writes: list[str] = field(default_factory=list)

    def read_namespaced_secret(self, name: str, namespace: str) -> client.V1Secret:
        try:
            return copy.deepcopy(self.secrets[(namespace, name)])
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    def create_namespaced_secret(self, namespace: str, body: client.V1Secret) -> client.V1Secret:
        self.writes.append("create")
        key = (namespace, body.metadata.name)
        if key in self.secrets:
            raise ApiException(status=409, reason="AlreadyExists")
        self.secrets[key] = copy.deepcopy(body)
        return body

    def replace_namespaced_secret(self, name: str, namespace: str, body: client.V1Secret) -> client.V1Secret:
        self.writes.append("replace")
        if (namespace, name) not in self.secrets:
            raise ApiException(status=404, reason="Not Found")
        self.secrets[(namespace, name)] = copy.deepcopy(body)
        return body

    def read_namespaced_service_account(self, name: str, namespace: str) -> client.V1ServiceAccount:
        try:
            return self.service_accounts[(namespace, name)]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None


@dataclass
class FakeApiExtensions:
    crds: dict[str, dict[str, Any]] = field(default_factory=dict)

    def read_custom_resource_definition(self, name: str) -> dict[str, Any]:
        try:
            return self.crds[name]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    @classmethod
    def kuberay(cls, version: str) -> FakeApiExtensions:
        return cls({f"{n}.ray.io": crd_manifest(version, n) for n in ("rayclusters", "rayjobs")})
