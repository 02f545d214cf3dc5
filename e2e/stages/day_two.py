"""Day two on the real cluster: upgrade, rollback, an upgrade rolled back at once, uninstall, a lost worker and
head, elastic. Each stage is one function of the Harness returning what it saw; e2e/runner/table.py orders them."""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from typing import Any

from e2e.stages.first_run import NAMESPACE, RELEASE, as_printed, notes_line
from e2e.support import nodes
from e2e.support.errors import StageError
from e2e.support.harness import Harness, Run
from e2e.support.kube import ended
from e2e.support.notes_check import QUICK_ROLLBACK_STAGE

UNINSTALL_LIMIT_S = 120
QUICK_LR = "0.003"  # the upgrade that the stage 'upgrade + rollback at once' rolls back
# What NOTES, the chart README and `gemma3-ray status` say to wait for before rolling back to a revision
# whose RayJob is still being deleted (Helm refuses until then: "original object RayJob … not found").
WAIT_SENTENCE = "wait until it is gone"


def _cluster_of(job: dict[str, Any]) -> str:
    return (job.get("status") or {}).get("rayClusterName", "")


def _pods(h: Harness, ns: str, cluster: str, node_type: str = "") -> list[dict[str, Any]]:
    sel = f"ray.io/cluster={cluster}" + (f",ray.io/node-type={node_type}" if node_type else "")
    return h.kube.items("pods", ns, sel)


def _train_steps(h: Harness, run: Run) -> list[int]:
    path = h.storage.path(f"{run.run_uri}/metrics.jsonl")
    if not path.is_file():
        return []
    return [r["step"] for r in map(json.loads, filter(str.strip, path.read_text().splitlines()))
            if r.get("kind") == "train"]


def _checkpoint_step(run: Run) -> int:
    """A step past the first checkpoint: interrupting there leaves a checkpoint to resume from."""
    return int(run.flags["save_steps"]) + int(run.flags["logging_steps"])


def _wait_step(h: Harness, run: Run, step: int, timeout: float = 600) -> None:
    """Until the run has logged a training record at `step` or later (a checkpoint lies behind it)."""
    def reached() -> bool:
        job = h.kube.get("rayjob", run.rayjob, run.namespace) or {}
        if ended(job.get("status")):
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


def resumed_problem(summary: dict[str, Any], max_steps: int) -> str:
    """'' when summary.json records a restore from a checkpoint mid-run (0 < resumed_from_step < max_steps)."""
    step = summary.get("resumed_from_step")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 < step < max_steps:
        return f"summary.json records resumed_from_step={step!r}: no restore from a checkpoint between 0 and {max_steps}"
    return ""


def lost_head_problem(status: dict[str, Any], first_cluster: str, final_cluster: str, summary: dict[str, Any],
                      max_steps: int) -> str:
    """'' when a lost head shows as KubeRay says it does: a failed attempt, a new cluster, the run resumed."""
    problems = []
    if not isinstance(status.get("failed"), int) or status["failed"] < 1:
        problems.append(f"status.failed={status.get('failed')!r} (want >= 1: the attempt that lost its head)")
    if not final_cluster or final_cluster == first_cluster:
        problems.append(f"the retry ran on cluster {final_cluster!r}, want a new one (the first was {first_cluster!r})")
    resumed = resumed_problem(summary, max_steps)
    if resumed:
        problems.append(resumed)
    return "; ".join(problems)


# What only training writes: a re-trained step leaves a checkpoint or the adapter written again (runs.py's folders)
TRAINED_OUTPUTS = ("checkpoints/", "final/", "merged/")


def retrained_problem(before: dict[str, str], after: dict[str, str], run_uri: str) -> str:
    """'' when nothing training writes was written again: every checkpoint and adapter object of the finished run
    has the generation it had (Cloud Storage gives each write a new one; no restart can write an old one back) and
    none is new. Objects the driver may rewrite on any start (summary.json, metrics.jsonl) are not evidence."""
    _, _, root = run_uri.partition("gs://")
    root = root.partition("/")[2].rstrip("/") + "/"

    def trained(objs: dict[str, str]) -> dict[str, str]:
        return {n: g for n, g in objs.items() if n.startswith(root) and n[len(root):].startswith(TRAINED_OUTPUTS)}

    was, now = trained(before), trained(after)
    if not was:
        return f"{run_uri}: no checkpoint or adapter objects before the rollback: nothing to compare"
    if any(not g for g in (*was.values(), *now.values())):
        return f"{run_uri}: the storage lists objects without a generation: a re-write could not be seen"
    rewritten = sorted(n[len(root):] for n in was if n in now and now[n] != was[n])
    new = sorted(n[len(root):] for n in now if n not in was)
    gone = sorted(n[len(root):] for n in was if n not in now)
    parts = ([f"written again: {', '.join(rewritten[:4])}"] if rewritten else []) + (
        [f"new: {', '.join(new[:4])}"] if new else []) + ([f"removed: {', '.join(gone[:4])}"] if gone else [])
    return f"{run_uri}: the rolled-back run trained again ({'; '.join(parts)})" if parts else ""


def _lr_of(summary: dict[str, Any]) -> Any:
    return ((summary.get("definition") or {}).get("flags") or {}).get("learning_rate")


# ---------------------------------------------------------------------------------------------- stages
def upgrade(h: Harness) -> str:
    """NOTES' `helm upgrade … --reuse-values --set training.learning_rate=…` as printed: a new RayJob and run."""
    first = h.runs["first"]
    command = notes_line(h, RELEASE, "upgrade")
    lr = re.search(r"training\.learning_rate=([0-9.eE+-]+)", command)
    if not lr:
        raise StageError(f"the NOTES upgrade line `{command}` sets no training.learning_rate")
    old_cluster = _cluster_of(h.kube.get("rayjob", first.rayjob, first.namespace) or {})
    h.kube.run(as_printed(command), what="helm upgrade (the NOTES line)", timeout=180)
    h.record.notes_line_ran("upgrade")
    run = h.current_run(RELEASE, NAMESPACE)
    if run.rayjob == first.rayjob or run.run_name == first.run_name:
        raise StageError(f"helm upgrade kept RayJob {run.rayjob} / run {run.run_name}: a new revision must be a new run")
    h.runs["upgraded"] = run
    h.wait_run(run)
    got = _lr_of(_finished(h, run))
    if got is None or abs(float(got) - float(lr.group(1))) > 1e-12:
        raise StageError(f"{run.run_uri}/summary.json: definition.flags.learning_rate={got!r}, want {lr.group(1)}")
    left = [f"rayjob/{first.rayjob}"] if h.kube.get("rayjob", first.rayjob, NAMESPACE) else []
    if old_cluster:
        left += [f"raycluster/{old_cluster}"] if h.kube.get("raycluster", old_cluster, NAMESPACE) else []
        left += [f"pod/{p['metadata']['name']}" for p in _pods(h, NAMESPACE, old_cluster)]
    if left:
        raise StageError(f"after the upgrade the previous revision's objects remain: {left}")
    return f"`{command}`: {run.rayjob} SUCCEEDED with learning_rate {got}; {first.rayjob}, its cluster and pods gone"


def rollback(h: Harness) -> str:
    """NOTES' `helm rollback <r> <revision>` to revision 1, from the upgraded revision: the first run again."""
    first = h.runs["first"]
    current = h.current_run(RELEASE, NAMESPACE)
    if "upgraded" not in h.runs or current.rayjob == first.rayjob:
        raise StageError(f"nothing to roll back from: the release runs {current.rayjob}, revision 1's RayJob "
                         "(the stage 'upgrade' made no later revision)")
    before = h.storage.generations(first.run_uri + "/")
    command = notes_line(h, RELEASE, "rollback")
    h.kube.run(as_printed(command, revision="1"), what="helm rollback (the NOTES line)", timeout=180)
    h.record.notes_line_ran("rollback")
    run = h.current_run(RELEASE, NAMESPACE)
    if run.rayjob != first.rayjob or run.run_name != first.run_name:
        raise StageError(f"helm rollback 1 gave RayJob {run.rayjob} run {run.run_name}; want {first.rayjob} "
                         f"run {first.run_name}")
    h.wait_run(run)
    summary = _finished(h, run)
    problem = retrained_problem(before, h.storage.generations(run.run_uri + "/"), run.run_uri)
    if problem:
        raise StageError(problem)
    return (f"{run.rayjob} SUCCEEDED: run {run.run_name} at step {summary['global_step']}, nothing re-trained (its "
            f"{sum(1 for n in before if '/checkpoints/' in n or '/final/' in n)} checkpoint and adapter objects keep "
            "their generations)")


def _revision(h: Harness) -> int:
    hist = json.loads(h.kube.h("history", RELEASE, "-n", NAMESPACE, "-o", "json", timeout=60).stdout)
    return max(int(r["revision"]) for r in hist)


def quick_rollback(h: Harness) -> str:
    """Upgrade while the job runs, roll back at once: it works, or Helm refuses while the RayJob is being deleted and
    works after NOTES' wait; never a rollback reported done whose RayJob then goes with the deletion."""
    run = h.helm_install(RELEASE, NAMESPACE, upgrade=True)  # a fresh run to interrupt
    target = _revision(h)
    _wait_step(h, run, _checkpoint_step(run))
    h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={"training.learning_rate": QUICK_LR})
    t0 = time.monotonic()
    proc = h.kube.h("rollback", RELEASE, str(target), "-n", NAMESPACE, check=False, timeout=180)
    said = (proc.stderr or proc.stdout).strip()
    job = h.kube.get("rayjob", run.rayjob, NAMESPACE)
    terminating = bool(job and job["metadata"].get("deletionTimestamp"))
    if proc.returncode != 0:
        if "not found" not in said and "being deleted" not in said:
            raise StageError(f"helm rollback {target} right after the upgrade failed for another reason:\n{said[-600:]}")
        status = h.kube.run(["gemma3-ray", "status", "-n", NAMESPACE, "--release", RELEASE, "--project",
                             "gemma3-ray-e2e", "--region", "us-central1"], what="gemma3-ray status", timeout=120).stdout
        wait_line = [ln for ln in status.splitlines() if run.rayjob in ln and WAIT_SENTENCE in ln]
        if terminating and not wait_line:
            raise StageError(f"gemma3-ray status does not say to wait for {run.rayjob}, which is being deleted:\n"
                             f"{status[-800:]}")
        wait = as_printed(notes_line(h, RELEASE, QUICK_ROLLBACK_STAGE), its_name=run.rayjob)
        h.kube.run(wait, what="the NOTES wait line", timeout=330)
        h.record.notes_line_ran(QUICK_ROLLBACK_STAGE)  # only on this path: an immediate rollback needs no wait
        h.kube.h("rollback", RELEASE, str(target), "-n", NAMESPACE, timeout=180, what="helm rollback after the wait")
        outcome = (f"Helm refused at once ({said.splitlines()[-1][:160]}); `gemma3-ray status` said "
                   f"{wait_line[0].strip()[:160] if wait_line else '(the RayJob was already gone)'}; after "
                   f"NOTES' `{shlex.join(wait)}` ({time.monotonic() - t0:.0f} s) the rollback worked")
    else:
        outcome = f"the immediate rollback worked ({run.rayjob} {'terminating' if terminating else 'not terminating'} then)"
    time.sleep(10)  # a RayJob applied onto the terminating object would go with it now
    now = h.kube.get("rayjob", run.rayjob, NAMESPACE)
    if now is None or now["metadata"].get("deletionTimestamp"):
        raise StageError(f"helm rollback {target} reported success, yet RayJob {run.rayjob} is "
                         f"{'gone' if now is None else 'being deleted'}: the rollback was lost with the old object")
    back = h.current_run(RELEASE, NAMESPACE)
    if back.rayjob != run.rayjob:
        raise StageError(f"after the rollback the release runs {back.rayjob}, want {run.rayjob}")
    h.wait_run(run)
    summary = _finished(h, run)
    problem = resumed_problem(summary, int(run.flags["max_steps"]))
    if problem:
        raise StageError(f"{run.run_uri}: {problem}")
    return f"{outcome}; {run.rayjob} resumed {run.run_name} at step {summary['resumed_from_step']} and SUCCEEDED"


def uninstall(h: Harness) -> str:
    """NOTES' `helm uninstall` as printed; nothing of the release left within UNINSTALL_LIMIT_S."""
    command = notes_line(h, RELEASE, "uninstall")
    named = h.release_objects(RELEASE, NAMESPACE)  # every object of the manifest, labelled or not
    t0 = time.monotonic()
    h.kube.run(as_printed(command), what="helm uninstall (the NOTES line)", timeout=UNINSTALL_LIMIT_S)
    h.record.notes_line_ran("uninstall")
    if (NAMESPACE, RELEASE) in h.installed:
        h.installed.remove((NAMESPACE, RELEASE))
    h.wait_release_gone(RELEASE, NAMESPACE, named, UNINSTALL_LIMIT_S - (time.monotonic() - t0))
    return (f"`{command}`: the {len(named)} objects of its manifest, its RayCluster and pods gone in "
            f"{time.monotonic() - t0:.1f} s")


def lost_worker(h: Harness) -> str:
    """A fresh install; one worker pod deleted mid-training; the run restores a checkpoint and finishes."""
    first = h.runs["first"]
    run = h.helm_install(RELEASE, NAMESPACE)
    if run.run_name == first.run_name:
        raise StageError(f"reinstall reused the run name {run.run_name}: a new install must be a fresh run")
    _wait_step(h, run, _checkpoint_step(run))
    cluster = _cluster_of(h.kube.get("rayjob", run.rayjob, NAMESPACE) or {})
    victim = _pods(h, NAMESPACE, cluster, "worker")[0]["metadata"]["name"]
    h.kube.k("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
    h.wait_run(run)
    summary = _finished(h, run)
    problem = resumed_problem(summary, int(run.flags["max_steps"]))
    if problem:
        raise StageError(f"{run.run_uri} after deleting worker {victim}: {problem}")
    return (f"deleted {victim}; {run.rayjob} resumed at step {summary['resumed_from_step']} and SUCCEEDED at step "
            f"{summary['global_step']}; {_continuous(h, run)}")


def lost_head(h: Harness) -> str:
    """The head pod deleted mid-training with rayJob.backoffLimit=1: a failed attempt, a new cluster, the run resumed."""
    run = h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={"rayJob.backoffLimit": 1})
    _wait_step(h, run, _checkpoint_step(run))
    cluster = _cluster_of(h.kube.get("rayjob", run.rayjob, NAMESPACE) or {})
    head = _pods(h, NAMESPACE, cluster, "head")[0]["metadata"]["name"]
    h.kube.k("-n", NAMESPACE, "delete", "pod", head, "--wait=false")
    final = h.wait_run(run, timeout=900)
    status = final.get("status") or {}
    summary = _finished(h, run)
    final_cluster = _cluster_of(final)
    h.record.facts["lost_head"] = {"failed_attempts": status.get("failed"), "succeeded": status.get("succeeded"),
                                   "first_cluster": cluster, "final_cluster": final_cluster,
                                   "resumed_from_step": summary.get("resumed_from_step")}
    problem = lost_head_problem(status, cluster, final_cluster, summary, int(run.flags["max_steps"]))
    if problem:
        raise StageError(f"after deleting head {head} of {cluster}: {problem}")
    return (f"deleted {head}: status.failed={status['failed']}, the retry ran on a new cluster {final_cluster}, "
            f"resumed {run.run_name} at step {summary['resumed_from_step']}, SUCCEEDED at step {summary['global_step']}")


def elastic(h: Harness) -> str:
    """min_workers=1 with every worker on one node the run may cordon (E2E_NODE, or the local cluster's own; else
    not run): that node cordoned, a worker deleted, its replacement cannot be placed (the scheduler's
    PodScheduled=False, reason Unschedulable), and the run ends on fewer workers; the node put back."""
    node = nodes.node_for(h, "elastic")
    host = ((h.kube.get("node", node, "default") or {}).get("metadata", {}).get("labels") or {}).get(
        "kubernetes.io/hostname", node)
    run = h.helm_install(RELEASE, NAMESPACE, upgrade=True, sets={
        "rayJob.backoffLimit": 0, "training.min_workers": 1, r"workers.nodeSelector.kubernetes\.io/hostname": host})
    _wait_step(h, run, _checkpoint_step(run))
    cluster = _cluster_of(h.kube.get("rayjob", run.rayjob, NAMESPACE) or {})
    workers = _pods(h, NAMESPACE, cluster, "worker")
    elsewhere = [p["metadata"]["name"] for p in workers if p["spec"].get("nodeName") != node]
    if elsewhere:
        raise StageError(f"worker pods {elsewhere} are not on node {node}, which their nodeSelector names")
    victim = workers[0]["metadata"]["name"]
    try:
        nodes.change(h.kube, h.session.lease, node, cordon=True)  # recorded in the run's Lease first
        h.kube.k("-n", NAMESPACE, "delete", "pod", victim, "--wait=false")
        before = {p["metadata"]["name"] for p in workers}

        def replacement_unplaceable() -> str:
            return next((p["metadata"]["name"] for p in _pods(h, NAMESPACE, cluster, "worker")
                         if p["metadata"]["name"] not in before and nodes.unschedulable(p)), "")
        replacement = h.kube.wait_for("the deleted worker's replacement: PodScheduled=False, Unschedulable",
                                      replacement_unplaceable, 120, NAMESPACE)
        h.wait_run(run)
        summary = _finished(h, run)
    finally:
        problems = nodes.restore(h.kube, h.session.lease)
        if problems and sys.exc_info()[0] is None:  # else the stage's own error stands; the clean-up tries again
            raise StageError(f"node {node}: its cordon could not be undone: {'; '.join(problems)}")
    if summary.get("num_workers", 0) >= int(run.flags["num_workers"]):
        raise StageError(f"{run.run_uri}: finished on {summary.get('num_workers')} workers; the worker whose "
                         f"replacement stayed Pending should have left fewer than {run.flags['num_workers']}")
    if summary.get("global_batch_size") != int(run.flags["global_batch_size"]):
        raise StageError(f"{run.run_uri}: global_batch_size {summary.get('global_batch_size')} after losing a "
                         f"worker, want {run.flags['global_batch_size']}")
    return (f"node {node} cordoned, replacement {replacement} Unschedulable; {run.rayjob} SUCCEEDED on "
            f"{summary['num_workers']} of {run.flags['num_workers']} workers at step {summary['global_step']}, global batch {summary['global_batch_size']}; "
            f"{_continuous(h, run)}")
