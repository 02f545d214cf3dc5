"""A run's claim on the cluster: one coordination.k8s.io/v1 Lease per run, renewed while the run lives.

The Lease is `gemma3-ray-e2e-<run id>` in the namespace `default` (LEASE_NAMESPACE), labelled RUN_LABEL=<id>:
`default` always exists and no run deletes it, so the Lease outlives every namespace the run makes and is the
last thing of the run to go; a later run finds every run's Lease with one namespace-scoped list. It holds the
run's id (its label and name), its holder (`holderIdentity`: host and pid), `renewTime` (renewed every
RENEW_S by a thread the run stops on every exit path) and `leaseDurationSeconds`; the node changes the run
made (labels, taints, cordon: their values before) are in its annotation NODES_ANNOTATION, written before
the change. A run whose Lease is not renewed for LEASE_S plus SKEW_S (another machine's clock) has ended:
what carries its id is a leftover. Nothing else is: no hostname, no name pattern.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from datetime import datetime, timezone
from typing import Any

from e2e.support.errors import StageError
from e2e.support.kube import Kube, epoch

RUN_LABEL = "gemma3-ray.dev/e2e-run"
LEASE_NAMESPACE = "default"
LEASE_S = 60
RENEW_S = 10
SKEW_S = 30  # another machine's clock may be this far off
NODES_ANNOTATION = "gemma3-ray.dev/e2e-nodes"


def lease_name(run_id: str) -> str:
    return f"gemma3-ray-e2e-{run_id}"


def micro_time(t: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def expired(lease: dict[str, Any], now: float | None = None) -> bool:
    """The run holding this Lease has ended: not renewed for its duration plus SKEW_S."""
    spec = lease.get("spec") or {}
    stamp = spec.get("renewTime") or spec.get("acquireTime")
    if not stamp:
        return True
    last = epoch(stamp)
    return (time.time() if now is None else now) > last + int(spec.get("leaseDurationSeconds") or LEASE_S) + SKEW_S


def run_of(lease: dict[str, Any]) -> str:
    return ((lease.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL, "")


def node_record(lease: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{node: {"labels": {key: value before, or None: absent}, "unschedulable": bool, "taints": [...]}}."""
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(NODES_ANNOTATION) or "{}"
    return json.loads(text)


def all_leases(kube: Kube) -> list[dict[str, Any]]:
    """Every run's Lease (a failed listing is an error, never "none")."""
    return kube.items("leases", LEASE_NAMESPACE, RUN_LABEL)


class Lease:
    """This run's Lease: created once (an existing one is another run's: refused), renewed by a thread."""

    def __init__(self, kube: Kube, run_id: str) -> None:
        self.kube, self.run_id, self.name = kube, run_id, lease_name(run_id)
        self.holder = f"{socket.gethostname()[:100]} pid {os.getpid()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.renew_problem = ""

    def manifest(self) -> dict[str, Any]:
        now = micro_time()
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": LEASE_NAMESPACE, "labels": {RUN_LABEL: self.run_id},
                             "annotations": {NODES_ANNOTATION: "{}"}},
                "spec": {"holderIdentity": self.holder, "leaseDurationSeconds": LEASE_S, "acquireTime": now,
                         "renewTime": now}}

    def create(self) -> None:
        proc = self.kube.k("create", "-f", "-", input_text=json.dumps(self.manifest()), check=False, timeout=60)
        if proc.returncode != 0:
            if "AlreadyExists" in proc.stderr:
                raise StageError(f"Lease {LEASE_NAMESPACE}/{self.name} exists: run id {self.run_id} is another run's "
                                 "(E2E_RUN_ID): unset E2E_RUN_ID or pick another")
            raise StageError(f"creating the run's Lease {LEASE_NAMESPACE}/{self.name}: {proc.stderr.strip()[-300:]}")

    def _patch(self, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        # not through Kube.run: the renewal every RENEW_S would fill e2e.log
        return subprocess.run([self.kube.kubectl, "-n", LEASE_NAMESPACE, "patch", "lease", self.name, "--type=merge",
                               "-p", json.dumps(body)], env=self.kube.environ(), capture_output=True, text=True,
                              timeout=30)

    def renew(self) -> None:
        proc = self._patch({"spec": {"renewTime": micro_time(), "holderIdentity": self.holder}})
        self.renew_problem = "" if proc.returncode == 0 else proc.stderr.strip()[-300:]

    def start(self) -> None:
        """Create the Lease and renew it every RENEW_S until stop()."""
        self.create()

        def loop() -> None:
            while not self._stop.wait(RENEW_S):
                try:
                    self.renew()
                except (OSError, subprocess.SubprocessError) as e:  # the next turn tries again
                    self.renew_problem = str(e)
        self._thread = threading.Thread(target=loop, name=f"lease {self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Renew no more (idempotent): the Lease expires LEASE_S later unless deleted."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=40)
            self._thread = None

    @property
    def renewing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def read(self) -> dict[str, Any]:
        got = self.kube.get("lease", self.name, LEASE_NAMESPACE)
        if got is None:
            raise StageError(f"the run's Lease {LEASE_NAMESPACE}/{self.name} is gone: another run took it for expired")
        return got

    def nodes(self) -> dict[str, dict[str, Any]]:
        return node_record(self.read())

    def set_nodes(self, record: dict[str, dict[str, Any]]) -> None:
        """Write the node record (before any change it records is made)."""
        proc = self._patch({"metadata": {"annotations": {NODES_ANNOTATION: json.dumps(record, sort_keys=True)}}})
        if proc.returncode != 0:
            raise StageError(f"recording node changes in Lease {LEASE_NAMESPACE}/{self.name}: "
                             f"{proc.stderr.strip()[-300:]}")

    def delete(self) -> str:
        proc = self.kube.k("-n", LEASE_NAMESPACE, "delete", "lease", self.name, "--ignore-not-found", check=False,
                           timeout=60)
        return "" if proc.returncode == 0 else f"kubectl delete lease {self.name}: {proc.stderr.strip()[-200:]}"
