"""Stand-ins for the controllers the test API server lacks, each doing only what the named source does.

- KubeRay's RayJob controller (ray-operator/controllers/ray/rayjob_controller.go, Reconcile): a new
  RayJob gets the `ray.io/rayjob-finalizer` finalizer, and in ephemeral mode (spec.rayClusterSpec) a
  RayCluster owned by it (constructRayClusterForRayJob: controller reference, blockOwnerDeletion). A
  RayJob being deleted is stopped (StopJob through the dashboard) and the finalizer removed.
- Kubernetes' garbage collector (pkg/controller/garbagecollector): a `foregroundDeletion` owner goes
  once its dependents are deleted; dependents of a deleted owner are deleted (background).
- With ``kueue=True``, Kueue's job reconciler and the collection of its Workloads (kueue_sim).
- KubeRay makes no cluster for a suspended RayJob (a queued one) until it is resumed.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kueue_sim
from kube_api import ApiError, ApiServer

KUBERAY_FINALIZER = "ray.io/rayjob-finalizer"
FOREGROUND = "foregroundDeletion"
POLL_S = 0.1


@dataclass
class Controllers:
    """Runs the stand-ins in a thread for one namespace while helm commands run."""

    api: ApiServer
    namespace: str
    workdir: Path
    operator_stops_jobs: bool = True  # False: KubeRay's finalizer is on the RayJobs, its operator gone
    kueue: bool = False  # also Kueue's job reconciler (kueue_sim) and the collection of Workloads
    stopped_jobs: list[str] = field(default_factory=list)  # RayJobs KubeRay would have stopped (StopJob)
    errors: list[str] = field(default_factory=list)
    _clustered: set[str] = field(default_factory=set)  # RayJobs KubeRay made a cluster for
    _stop: threading.Event = field(default_factory=threading.Event)
    _rounds: int = 0
    _thread: threading.Thread | None = None

    def __enter__(self) -> Controllers:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)
        assert not self.errors, self.errors

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except ApiError as e:
                if e.code not in (404, 409):  # an object went away or changed under us: next round
                    self.errors.append(str(e))
            except Exception as e:  # noqa: BLE001 - surfaced in __exit__
                self.errors.append(repr(e))
            self._rounds += 1
            time.sleep(POLL_S)

    def settle(self, timeout_s: float = 30.0) -> None:
        """Return after two full rounds that started after this call (what the controllers react to now)."""
        target = self._rounds + 2
        deadline = time.monotonic() + timeout_s
        while self._rounds < target:
            assert time.monotonic() < deadline, "the stand-in controllers are stuck"
            time.sleep(POLL_S / 2)

    @property
    def ns(self) -> str:
        return f"/namespaces/{self.namespace}"

    def step(self) -> None:
        self._kuberay()
        if self.kueue:
            kueue_sim.reconcile(self.api, self.namespace)
        self._garbage_collector()
        if self.kueue:
            kueue_sim.collect(self.api, self.namespace)

    # ------------------------------------------------------------ KubeRay's RayJob controller
    def _kuberay(self) -> None:
        kube = self.api.admin
        for job in kube.items(f"/apis/ray.io/v1{self.ns}/rayjobs"):
            meta = job["metadata"]
            path = f"/apis/ray.io/v1{self.ns}/rayjobs/{meta['name']}"
            finalizers = meta.get("finalizers") or []
            if meta.get("deletionTimestamp"):
                if KUBERAY_FINALIZER in finalizers and self.operator_stops_jobs:
                    self.stopped_jobs.append(f"{meta['name']}@{meta['uid']}")
                    kube.merge_patch(path, {"metadata": {"finalizers": [f for f in finalizers if f != KUBERAY_FINALIZER],
                                                         "resourceVersion": meta["resourceVersion"]}})
                continue
            if KUBERAY_FINALIZER not in finalizers:
                kube.merge_patch(path, {"metadata": {"finalizers": [*finalizers, KUBERAY_FINALIZER],
                                                     "resourceVersion": meta["resourceVersion"]}})
            # A suspended RayJob gets no cluster until it is resumed (rayjob_controller.go: New -> Suspended).
            if job["spec"].get("rayClusterSpec") and not job["spec"].get("suspend") and meta["uid"] not in self._clustered:
                self._clustered.add(meta["uid"])
                self._create_job_cluster(job)

    def _create_job_cluster(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        self.api.admin.create(f"/apis/ray.io/v1{self.ns}/rayclusters", {
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {
                "name": f"{meta['name']}-{secrets.token_hex(3)[:5]}",
                "labels": {"ray.io/originated-from-cr-name": meta["name"], "ray.io/originated-from-crd": "RayJob"},
                "ownerReferences": [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": meta["name"], "uid": meta["uid"],
                                     "controller": True, "blockOwnerDeletion": True}],
            },
            "spec": job["spec"]["rayClusterSpec"],
        })

    # ------------------------------------------------------------ the garbage collector
    def _garbage_collector(self) -> None:
        kube = self.api.admin
        owners = {j["metadata"]["uid"]: j for j in kube.items(f"/apis/ray.io/v1{self.ns}/rayjobs")}
        clusters = kube.items(f"/apis/ray.io/v1{self.ns}/rayclusters")
        for cluster in clusters:
            for ref in cluster["metadata"].get("ownerReferences") or []:
                owner = owners.get(ref["uid"])
                if owner is None or FOREGROUND in (owner["metadata"].get("finalizers") or []):
                    kube.delete(f"/apis/ray.io/v1{self.ns}/rayclusters/{cluster['metadata']['name']}")
        live_owner_uids = {ref["uid"] for c in kube.items(f"/apis/ray.io/v1{self.ns}/rayclusters")
                           for ref in c["metadata"].get("ownerReferences") or []}
        for uid, owner in owners.items():
            finalizers = owner["metadata"].get("finalizers") or []
            if FOREGROUND in finalizers and uid not in live_owner_uids:
                kube.merge_patch(f"/apis/ray.io/v1{self.ns}/rayjobs/{owner['metadata']['name']}",
                                 {"metadata": {"finalizers": [f for f in finalizers if f != FOREGROUND],
                                               "resourceVersion": owner["metadata"]["resourceVersion"]}})
