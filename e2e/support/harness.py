"""What every e2e stage shares: the cluster, the images, the storage server, and helm install of the chart."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.support.deadline import DEADLINE, OutOfTime
from e2e.support.errors import StageError
from e2e.support.kube import Kube, manifest_refs
from e2e.support.proc import run_child
from e2e.support.record import Record
from e2e.support.storage.run_storage import RunStorage
from localkit.chart_job import parse_flags

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(os.environ.get("E2E_OUTPUT") or ROOT / "e2e-output")  # summary.json, logs
CHART = ROOT / "charts" / "gemma3-ray"
VALUES = ROOT / "values" / "e2e.yaml"
# under the storage's root (RunStorage.uri): the emulator's bucket, or the run's prefix of E2E_BUCKET
MODEL_KEY = "inputs/tiny-gemma3"
DATA_KEY = "inputs/sample-data"
RUN_TIMEOUT_S = 900
CLEANUP_GONE_S = 300  # after `helm uninstall --wait` gave up on an object still Terminating
# what a release leaves besides its manifest's objects, found by its instance label (KubeRay's RayCluster and pods)
RELEASE_KINDS = ["rayjobs", "rayclusters", "pods", "services", "configmaps", "secrets", "serviceaccounts", "jobs"]


def parse_ref(ref: str) -> tuple[str, str, str, str]:
    """An image reference as (registry, repository, tag, digest): `[host[:port]/]path[:tag][@sha256:...]`.

    The first path part is a registry when it has a '.' or a ':' (a port) or is `localhost`, as Docker reads it.
    """
    name, _, digest = ref.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest, tag, digest
    return "", name, tag, digest


@dataclass
class Images:
    """Images given as references (the local cluster's imports, or E2E_HEAD_IMAGE/E2E_WORKER_IMAGE); None: the
    values files name them."""

    head: str | None = None  # Ray only: the head, the submitter, the helm test pod
    worker: str | None = None  # the training image of images/trainer/Dockerfile
    pull_policy: str | None = None  # Never for images imported into the node, else the values' own

    def sets(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for group, ref in (("head", self.head), ("workers", self.worker)):
            if not ref:
                continue
            registry, repo, tag, digest = parse_ref(ref)
            if registry:
                out[f"{group}.image.registry"] = registry
            out[f"{group}.image.repository"] = repo
            if tag:
                out[f"{group}.image.tag"] = tag
            if digest:
                out[f"{group}.image.digest"] = digest
        if self.pull_policy:
            out["image.pullPolicy"] = self.pull_policy
        return out


@dataclass
class Run:
    """One RayJob of a release: its name and the run it trains (from the entry point the chart rendered)."""

    namespace: str
    release: str
    rayjob: str
    run_name: str
    storage_path: str
    flags: dict[str, str]

    @property
    def run_uri(self) -> str:
        return f"{self.storage_path}/runs/{self.run_name}"


def set_args(sets: dict[str, str | int | float | bool]) -> list[str]:
    """Helm flags for values by their Python type: booleans as YAML's true/false and numbers as numbers (--set),
    text verbatim (--set-string, so "0.10" or a label "true" stays text). Seen: "true" as text for a boolean
    field failed `helm install` on the chart's schema ('/training/streaming': got string, want boolean)."""
    args: list[str] = []
    for k, v in sets.items():
        if isinstance(v, bool):
            args += ["--set", f"{k}={'true' if v else 'false'}"]
        elif isinstance(v, (int, float)):
            args += ["--set", f"{k}={v!r}"]
        else:
            args += ["--set-string", f"{k}={v}"]
    return args


@dataclass
class Setup:
    """What the runner read from the environment and the setup stages hand each other."""

    stack: list = field(default_factory=list)  # what the clean-up undoes: ("cluster", dir), ("storage", RunStorage)
    storage_image: str = ""  # the emulator's image: E2E_STORAGE_IMAGE, or the one built here
    bucket: Any = None  # E2E_BUCKET's BucketStorage, checked before anything is made in the cluster


@dataclass
class Harness:
    kube: Kube  # None until the setup stage "cluster start" knows the cluster
    record: Record
    storage: RunStorage  # the emulator in the cluster, or the run's prefix of E2E_BUCKET
    images: Images
    out_dir: Path
    installed: list[tuple[str, str]] = field(default_factory=list)  # (namespace, release), for cleanup
    namespaces: list[str] = field(default_factory=list)
    extra_values: list[Path] = field(default_factory=list)  # E2E_VALUES: after values/e2e.yaml, before a stage's
    session: Any = None  # e2e.support.session.Session: run id, labels, cluster-scoped clean-up
    cluster: Any = None  # e2e.support.preflight.ClusterFacts: what the cluster has (KubeRay, Kueue, a worker node)
    runs: dict[str, Run] = field(default_factory=dict)  # what one stage hands the next: "first", "upgraded", …
    notes: dict[str, str] = field(default_factory=dict)  # release -> its NOTES as helm printed them
    # what the cluster lacks, for stage_table's `requires` (a preflight fills it): "kueue" -> why not
    missing: dict[str, str] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)  # other facts one stage hands the next
    setup: Setup = field(default_factory=Setup)

    # ------------------------------------------------------------------ namespaces and releases
    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """A namespace of the run, created with the run's labels; one that exists is refused, never adopted (the
        run would delete it at its end). One this run made already is returned as it is."""
        if name in self.namespaces:
            return name
        if self.session is not None:  # the run's id: what a later run proves is this run's
            labels = {**self.session.labels, **(labels or {})}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        proc = self.kube.k("create", "-f", "-", input_text=json.dumps(body), check=False, timeout=60)
        if proc.returncode != 0:
            if "AlreadyExists" in proc.stderr:
                raise StageError(f"namespace {name} exists already: the run makes its own namespaces and never "
                                 "takes one it did not make; delete it, or run with another E2E_RUN_ID")
            raise StageError(f"namespace {name}: kubectl create exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        self.namespaces.append(name)
        # the node's ServiceAccount admission needs the namespace's default ServiceAccount first
        self.kube.wait_for(f"namespace {name}: default ServiceAccount",
                           lambda: self.kube.get("serviceaccount", "default", name), 60, name)
        return name

    def base_sets(self, release: str = "") -> dict[str, str]:
        """The images, the inputs' gs:// paths and how the pods reach the storage (the emulator: its
        STORAGE_EMULATOR_HOST; E2E_BUCKET: nothing, and the release's outputs under the run's prefix)."""
        return {**self.images.sets(),
                **{f"rayJob.runtimeEnv.envVars.{k}": v for k, v in self.storage.pod_env().items()},
                **self.storage.chart_sets(release),
                "training.model_id": self.storage.uri(MODEL_KEY), "training.dataset_name": self.storage.uri(DATA_KEY)}

    def values_files(self) -> list[Path]:
        """values/e2e.yaml, then E2E_VALUES (the cluster's images, pull policy, anything else it needs)."""
        return [VALUES, *self.extra_values]

    def helm_install(self, release: str, ns: str, *, sets: dict[str, str | int | float | bool] | None = None,
                     values: list[Path] | None = None, upgrade: bool = False, extra: list[str] | None = None,
                     chart: str = "") -> Run:
        """helm install (or upgrade) the chart (the directory, or ``chart``: an oci:// reference) with
        values/e2e.yaml; the revision's RayJob and run."""
        args = ["upgrade" if upgrade else "install", release, chart or str(CHART), "-n", ns]
        for v in [*self.values_files(), *(values or [])]:
            args += ["-f", str(v)]
        args += set_args({**self.base_sets(release), **(sets or {})})
        args += extra or []
        self.kube.h(*args, timeout=180, what=f"helm {args[0]} {release}")
        if (ns, release) not in self.installed:
            self.installed.append((ns, release))
        return self.current_run(release, ns)

    def current_run(self, release: str, ns: str) -> Run:
        """The RayJob of the release's deployed revision (from helm's own manifest) and its run."""
        manifest = self.kube.h("get", "manifest", release, "-n", ns, timeout=60).stdout
        import yaml

        for doc in yaml.safe_load_all(manifest):
            if doc and doc.get("kind") == "RayJob":
                flags = parse_flags(doc["spec"]["entrypoint"])
                return Run(ns, release, doc["metadata"]["name"], flags["run_name"], flags["storage_path"], flags)
        raise StageError(f"release {ns}/{release}: its manifest has no RayJob")

    def wait_run(self, run: Run, *, timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
        try:
            return self.kube.wait_rayjob(run.namespace, run.rayjob, timeout)
        except OutOfTime:
            raise
        except StageError as e:
            why = self.storage.health()  # a failed run may be the storage's failure: say so first
            if why:
                raise StageError(f"{why}.\n{e}") from e
            raise

    def summary(self, run: Run) -> dict[str, Any]:
        path = self.storage.path(f"{run.run_uri}/summary.json")
        if not path.is_file():
            raise StageError(f"{run.run_uri}/summary.json is not in the bucket (have: {self.listing(run)})")
        return json.loads(path.read_text())

    def metrics(self, run: Run) -> list[dict[str, Any]]:
        path = self.storage.path(f"{run.run_uri}/metrics.jsonl")
        if not path.is_file():
            raise StageError(f"{run.run_uri}/metrics.jsonl is not in the bucket")
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def listing(self, run: Run) -> list[str]:
        root = self.storage.path(run.run_uri)
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())[:40] if root.is_dir() else []

    def uninstall(self, release: str, ns: str, timeout: float = 120) -> float:
        """helm uninstall, then wait until nothing of the release is left; the seconds it took."""
        t0 = time.monotonic()
        named = self.release_objects(release, ns)
        self.kube.h("uninstall", release, "-n", ns, "--wait", "--timeout", f"{int(timeout)}s", timeout=timeout + 30,
                    what=f"helm uninstall {release}")
        if (ns, release) in self.installed:
            self.installed.remove((ns, release))
        self.wait_release_gone(release, ns, named, max(1.0, timeout - (time.monotonic() - t0)))
        return time.monotonic() - t0

    def release_objects(self, release: str, ns: str) -> list[str]:
        """Every object the release's manifest names (`helm get manifest`, read before an uninstall)."""
        return manifest_refs(self.kube.h("get", "manifest", release, "-n", ns, timeout=60,
                                         what=f"helm get manifest {release}").stdout)

    def wait_release_gone(self, release: str, ns: str, named: list[str], timeout: float) -> list[str]:
        """Until every object the manifest named and every object labelled as the release's (what KubeRay made:
        its RayCluster, pods, Services, the submitter Job) is gone; a listing refused is a failure."""
        sel = f"app.kubernetes.io/instance={release}"

        def nothing_left() -> bool:
            return not (self.kube.present(ns, named) + self.kube.gone(ns, sel, RELEASE_KINDS))

        self.kube.wait_for(f"uninstall {release}: every object of the release gone", nothing_left, timeout, ns)
        return named

    def _still_going(self, release: str, ns: str, said: str) -> list[str]:
        """helm uninstall gave up waiting on an object still Terminating (a RayJob whose finalizer KubeRay has not
        lifted yet): wait for the release's objects to go, CLEANUP_GONE_S more; a problem only if any is left then
        (or helm failed otherwise). Seen 2026-12-04: RayJob a-… Terminating after 120 s, gone with its namespace."""
        if "Terminating" not in said:
            return [f"helm uninstall {release} -n {ns}: {said[-200:]}"]
        try:  # the manifest went with the release record: what is labelled as the release's is what is left
            self.wait_release_gone(release, ns, [], CLEANUP_GONE_S)
        except StageError as e:
            return [f"helm uninstall {release} -n {ns}: {said[-200:]}; still there {CLEANUP_GONE_S} s later: "
                    f"{str(e).splitlines()[0][:200]}"]
        return []

    def cleanup(self) -> list[str]:
        """Uninstall what is left and delete the namespaces this run made; problems as sentences."""
        problems: list[str] = []
        for ns, release in list(self.installed):
            proc = self.kube.h("uninstall", release, "-n", ns, "--wait", "--timeout", "120s", check=False, timeout=180)
            if proc.returncode != 0 and "not found" not in proc.stderr:
                problems += self._still_going(release, ns, proc.stderr.strip())
        for ns in self.namespaces:
            proc = self.kube.k("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout=180)
            if proc.returncode != 0 and "NotFound" not in proc.stderr:
                problems.append(f"kubectl delete namespace {ns}: {proc.stderr.strip()[-200:]}")
        return problems


def run_script(argv: list[str], log: Path, timeout: float, what: str, env: dict[str, str] | None = None) -> str:
    """A project script (e2e/cluster/cluster.sh, e2e/build/image.sh): its stdout; on failure its last lines, as a
    StageError. Its timeout is capped to E2E_DEADLINE (none during the clean-up)."""
    limit = DEADLINE.cap(timeout, what)
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(argv)}\n")
    try:  # a signal reaches the script, which finishes its clean-up (e2e/support/proc.py); its output goes to
        # the log line by line as it comes, so a timeout or ^C keeps what it said
        proc = run_child(argv, timeout=limit, cwd=ROOT, env={**os.environ, **(env or {})}, log=log)
    except subprocess.TimeoutExpired as e:
        raise (DEADLINE.expired(f"{what}: `{shlex.join(argv)}`", limit, timeout) or
               StageError(f"{what}: `{shlex.join(argv)}` did not finish in {timeout:.0f} s")) from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-10:])
        raise StageError(f"{what}: `{shlex.join(argv)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout
