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

from demo.chart_job import parse_flags
from e2e.kube import Kube, StageError
from e2e.stages import Record
from e2e.storage import Storage

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "gemma3-ray"
VALUES = ROOT / "values" / "e2e.yaml"
BUCKET = "gemma3-ray-e2e"
MODEL_URI = f"gs://{BUCKET}/inputs/tiny-gemma3"
DATA_URI = f"gs://{BUCKET}/inputs/sample-data"
RUN_TIMEOUT_S = 900


@dataclass
class Images:
    head: str  # Ray only: the head, the submitter, the helm test pod
    worker: str  # the training image of images/trainer/Dockerfile

    def sets(self) -> dict[str, str]:
        h_repo, _, h_tag = self.head.rpartition(":")
        w_repo, _, w_tag = self.worker.rpartition(":")
        return {"head.image.repository": h_repo, "head.image.tag": h_tag,
                "workers.image.repository": w_repo, "workers.image.tag": w_tag}


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


@dataclass
class Harness:
    kube: Kube
    record: Record
    storage: Storage
    images: Images
    out_dir: Path
    installed: list[tuple[str, str]] = field(default_factory=list)  # (namespace, release), for cleanup
    namespaces: list[str] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict)  # what one stage hands the next: "first", "upgraded", …
    notes: dict[str, str] = field(default_factory=dict)  # release -> its NOTES as helm printed them
    # what the cluster lacks, for stage_table's `requires` (a preflight fills it): "kueue" -> why not
    missing: dict[str, str] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)  # other facts one stage hands the next
    cluster_scoped: list[tuple[str, str]] = field(default_factory=list)  # (kind, name) this run created

    # ------------------------------------------------------------------ namespaces and releases
    def namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        if self.kube.get("namespace", name, "default") is None:
            self.kube.k("create", "namespace", name, what=f"namespace {name}")
            self.namespaces.append(name)
        if labels:
            self.kube.k("label", "--overwrite", "namespace", name, *[f"{k}={v}" for k, v in labels.items()])
        # the node's ServiceAccount admission needs the namespace's default ServiceAccount first
        self.kube.wait_for(f"namespace {name}: default ServiceAccount",
                           lambda: self.kube.get("serviceaccount", "default", name), 60, name)
        return name

    def base_sets(self) -> dict[str, str]:
        return {**self.images.sets(),
                "rayJob.runtimeEnv.envVars.STORAGE_EMULATOR_HOST": self.storage.url,
                "training.model_id": MODEL_URI, "training.dataset_name": DATA_URI}

    def helm_install(self, release: str, ns: str, *, sets: dict[str, str | int] | None = None,
                     values: list[Path] | None = None, upgrade: bool = False, extra: list[str] | None = None) -> Run:
        """helm install (or upgrade) the chart with values/e2e.yaml; the revision's RayJob and run."""
        args = ["upgrade" if upgrade else "install", release, str(CHART), "-n", ns]
        for v in [VALUES, *(values or [])]:
            args += ["-f", str(v)]
        for k, v in {**self.base_sets(), **(sets or {})}.items():  # ints as numbers, the rest verbatim as text
            args += ["--set" if isinstance(v, int) else "--set-string", f"{k}={v}"]
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
        return self.kube.wait_rayjob(run.namespace, run.rayjob, timeout)

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
        self.kube.h("uninstall", release, "-n", ns, "--wait", "--timeout", f"{int(timeout)}s", timeout=timeout + 30,
                    what=f"helm uninstall {release}")
        if (ns, release) in self.installed:
            self.installed.remove((ns, release))
        kinds = ["rayjobs", "rayclusters", "pods", "services", "configmaps", "secrets", "serviceaccounts", "jobs"]
        sel = f"app.kubernetes.io/instance={release}"

        def nothing_left() -> bool:
            return not self.kube.gone(ns, sel, kinds)

        self.kube.wait_for(f"uninstall {release}: every object of the release gone", nothing_left,
                           max(1.0, timeout - (time.monotonic() - t0)), ns)
        return time.monotonic() - t0

    def cleanup(self) -> list[str]:
        """Uninstall what is left and delete the namespaces this run made; problems as sentences."""
        problems: list[str] = []
        for ns, release in list(self.installed):
            proc = self.kube.h("uninstall", release, "-n", ns, "--wait", "--timeout", "120s", check=False, timeout=180)
            if proc.returncode != 0 and "not found" not in proc.stderr:
                problems.append(f"helm uninstall {release} -n {ns}: {proc.stderr.strip()[-200:]}")
        for ns in self.namespaces:
            proc = self.kube.k("delete", "namespace", ns, "--wait=true", "--timeout=120s", check=False, timeout=180)
            if proc.returncode != 0 and "NotFound" not in proc.stderr:
                problems.append(f"kubectl delete namespace {ns}: {proc.stderr.strip()[-200:]}")
        for kind, name in reversed(self.cluster_scoped):
            proc = self.kube.k("delete", kind, name, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False,
                               timeout=90)
            if proc.returncode != 0:
                problems.append(f"kubectl delete {kind} {name}: {proc.stderr.strip()[-200:]}")
        return problems


def run_script(argv: list[str], log: Path, timeout: float, what: str, env: dict[str, str] | None = None) -> str:
    """A project script (e2e/cluster.sh, e2e/image.sh): its stdout; on failure its last lines, as a StageError."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {shlex.join(argv)}\n")
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as e:
        raise StageError(f"{what}: `{shlex.join(argv)}` did not finish in {timeout:.0f} s") from e
    with open(log, "a", encoding="utf-8") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-10:])
        raise StageError(f"{what}: `{shlex.join(argv)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout
