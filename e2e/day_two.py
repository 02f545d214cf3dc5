"""Day two on the real cluster: upgrade, rollback, uninstall, a lost worker and head, elastic, restricted pods, Kueue."""

from __future__ import annotations

from typing import Any

from e2e.first_run import NAMESPACE, RELEASE
from e2e.harness import Harness, Run
from e2e.kube import StageError

NEW_LR = "0.002"
UNINSTALL_LIMIT_S = 120


def _cluster_of(job: dict[str, Any]) -> str:
    return (job.get("status") or {}).get("rayClusterName", "")


def _pods(h: Harness, ns: str, cluster: str, node_type: str = "") -> list[dict[str, Any]]:
    sel = f"ray.io/cluster={cluster}" + (f",ray.io/node-type={node_type}" if node_type else "")
    return h.kube.items("pods", ns, sel)


def _train_steps(h: Harness, run: Run) -> list[int]:
    path = h.storage.path(f"{run.run_uri}/metrics.jsonl")
    if not path.is_file():
        return []
    import json

    return [r["step"] for r in map(json.loads, filter(str.strip, path.read_text().splitlines()))
            if r.get("kind") == "train"]


def _wait_step(h: Harness, run: Run, step: int, timeout: float = 600) -> None:
    """Until the run has logged a training record at `step` or later (a checkpoint lies behind it)."""
    def reached() -> bool:
        job = h.kube.get("rayjob", run.rayjob, run.namespace) or {}
        if (job.get("status") or {}).get("jobStatus") in {"SUCCEEDED", "FAILED", "STOPPED"}:
            raise StageError(f"RayJob {run.rayjob} ended before step {step}: too fast to interrupt mid-training")
        return any(s >= step for s in _train_steps(h, run))
    h.kube.wait_for(f"{run.rayjob}: step {step} logged", reached, timeout, run.namespace)


def _continuous(h: Harness, run: Run) -> str:
    """Every logging step from the first to max_steps is in metrics.jsonl (repeats after a restore allowed)."""
    every, last = int(run.flags.get("logging_steps", 1)), int(run.flags["max_steps"])
    steps = set(_train_steps(h, run))
    missing = [s for s in range(every, last + 1, every) if s not in steps]
    if missing:
        raise StageError(f"{run.run_uri}/metrics.jsonl: the loss record has gaps at steps {missing} (has {sorted(steps)})")
    return f"loss logged at every {every} steps up to {last}"


def _finished(h: Harness, run: Run, want_steps: int | None = None) -> dict[str, Any]:
    summary = h.summary(run)
    want = want_steps or int(run.flags["max_steps"])
    if not summary.get("completed") or summary.get("global_step") != want:
        raise StageError(f"{run.run_uri}: completed={summary.get('completed')} global_step={summary.get('global_step')}"
                         f" (want {want})")
    return summary


def upgrade(h: Harness, first: Run) -> Run:
    with h.record.stage("upgrade", f"helm upgrade --set training.learning_rate={NEW_LR}: a new RayJob") as st:
        old = h.kube.get("rayjob", first.rayjob, first.namespace)
        old_cluster = _cluster_of(old or {})
        run = h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={"training.learning_rate": NEW_LR})
        if run.rayjob == first.rayjob or run.run_name == first.run_name:
            raise StageError(f"helm upgrade kept RayJob {run.rayjob} / run {run.run_name}: a new revision must be a new run")
        h.wait_run(run)
        lr = ((_finished(h, run).get("definition") or {}).get("flags") or {}).get("learning_rate")
        if lr is None or abs(float(lr) - float(NEW_LR)) > 1e-12:
            raise StageError(f"{run.run_uri}/summary.json: definition.flags.learning_rate={lr!r}, want {NEW_LR}")
        left = [f"rayjob/{first.rayjob}"] if h.kube.get("rayjob", first.rayjob, NAMESPACE) else []
        if old_cluster:
            left += [f"raycluster/{old_cluster}"] if h.kube.get("raycluster", old_cluster, NAMESPACE) else []
            left += [f"pod/{p['metadata']['name']}" for p in _pods(h, NAMESPACE, old_cluster)]
        if left:
            raise StageError(f"after the upgrade the previous revision's objects remain: {left}")
        st.detail = f"{run.rayjob} SUCCEEDED with learning_rate {lr}; {first.rayjob}, its cluster and pods gone"
    return run


def rollback(h: Harness, first: Run) -> Run:
    with h.record.stage("rollback", "helm rollback to revision 1: the first run again, resumed") as st:
        steps_before = len(_train_steps(h, first))
        h.kube.h("rollback", RELEASE, "1", "-n", NAMESPACE, timeout=180, what="helm rollback")
        run = h.current_run(RELEASE, NAMESPACE)
        if run.rayjob != first.rayjob or run.run_name != first.run_name:
            raise StageError(f"helm rollback 1 gave RayJob {run.rayjob} run {run.run_name}; want {first.rayjob} "
                             f"run {first.run_name}")
        h.wait_run(run)
        summary = _finished(h, run)
        retrained = len(_train_steps(h, run)) - steps_before
        if retrained:
            raise StageError(f"rollback re-trained {retrained} logged steps of the finished run {run.run_name}")
        st.detail = f"{run.rayjob} SUCCEEDED: run {run.run_name} at step {summary['global_step']}, nothing re-trained"
    return run


def uninstall_reinstall_lost_worker(h: Harness, first: Run) -> Run:
    with h.record.stage("uninstall", f"nothing of the release left within {UNINSTALL_LIMIT_S} s") as st:
        took = h.uninstall(RELEASE, NAMESPACE, UNINSTALL_LIMIT_S)
        st.detail = f"RayJob, RayCluster, pods, Services, ConfigMaps, Secret, ServiceAccount gone in {took:.1f} s"
    with h.record.stage("reinstall + lost worker", "a fresh run; one worker pod deleted mid-training") as st:
        run = h.helm_install(RELEASE, NAMESPACE)
        if run.run_name == first.run_name:
            raise StageError(f"reinstall reused the run name {run.run_name}: a new install must be a fresh run")
        _wait_step(h, run, int(run.flags["save_steps"]) + int(run.flags["logging_steps"]))
        cluster = _cluster_of(h.kube.get("rayjob", run.rayjob, NAMESPACE) or {})
        victim = _pods(h, NAMESPACE, cluster, "worker")[0]["metadata"]["name"]
        h.kube.k("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
        h.wait_run(run)
        summary = _finished(h, run)
        if summary.get("resumed_from_step") in (None, 0) and not summary.get("restarts"):
            h.record.facts.setdefault("notes", []).append(
                f"lost worker: summary.json of {run.run_name} records no restore ({summary.get('resumed_from_step')!r})")
        st.detail = f"deleted {victim}; {run.rayjob} SUCCEEDED at step {summary['global_step']}; {_continuous(h, run)}"
    return run


def lost_head(h: Harness) -> Run:
    with h.record.stage("lost head", "the head pod deleted mid-training, rayJob.backoffLimit=1") as st:
        run = h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={"rayJob.backoffLimit": 1})
        _wait_step(h, run, int(run.flags["save_steps"]) + int(run.flags["logging_steps"]))
        job = h.kube.get("rayjob", run.rayjob, NAMESPACE) or {}
        cluster = _cluster_of(job)
        head = _pods(h, NAMESPACE, cluster, "head")[0]["metadata"]["name"]
        h.kube.k("-n", NAMESPACE, "delete", "pod", head, "--wait=false")
        final = h.kube.wait_rayjob(NAMESPACE, run.rayjob, 900, want="SUCCEEDED")
        status = final.get("status") or {}
        summary = _finished(h, run)
        h.record.facts["lost_head"] = {"failed_attempts": status.get("failed"), "succeeded": status.get("succeeded"),
                                       "first_cluster": cluster, "final_cluster": _cluster_of(final),
                                       "resumed_from_step": summary.get("resumed_from_step")}
        st.detail = (f"deleted {head}: KubeRay failed the attempt and retried on cluster {_cluster_of(final)} "
                     f"(failed={status.get('failed')}), which resumed {run.run_name} to step {summary['global_step']}")
    return run


def elastic(h: Harness) -> Run:
    with h.record.stage("elastic", "min_workers=1; node cordoned, a worker pod deleted: its replacement stays Pending") as st:
        run = h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={"rayJob.backoffLimit": 0,
                                                                     "training.min_workers": 1})
        _wait_step(h, run, int(run.flags["save_steps"]) + int(run.flags["logging_steps"]))
        cluster = _cluster_of(h.kube.get("rayjob", run.rayjob, NAMESPACE) or {})
        node = h.kube.items("nodes", None)[0]["metadata"]["name"]
        h.kube.k("cordon", node)
        try:
            victim = _pods(h, NAMESPACE, cluster, "worker")[0]["metadata"]["name"]
            h.kube.k("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")

            def replacement_pending() -> bool:
                return any(p["status"].get("phase") == "Pending" for p in _pods(h, NAMESPACE, cluster, "worker"))
            h.kube.wait_for("the deleted worker's replacement Pending on the cordoned node", replacement_pending, 120,
                            NAMESPACE)
            h.wait_run(run)
            summary = _finished(h, run)
        finally:
            h.kube.k("uncordon", node, check=False)
        if summary.get("num_workers", 0) >= int(run.flags["num_workers"]):
            raise StageError(f"{run.run_uri}: finished on {summary.get('num_workers')} workers; the worker whose "
                             f"replacement stayed Pending should have left fewer than {run.flags['num_workers']}")
        if summary.get("global_batch_size") != int(run.flags["global_batch_size"]):
            raise StageError(f"{run.run_uri}: global_batch_size {summary.get('global_batch_size')} after losing a "
                             f"worker, want {run.flags['global_batch_size']}")
        st.detail = (f"{run.rayjob} SUCCEEDED on {summary['num_workers']} of {run.flags['num_workers']} workers at step {summary['global_step']}, global batch "
                     f"{summary['global_batch_size']}; {_continuous(h, run)}")
    return run


def day_two(h: Harness, skip: set[str] = frozenset()) -> None:
    """The stages in order; `skip` leaves out some of the first three (a shorter loop while developing)."""
    first = h.current_run(RELEASE, NAMESPACE)
    if "upgrade" not in skip:
        upgrade(h, first)
    if "rollback" not in skip:
        rollback(h, first)
    if "uninstall" not in skip:
        uninstall_reinstall_lost_worker(h, first)
    lost_head(h)
    elastic(h)
    from e2e.shared_cluster import shared_cluster

    shared_cluster(h)
