"""One `make e2e` at a time per machine, names unique per run, and what a run provably made is all it removes.

- The lock (`$GEMMA3_RAY_CACHE/e2e.lock`, flock) is taken before anything is written: a second
  concurrent run is refused with the first's pid, before it touches the first's log, storage or names.
- The run id (E2E_RUN_ID, else random) is in every name the run makes; every object it makes carries the
  label RUN_LABEL=<id> (namespaces at creation; the Kueue objects and PriorityClasses once made, after
  proving they did not exist before the run: `claim`).
- The run's Lease (e2e/support/lease.py) says the run is alive; it is created before anything else.
- Leftovers first: a run whose Lease has expired has ended; what carries its id goes (its namespaces, then
  its labelled cluster-scoped objects), its node changes are put back, then its Lease; a sentence names it.
  A live run's objects, and everything carrying no run's id, are never touched.
- At the end, the cluster-scoped objects carrying the run's id go too (never one that existed when the run
  began). `left()` lists what is still there (the summary's "left"); `close()` puts the nodes back, stops
  the renewal and deletes the Lease when nothing is left (else it expires and the next run removes the rest).
"""

from __future__ import annotations

import fcntl
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from e2e.support import nodes
from e2e.support.errors import StageError
from e2e.support.kube import Kube
from e2e.support.lease import RUN_LABEL, Lease, all_leases, expired, node_record, run_of

# one id per process: the stage modules name their namespaces with it at import (run_name)
RUN_ID = os.environ.get("E2E_RUN_ID") or secrets.token_hex(3)
# cluster-scoped kinds `gemma3-ray kueue setup` makes (plugin/gemma3_ray/kueue/objects.py)
KUEUE_KINDS = ("clusterqueues.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io",
               "workloadpriorityclasses.kueue.x-k8s.io", "admissionchecks.kueue.x-k8s.io",
               "provisioningrequestconfigs.kueue.x-k8s.io")
# the cluster-scoped kinds a run makes, in deletion order; nodes: the `fleet` group's simulated nodes (kwok)
CLUSTER_KINDS = (*KUEUE_KINDS, "priorityclasses", "nodes")
__all__ = ["RUN_LABEL", "Session"]


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
    """base-<run id>: a name unique to this run."""
    return f"{base}-{run_id or RUN_ID}"


def _short(kind: str) -> str:
    return kind.split(".")[0]


@dataclass
class Session:
    kube: Kube
    run_id: str = RUN_ID
    before: dict[str, set[str]] = field(default_factory=dict)
    lease: Lease | None = None

    @property
    def labels(self) -> dict[str, str]:
        return {RUN_LABEL: self.run_id}

    def name(self, base: str) -> str:
        """A name unique to this run."""
        return run_name(base, self.run_id)

    def start(self) -> None:
        """The run's Lease, created and renewed from now on (before the run makes anything)."""
        self.lease = Lease(self.kube, self.run_id)
        self.lease.start()

    # ------------------------------------------------------------------ what exists
    def _served(self, kind: str) -> bool:
        """Whether the cluster serves a kind now (asked each time: Kueue's CRDs may come during the run). A kind of
        a group it does not serve cannot have objects; a discovery that fails is an error, never "not served"."""
        if "." not in kind:
            return True
        group = kind.split(".", 1)[1]
        names = self.kube.k("api-resources", f"--api-group={group}", "-o", "name", timeout=60).stdout.split()
        return kind in names

    def _names(self, kind: str, selector: str = "") -> set[str]:
        """Names of a kind (a failed listing is an error: never read as "none"; a kind the cluster does not serve
        has none)."""
        if not self._served(kind):
            return set()
        return {o["metadata"]["name"] for o in self.kube.items(kind, None, selector)}

    def snapshot(self) -> None:
        """The cluster-scoped objects that exist as the run begins (never modified or deleted by it)."""
        for kind in CLUSTER_KINDS:
            self.before[kind] = self._names(kind)

    def claim(self, objs: list[tuple[str, str]]) -> None:
        """Label objects the run just made (kueue setup) with its id, after proving each is new since the run
        began; one that existed before is another's: refused, nothing labelled."""
        old = [f"{_short(k)} {n}" for k, n in objs if n in self.before.get(k, set())]
        if old:
            raise StageError(f"{', '.join(old)} existed before this run began: not this run's, so it proves nothing "
                             "and is left as it is")
        for kind, name in objs:
            self.kube.k("label", "--overwrite", kind, name, f"{RUN_LABEL}={self.run_id}", timeout=60)

    # ------------------------------------------------------------------ clean-up
    def owned(self, run_id: str) -> list[tuple[str, str]]:
        """The cluster-scoped objects carrying run_id, in deletion order (never one there before this run)."""
        sel = f"{RUN_LABEL}={run_id}"
        return [(kind, n) for kind in CLUSTER_KINDS for n in sorted(self._names(kind, sel))
                if n not in self.before.get(kind, set())]

    def delete(self, objs: list[tuple[str, str]], namespaces: list[str], wait: bool = True) -> list[str]:
        problems = []
        for kind, name in objs:
            proc = self.kube.k("delete", kind, name, "--ignore-not-found", "--wait=false", check=False, timeout=120)
            if proc.returncode != 0:
                problems.append(f"kubectl delete {kind} {name}: {proc.stderr.strip()[-200:]}")
        for ns in namespaces:
            proc = self.kube.k("delete", "namespace", ns, "--ignore-not-found", f"--wait={str(wait).lower()}",
                               "--timeout=180s", check=False, timeout=240)
            if proc.returncode != 0:
                problems.append(f"kubectl delete namespace {ns}: {proc.stderr.strip()[-200:]}")
        return problems

    def leftovers_first(self) -> str:
        """Remove what runs whose Lease expired left (their namespaces, cluster-scoped objects carrying their id,
        their node changes undone, then the Lease); a sentence naming it ('' when nothing). Another run's live
        Lease: its objects are not touched."""
        said = []
        for lease in all_leases(self.kube):
            run = run_of(lease)
            if not run or run == self.run_id or not expired(lease):
                continue
            namespaces = sorted(self._names("namespaces", f"{RUN_LABEL}={run}"))
            objs = self.owned(run)
            problems = [p for node, before in sorted(node_record(lease).items())
                        for p in nodes.restore_node(self.kube, node, before)]
            # the namespaces first (their LocalQueues go with them; deletion finishes without this run), then
            # the cluster-scoped objects; the Lease last, and only when everything it stands for went
            problems += self.delete([], namespaces, wait=False) + self.delete(objs, [])
            if not problems:
                problems += [p for p in [self._delete_lease(lease)] if p]
            named = ([f"namespace {n}" for n in namespaces] + [f"{_short(k)} {n}" for k, n in objs]
                     + [f"node {n} put back" for n in sorted(node_record(lease))])
            tail = f" ({'; '.join(problems)})" if problems else ""
            said.append(f"run {run} (Lease expired, holder {lease['spec'].get('holderIdentity', '?')}): "
                        f"{', '.join(named) or 'nothing left'}{tail}")
        return f"removed what ended runs left: {'; '.join(said)}" if said else ""

    def _delete_lease(self, lease: dict) -> str:
        meta = lease["metadata"]
        proc = self.kube.k("-n", meta["namespace"], "delete", "lease", meta["name"], "--ignore-not-found",
                           check=False, timeout=60)
        return "" if proc.returncode == 0 else f"kubectl delete lease {meta['name']}: {proc.stderr.strip()[-200:]}"

    def cluster_objects(self) -> list[tuple[str, str]]:
        """The cluster-scoped objects this run made: those carrying its id, new since it began."""
        return self.owned(self.run_id)

    def left(self) -> list[str]:
        """Everything of this run still on the cluster, as kind/name (empty: nothing)."""
        sel = f"{RUN_LABEL}={self.run_id}"
        out = [f"namespace/{n}" for n in sorted(self._names("namespaces", sel))]
        return out + [f"{_short(k)}/{n}" for k, n in self.owned(self.run_id)]

    def close(self, release: bool) -> list[str]:
        """On every exit path: the nodes put back (a node that cannot be is a problem: the run fails, the Lease
        stays with the record), the renewal stopped, and (release: nothing of the run is left) the Lease deleted;
        else it expires and the next run removes what carries this run's id and puts the nodes back."""
        if self.lease is None:
            return []
        problems: list[str] = []
        try:
            problems += nodes.restore(self.kube, self.lease)
        except StageError as e:
            problems.append(f"putting the nodes back: {e}")
        self.lease.stop()
        if release and not problems:
            problems += [p for p in [self.lease.delete()] if p]
        return problems
