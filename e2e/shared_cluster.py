"""A shared cluster for real: values/shared-cluster.yaml in a namespace enforcing the restricted Pod Security
Standard, `gemma3-ray kueue setup --apply`, two releases in one queue with quota for one job, a second team."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.harness import ROOT, Harness, Run
from e2e.kube import StageError
from e2e.session import run_name

TEAM_A, TEAM_B = run_name("g3r-team-a"), run_name("g3r-team-b")  # unique per run (e2e/session.py)
SHARED = ROOT / "values" / "shared-cluster.yaml"
# What values/shared-cluster.yaml names that a one-node CPU cluster has not: GKE flex-start nodes and a
# Google service account. Everything else of the file applies as written.
LOCAL_OVERLAY = {"capacity": {"type": "none"}, "serviceAccount": {"gcpServiceAccount": ""},
                 "storage": {"bucket": "gemma3-ray-e2e"}}
PRIORITY_CLASSES = {"ml-training-head": 1000, "ml-training": 900}  # the cluster admin's, named by the values


def _overlay(h: Harness) -> Path:
    path = h.out_dir / "shared-cluster-local.yaml"
    path.write_text(json.dumps(LOCAL_OVERLAY, indent=2) + "\n")
    return path


def _kueue_setup(h: Harness, ns: str, values: list[Path], apply: bool = True, check: bool = True):
    argv = ["gemma3-ray", "kueue", "setup", "-n", ns, "--jobs", "1"]
    for v in values:
        argv += ["-f", str(v)]
    return h.kube.run(argv + (["--apply"] if apply else []), what=f"gemma3-ray kueue setup -n {ns}", timeout=180,
                      check=check)


def _cluster_queue(h: Harness, ns: str) -> tuple[str, dict[str, Any]]:
    lq = h.kube.items("localqueues", ns)
    if not lq:
        raise StageError(f"kueue setup made no LocalQueue in {ns}")
    name = lq[0]["spec"]["clusterQueue"]
    cq = h.kube.get("clusterqueue", name, "default") or {}
    return name, cq.get("spec", {})


def _restricted_pods(h: Harness, run: Run) -> str:
    """Every pod of the run's cluster runs read-only, non-root, without privilege escalation (the kubelet's own view)."""
    job = h.kube.get("rayjob", run.rayjob, run.namespace) or {}
    cluster = (job.get("status") or {}).get("rayClusterName", "")
    pods = h.kube.items("pods", run.namespace, f"ray.io/cluster={cluster}")
    bad = [f"{p['metadata']['name']}/{c['name']}" for p in pods for c in p["spec"]["containers"]
           if not (c.get("securityContext") or {}).get("readOnlyRootFilesystem")]
    if not pods or bad:
        raise StageError(f"restricted: pods {bad or 'none found'} of {cluster} lack readOnlyRootFilesystem")
    return f"{len(pods)} pods of {cluster} running read-only root filesystems"


def shared_cluster(h: Harness) -> None:
    rec = h.record
    values = [SHARED, _overlay(h)]
    for name, value in PRIORITY_CLASSES.items():
        if h.kube.get("priorityclass", name, "default") is None:
            h.kube.k("create", "priorityclass", name, f"--value={value}", "--description=e2e: named by shared-cluster.yaml")
    with rec.stage("kueue setup", f"gemma3-ray kueue setup --apply -n {TEAM_A}: quota for exactly one job") as st:
        h.namespace(TEAM_A, {"pod-security.kubernetes.io/enforce": "restricted",
                             "pod-security.kubernetes.io/enforce-version": "latest"})
        _kueue_setup(h, TEAM_A, values)
        cq_name, cq_before = _cluster_queue(h, TEAM_A)
        wpc = "batch-high"
        if h.kube.get("workloadpriorityclass", wpc, "default") is None:
            raise StageError(f"kueue setup did not create the WorkloadPriorityClass {wpc} the values name")
        st.detail = f"ClusterQueue {cq_name}, LocalQueue in {TEAM_A}, WorkloadPriorityClass {wpc}"

    holder: dict[str, str] = {}

    def a_running(job: dict[str, Any]) -> None:
        with rec.stage("restricted pods", f"{TEAM_A} enforces restricted; values/shared-cluster.yaml's contexts") as st:
            st.detail = _restricted_pods(h, run_a)
        with rec.stage("kueue: B waits", "release B in the same queue, no quota left") as st:
            run_b = h.helm_install("b", TEAM_A, values=values)
            holder["b"] = run_b.rayjob
            h.kube.wait_for("release B's Workload pending on quota", lambda: _pending_reason(h, run_b), 60, TEAM_A)
            status = h.kube.run(["gemma3-ray", "status", "-n", TEAM_A, "--release", "b", "--project", "gemma3-ray-e2e",
                                 "--region", "us-central1"], what="gemma3-ray status", timeout=120).stdout
            reason = _pending_reason(h, run_b)
            if not reason or reason[:40] not in status:
                raise StageError(f"gemma3-ray status for B does not show Kueue's reason {reason!r}:\n{status[-600:]}")
            st.detail = f"B suspended by Kueue: {reason[:120]}"

    with rec.stage("kueue: A admitted, runs", "release A in the queue: admitted, SUCCEEDED") as st:
        run_a = h.helm_install("a", TEAM_A, values=values)
        h.wait_run(run_a, on_running=a_running)
        st.detail = f"{run_a.rayjob} SUCCEEDED"
    with rec.stage("kueue: B admitted after A", "B starts once A's quota is free, SUCCEEDED") as st:
        run_b = h.current_run("b", TEAM_A)
        h.wait_run(run_b)
        workers = _run_workers(h, run_b)
        st.detail = f"{run_b.rayjob} SUCCEEDED on {workers} workers"
    with rec.stage("kueue: second team", f"kueue setup -n {TEAM_B} leaves {TEAM_A}'s ClusterQueue as it was") as st:
        h.namespace(TEAM_B)
        proc = _kueue_setup(h, TEAM_B, values, check=False)
        _, cq_after = _cluster_queue(h, TEAM_A)
        if cq_after != cq_before:
            raise StageError(f"kueue setup for {TEAM_B} changed {TEAM_A}'s ClusterQueue {cq_name}:\n"
                             f"before {json.dumps(cq_before)[:300]}\nafter  {json.dumps(cq_after)[:300]}")
        last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        st.detail = f"{cq_name} unchanged; setup for {TEAM_B} exited {proc.returncode}: {last[0][:120]}"


def _pending_reason(h: Harness, run: Run) -> str:
    """Kueue's own message on the run's Workload while it waits for quota ('' when it does not wait)."""
    for wl in h.kube.items("workloads", run.namespace):
        owners = [o.get("name") for o in wl["metadata"].get("ownerReferences", [])]
        if run.rayjob not in owners:
            continue
        for c in (wl.get("status") or {}).get("conditions", []):
            if c.get("type") == "QuotaReserved" and c.get("status") == "False" and c.get("message"):
                return c["message"]
    return ""


def _run_workers(h: Harness, run: Run) -> int:
    summary = h.summary(run)
    want = int(run.flags["num_workers"])
    got = summary.get("num_workers")
    if got != want:
        raise StageError(f"{run.run_uri}: ran on {got} workers, want all {want} (after uncordon)")
    return got
