"""One `make e2e` at a time per machine, names unique per run, and nothing of it left on the cluster.

- The lock (`$GEMMA3_RAY_CACHE/e2e.lock`, flock) is taken before anything is written: a second
  concurrent run is refused with the first's pid, before it touches the first's log, storage or names.
- The run id (E2E_RUN_ID, else random) suffixes every namespace; every namespace gets the labels
  RUN_LABEL=<id> and HOST_LABEL=<this machine>.
- Leftovers first: holding the lock, any namespace labelled with this machine is a killed run's: it
  goes, with the cluster-scoped objects only it used (below), and a sentence names them.
- At the end, the cluster-scoped objects the run made go too: ClusterQueues, ResourceFlavors,
  WorkloadPriorityClasses, AdmissionCheck/ProvisioningRequestConfig made by `gemma3-ray kueue setup`
  (its managed-by label) that did not exist when the run began and that only the run's namespaces used,
  and the PriorityClasses it created. `left()` lists what is still there (the summary's "left").
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from e2e.support.kube import Kube

RUN_LABEL = "gemma3-ray.dev/e2e-run"
HOST_LABEL = "gemma3-ray.dev/e2e-host"
KUEUE_OWNER = "app.kubernetes.io/managed-by=gemma3-ray-kueue-setup"
# the description e2e/stages/shared_cluster.py gives the PriorityClasses it creates (how a killed run's are known)
PRIORITY_CLASS_MARK = "e2e:"
# one id per process: the stage modules name their namespaces with it at import (run_name)
RUN_ID = os.environ.get("E2E_RUN_ID") or secrets.token_hex(3)
# cluster-scoped kinds `gemma3-ray kueue setup` makes (plugin/gemma3_ray/kueue/objects.py)
KUEUE_KINDS = ("clusterqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io",
               "workloadpriorityclasses.kueue.x-k8s.io", "admissionchecks.kueue.x-k8s.io",
               "provisioningrequestconfigs.kueue.x-k8s.io")


class Busy(RuntimeError):
    """Another make e2e holds the machine's lock."""


def cache_dir() -> Path:
    return Path(os.environ.get("GEMMA3_RAY_CACHE") or Path.home() / ".cache" / "gemma3-ray")


def take_lock(path: Path | None = None) -> IO[str]:
    """The machine's e2e lock, held until the returned file is closed (or the process ends)."""
    path = path or cache_dir() / "e2e.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a+")  # noqa: SIM115 - held for the run
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown pid"
        f.close()
        raise Busy(f"another make e2e runs on this machine ({holder}): wait for it to end, or stop it with ^C "
                   f"(its clean-up runs), then run again") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}, output {os.getcwd()}/e2e-output")
    f.flush()
    return f


def run_name(base: str, run_id: str = "") -> str:
    """base-<run id>: a namespace name unique to this run."""
    return f"{base}-{run_id or RUN_ID}"


def host_label_value() -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in socket.gethostname())[:63].strip("-_.") or "host"


@dataclass
class Session:
    kube: Kube
    run_id: str = RUN_ID
    before: dict[str, set[str]] = field(default_factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.run_id, HOST_LABEL: host_label_value()}

    def name(self, base: str) -> str:
        """A namespace name unique to this run."""
        return run_name(base, self.run_id)

    # ------------------------------------------------------------------ what exists
    def _names(self, kind: str, selector: str = "") -> set[str]:
        args = ["get", kind, "-o", "name"] + (["-l", selector] if selector else [])
        proc = self.kube.k(*args, check=False, timeout=60)
        return {n.split("/", 1)[-1] for n in proc.stdout.split()} if proc.returncode == 0 else set()

    def _json(self, kind: str, ns: str | None = None) -> list[dict]:
        args = ["get", kind, "-o", "json"] + (["-n", ns] if ns else [])
        proc = self.kube.k(*args, check=False, timeout=60)
        return json.loads(proc.stdout).get("items", []) if proc.returncode == 0 else []

    def snapshot(self) -> None:
        """The cluster-scoped objects that exist as the run begins (never deleted by it)."""
        for kind in (*KUEUE_KINDS, "priorityclasses"):
            self.before[kind] = self._names(kind)

    # ------------------------------------------------------------------ clean-up
    def _kueue_objects_of(self, namespaces: set[str], only_new: bool) -> list[tuple[str, str]]:
        """The kueue-setup objects only these namespaces use (ClusterQueue <- LocalQueue; flavors, checks,
        priorities <- those ClusterQueues / workloads), as (kind, name), in deletion order."""
        lqs = self._json_all("localqueues.kueue.x-k8s.io")
        ours_cq = {lq["spec"].get("clusterQueue") for lq in lqs if lq["metadata"]["namespace"] in namespaces}
        theirs_cq = {lq["spec"].get("clusterQueue") for lq in lqs if lq["metadata"]["namespace"] not in namespaces}
        managed = {k: self._names(k, KUEUE_OWNER) for k in KUEUE_KINDS}
        new = (lambda k, n: n not in self.before.get(k, set())) if only_new else (lambda k, n: True)
        cqs = {n for n in managed["clusterqueues.kueue.x-k8s.io"]
               if n in ours_cq and n not in theirs_cq and new("clusterqueues.kueue.x-k8s.io", n)}
        kept_cq = [c for c in self._json("clusterqueues.kueue.x-k8s.io") if c["metadata"]["name"] not in cqs]
        used_flavors = {f["name"] for c in kept_cq for rg in c["spec"].get("resourceGroups", [])
                        for f in rg.get("flavors", [])}
        used_checks = {a if isinstance(a, str) else a.get("name") for c in kept_cq
                       for a in c["spec"].get("admissionChecks", []) + [
                           s.get("name") for s in c["spec"].get("admissionChecksStrategy", {}).get("admissionChecks", [])]}
        used_prio = {w["spec"].get("priorityClassName") for w in self._json_all("workloads.kueue.x-k8s.io")
                     if w["metadata"]["namespace"] not in namespaces}
        out = [("clusterqueues.kueue.x-k8s.io", n) for n in sorted(cqs)]
        for kind, used in (("resourceflavors.kueue.x-k8s.io", used_flavors),
                           ("admissionchecks.kueue.x-k8s.io", used_checks),
                           ("provisioningrequestconfigs.kueue.x-k8s.io", set()),
                           ("workloadpriorityclasses.kueue.x-k8s.io", used_prio)):
            out += [(kind, n) for n in sorted(managed[kind]) if n not in used and new(kind, n)]
        return out

    def _json_all(self, kind: str) -> list[dict]:
        proc = self.kube.k("get", kind, "-A", "-o", "json", check=False, timeout=60)
        return json.loads(proc.stdout).get("items", []) if proc.returncode == 0 else []

    def delete(self, objs: list[tuple[str, str]], namespaces: list[str]) -> list[str]:
        problems = []
        for kind, name in objs:
            proc = self.kube.k("delete", kind, name, "--ignore-not-found", "--wait=false", check=False, timeout=120)
            if proc.returncode != 0:
                problems.append(f"kubectl delete {kind} {name}: {proc.stderr.strip()[-200:]}")
        for ns in namespaces:
            proc = self.kube.k("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=180s",
                               check=False, timeout=240)
            if proc.returncode != 0:
                problems.append(f"kubectl delete namespace {ns}: {proc.stderr.strip()[-200:]}")
        return problems

    def leftovers_first(self) -> str:
        """Remove what killed runs of this machine left; a sentence naming it ('' when nothing)."""
        dead = sorted(self._names("namespaces", f"{HOST_LABEL}={host_label_value()}"))
        pcs = [pc["metadata"]["name"] for pc in self._json("priorityclasses")
               if (pc.get("description") or "").startswith(PRIORITY_CLASS_MARK)]
        if not dead and not pcs:
            return ""
        objs = self._kueue_objects_of(set(dead), only_new=False) + [("priorityclasses", n) for n in pcs]
        # the namespaces first (their LocalQueues go with them), then what only they used
        problems = self.delete([], dead) + self.delete(objs, [])
        named = [f"namespace {n}" for n in dead] + [f"{k.split('.')[0]} {n}" for k, n in objs]
        tail = f" ({'; '.join(problems)})" if problems else ""
        return f"removed what an earlier run on this machine left (killed before its clean-up): {', '.join(named)}{tail}"

    def cluster_objects(self, namespaces: list[str], priority_classes: list[str] = ()) -> list[tuple[str, str]]:
        """The cluster-scoped objects this run made (ask before its namespaces go: their LocalQueues say which)."""
        objs = self._kueue_objects_of(set(namespaces), only_new=True)
        new_pcs = self._names("priorityclasses") - self.before.get("priorityclasses", set())
        return objs + [("priorityclasses", n) for n in sorted(new_pcs & set(priority_classes))]

    def left(self) -> list[str]:
        """Everything of this run still on the cluster, as kind/name (empty: nothing)."""
        out = [f"namespace/{n}" for n in sorted(self._names("namespaces", f"{RUN_LABEL}={self.run_id}"))]
        for kind in (*KUEUE_KINDS, "priorityclasses"):
            if kind not in self.before:  # no snapshot (the run stopped before its preflight): it made none
                continue
            now = self._names(kind, KUEUE_OWNER if kind != "priorityclasses" else "")
            out += [f"{kind.split('.')[0]}/{n}" for n in sorted(now - self.before.get(kind, set()))]
        return out
