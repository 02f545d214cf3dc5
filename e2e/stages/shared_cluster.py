"""A shared cluster for real: values/shared-cluster.yaml in a namespace enforcing the restricted Pod Security
Standard, `gemma3-ray kueue setup --apply`, two releases in one queue with quota for one job, a second team."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.support.errors import StageError
from e2e.support.harness import ROOT, Harness, Run
from e2e.support.kube import ended
from e2e.support.session import run_name

TEAM_A, TEAM_B = run_name("g3r-team-a"), run_name("g3r-team-b")  # unique per run (e2e/support/session.py)
SHARED = ROOT / "values" / "shared-cluster.yaml"
# The PriorityClasses values/shared-cluster.yaml names (the cluster admin's), and its WorkloadPriorityClass: made
# by the run under names of its own (never a cluster's ml-training or batch-high), never preempting.
PRIORITY_CLASSES = {run_name("ml-training-head"): 1000, run_name("ml-training"): 900}
WORKLOAD_PRIORITY = run_name("batch-high")
# What values/shared-cluster.yaml names that a one-node CPU cluster has not: GKE flex-start nodes and a
# Google service account; and the run's own names for its priority classes. Everything else applies as written.
LOCAL_OVERLAY = {"capacity": {"type": "none"}, "serviceAccount": {"gcpServiceAccount": ""},
                 "storage": {"bucket": "gemma3-ray-e2e"}, "kueue": {"priorityClass": WORKLOAD_PRIORITY},
                 "head": {"priorityClassName": run_name("ml-training-head")},
                 "workers": {"priorityClassName": run_name("ml-training")}}
CQ, WPC, PC = "clusterqueues.kueue.x-k8s.io", "workloadpriorityclasses.kueue.x-k8s.io", "priorityclasses"


def _overlay(h: Harness) -> Path:
    path = h.out_dir / "shared-cluster-local.yaml"
    path.write_text(json.dumps(LOCAL_OVERLAY, indent=2) + "\n")
    return path


def _kueue_setup(h: Harness, ns: str, values: list[Path], apply: bool = True, check: bool = True):
    """`gemma3-ray kueue setup` (the cluster-scoped objects it made are labelled with the run's id by `claim_kueue`,
    and deleted at the end of the run by e2e.support.session)."""
    argv = ["gemma3-ray", "kueue", "setup", "-n", ns, "--jobs", "1"]
    for v in values:
        argv += ["-f", str(v)]
    return h.kube.run(argv + (["--apply"] if apply else []), what=f"gemma3-ray kueue setup -n {ns}", timeout=180,
                      check=check)


def _cluster_queue(h: Harness, ns: str) -> tuple[str, dict[str, Any]]:
    """The ClusterQueue the namespace's LocalQueue points at; a missing one is an error, never an empty spec."""
    lq = h.kube.items("localqueues", ns)
    if not lq:
        raise StageError(f"kueue setup made no LocalQueue in {ns}")
    name = lq[0]["spec"]["clusterQueue"]
    cq = h.kube.get("clusterqueue", name, "default")
    if cq is None:
        raise StageError(f"{ns}'s LocalQueue {lq[0]['metadata']['name']} points at ClusterQueue {name}, which does not "
                         "exist")
    return name, cq.get("spec") or {}


def kueue_objects(cq_name: str, cq: dict[str, Any], h: Harness) -> list[tuple[str, str]]:
    """The cluster-scoped objects `kueue setup` made for one ClusterQueue: it, its flavors, its admission checks and
    their ProvisioningRequestConfigs, as (kind, name)."""
    out = [(CQ, cq_name)]
    out += [("resourceflavors.kueue.x-k8s.io", f["name"]) for rg in cq.get("resourceGroups") or []
            for f in rg.get("flavors") or []]
    checks = [a if isinstance(a, str) else a.get("name") for a in cq.get("admissionChecks") or []]
    checks += [a.get("name") for a in (cq.get("admissionChecksStrategy") or {}).get("admissionChecks") or []]
    for name in filter(None, checks):
        out.append(("admissionchecks.kueue.x-k8s.io", name))
        params = ((h.kube.get("admissioncheck", name, "default") or {}).get("spec") or {}).get("parameters") or {}
        if params.get("kind") == "ProvisioningRequestConfig":
            out.append(("provisioningrequestconfigs.kueue.x-k8s.io", params["name"]))
    return out


def claim_kueue(h: Harness, ns: str, priority: str = "") -> tuple[str, dict[str, Any]]:
    """After `kueue setup -n ns`: its ClusterQueue (missing: an error) and the objects it uses, proved new since the
    run began (one that existed before, as a cluster's own batch-high, is refused) and labelled with the run's id."""
    name, cq = _cluster_queue(h, ns)
    objs = kueue_objects(name, cq, h) + ([(WPC, priority)] if priority else [])
    if priority and h.kube.get("workloadpriorityclass", priority, "default") is None:
        raise StageError(f"kueue setup did not create the WorkloadPriorityClass {priority} the values name")
    h.session.claim(objs)
    return name, cq


def quota_problem(cq: dict[str, Any], rayjob: dict[str, Any], jobs: int = 1) -> str:
    """'' when the ClusterQueue's flavors hold, in all, exactly the quota for `jobs` of this RayJob (every pod set's
    requests, as Kueue counts them; kueue setup splits them by pod set: the workers' to the GPU flavor, the head's
    and the submitter's to the CPU flavor), else what differs."""
    from gemma3_ray.kueue import objects as ko

    want = {r: v * jobs for r, v in ko.add(*(s.total() for s in ko.pod_sets(rayjob))).items()}
    flavors = [f for rg in cq.get("resourceGroups") or [] for f in rg.get("flavors") or []]
    if not flavors:
        return "no resourceGroups: no quota"
    got = ko.add(*({r["name"]: ko.quantity(r["nominalQuota"]) for r in f.get("resources") or []} for f in flavors))
    got, want = ({k: v for k, v in d.items() if v} for d in (got, want))  # a quota of 0 is none
    if got != want:
        each = "; ".join(f"{f['name']}: " + ko.describe({r["name"]: ko.quantity(r["nominalQuota"])
                                                         for r in f.get("resources") or []}) for f in flavors)
        return f"flavors {each}: {ko.describe(got)} in all, want {ko.describe(want)}"
    return ""


def _rendered_job(h: Harness, values: list[Path]) -> dict[str, Any]:
    import yaml

    args = ["template", "quota", str(ROOT / "charts" / "gemma3-ray")] + [a for v in values for a in ("-f", str(v))]
    for doc in yaml.safe_load_all(h.kube.h(*args, timeout=120, what="helm template (the job kueue setup sizes)").stdout):
        if doc and doc.get("kind") == "RayJob":
            return doc
    raise StageError("helm template with the shared-cluster values rendered no RayJob")


def priority_classes(h: Harness) -> list[str]:
    """The run's PriorityClasses (PRIORITY_CLASSES): created with its id, preemptionPolicy Never (its pods never
    evict another's); one that exists already is not the run's: refused."""
    made = []
    for name, value in PRIORITY_CLASSES.items():
        body = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "value": value,
                "preemptionPolicy": "Never", "description": "e2e: named by shared-cluster.yaml (run's own name)",
                "metadata": {"name": name, "labels": dict(h.session.labels)}}
        proc = h.kube.k("create", "-f", "-", input_text=json.dumps(body), check=False, timeout=60)
        if proc.returncode != 0:
            raise StageError(f"PriorityClass {name}: {proc.stderr.strip()[-300:]}"
                             + (" (not this run's: left as it is)" if "AlreadyExists" in proc.stderr else ""))
        made.append(name)
    return made


def _a_cluster_pods(h: Harness, run: Run) -> list[dict[str, Any]]:
    """The pods of A's cluster once its head and every worker exist (they exist from admission to the ttl after the
    job: no RUNNING state has to be caught by a poll)."""
    want = 1 + int(run.flags["num_workers"])

    def pods() -> list[dict[str, Any]]:
        job = h.kube.get("rayjob", run.rayjob, run.namespace) or {}
        cluster = (job.get("status") or {}).get("rayClusterName", "")
        found = h.kube.items("pods", run.namespace, f"ray.io/cluster={cluster}") if cluster else []
        return found if len(found) >= want else []
    return h.kube.wait_for(f"{run.rayjob}: head and {want - 1} worker pods", pods, 300, run.namespace)


def _restricted_pods(h: Harness, run: Run) -> str:
    """Every container of the run's cluster runs read-only, non-root, without privilege escalation, as admitted
    by a namespace enforcing `restricted` (the API server's own admission)."""
    pods = _a_cluster_pods(h, run)
    bad = []
    for p in pods:
        pod_sc = p["spec"].get("securityContext") or {}
        for c in p["spec"]["containers"]:
            sc = c.get("securityContext") or {}
            if not (sc.get("readOnlyRootFilesystem") and sc.get("allowPrivilegeEscalation") is False
                    and (sc.get("runAsNonRoot") or pod_sc.get("runAsNonRoot"))):
                bad.append(f"{p['metadata']['name']}/{c['name']}")
    if bad:
        raise StageError(f"restricted: containers {bad} lack readOnlyRootFilesystem, allowPrivilegeEscalation=false "
                         "or runAsNonRoot")
    return f"{len(pods)} pods of {run.rayjob}'s cluster: read-only root, non-root, no privilege escalation"


def _values(h: Harness) -> list[Path]:
    return [SHARED, _overlay(h)]


def kueue_setup(h: Harness) -> str:
    """`gemma3-ray kueue setup --apply` for team A: ClusterQueue (quota for one job), LocalQueue, priority class."""
    pcs = priority_classes(h)
    h.namespace(TEAM_A, {"pod-security.kubernetes.io/enforce": "restricted",
                         "pod-security.kubernetes.io/enforce-version": "latest"})
    _kueue_setup(h, TEAM_A, _values(h))
    cq_name, cq = claim_kueue(h, TEAM_A, WORKLOAD_PRIORITY)
    problem = quota_problem(cq, _rendered_job(h, _values(h)))
    if problem:
        raise StageError(f"ClusterQueue {cq_name}: not the quota of the one job asked for (--jobs 1): {problem}")
    h.shared["cq_a"], h.shared["cq_a_spec"] = cq_name, cq
    return (f"ClusterQueue {cq_name} (quota for one job), LocalQueue in {TEAM_A}, WorkloadPriorityClass "
            f"{WORKLOAD_PRIORITY}, PriorityClasses {', '.join(pcs)} (preemptionPolicy Never): all new, the run's")


def a_admitted(h: Harness) -> str:
    run = h.helm_install("a", TEAM_A, values=_values(h))
    h.runs["a"] = run
    _a_cluster_pods(h, run)
    return f"{run.rayjob} admitted by Kueue: its head and worker pods exist"


def restricted_pods(h: Harness) -> str:
    return _restricted_pods(h, h.runs["a"])


def b_waits(h: Harness) -> str:
    a = h.runs["a"]
    a_job = h.kube.get("rayjob", a.rayjob, TEAM_A) or {}
    if ended(a_job.get("status")):
        raise StageError(f"{a.rayjob} already ended: B cannot be shown waiting for A's quota")
    run_b = h.helm_install("b", TEAM_A, values=_values(h))
    h.runs["b"] = run_b
    h.kube.wait_for("release B's Workload pending on quota", lambda: _pending_reason(h, run_b), 60, TEAM_A)
    status = h.kube.run(["gemma3-ray", "status", "-n", TEAM_A, "--release", "b", "--project", "gemma3-ray-e2e",
                         "--region", "us-central1"], what="gemma3-ray status", timeout=120).stdout
    reason = _pending_reason(h, run_b)
    if not reason or reason[:40] not in status:
        raise StageError(f"gemma3-ray status for B does not show Kueue's reason {reason!r}:\n{status[-600:]}")
    return f"B suspended by Kueue: {reason[:120]}"


def a_succeeded(h: Harness) -> str:
    run_a = h.runs["a"]
    h.wait_run(run_a)
    return f"{run_a.rayjob} SUCCEEDED"


def b_after_a(h: Harness) -> str:
    run_b = h.runs["b"]
    h.wait_run(run_b)
    workers = _run_workers(h, run_b)
    return f"{run_b.rayjob} SUCCEEDED on {workers} workers"


def second_team(h: Harness) -> str:
    """`kueue setup` for another namespace exits 0, makes that team its own ClusterQueue, leaves A's as it was."""
    h.namespace(TEAM_B)
    proc = _kueue_setup(h, TEAM_B, _values(h), check=False)
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        raise StageError(f"gemma3-ray kueue setup -n {TEAM_B} exited {proc.returncode}:\n{said[-600:]}")
    cq_a, before = h.shared["cq_a"], h.shared["cq_a_spec"]
    cq_b, _ = _cluster_queue(h, TEAM_B)
    if cq_b == cq_a:
        raise StageError(f"{TEAM_B}'s LocalQueue points at {TEAM_A}'s ClusterQueue {cq_a}, not one of its own")
    claim_kueue(h, TEAM_B, WORKLOAD_PRIORITY)
    _, after = _cluster_queue(h, TEAM_A)
    if after != before:
        raise StageError(f"kueue setup for {TEAM_B} changed {TEAM_A}'s ClusterQueue {cq_a}:\n"
                         f"before {json.dumps(before)[:300]}\nafter  {json.dumps(after)[:300]}")
    return f"{TEAM_B} got its own ClusterQueue {cq_b} (exit 0); {cq_a} of {TEAM_A} unchanged"


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
