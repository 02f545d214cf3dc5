"""`status`: the RayJob, the Ray dashboard's view of the job, and the newest run in the bucket.

Each part is read on its own; one that cannot be read (no cluster connection, not logged in to
Google Cloud, no permission) is reported as ``unknown`` with the reason and the fix, and the others
are still shown — `status` never fails half-way through its report.

Runs live under ``<storage_path>/runs/<run_name>/`` (the run-identity contract): checkpoints,
``final/``, ``metrics.jsonl``, ``summary.json`` (``"completed": true`` once the run finished) and
``report.html``. The newest run is the one written to last.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Deployment
from gemma3_ray.gcp import run_reports
from gemma3_ray.kube import cluster
from gemma3_ray.kueue import check as kueue_check
from gemma3_ray.utils.errors import UserError, translate

RUNS_DIR = "runs"
SUMMARY_FILE = "summary.json"
CHECKPOINT_PREFIX = "checkpoint_"


@dataclass(frozen=True)
class Run:
    name: str
    uri: str
    updated: str
    checkpoint: str | None
    checkpoint_updated: str
    summary: str | None  # the blob name of summary.json, if written


def newest_run(storage: Any, bucket: str, prefix: str) -> Run | None:
    """The run under gs://bucket/prefix/runs/ with the latest write, its newest checkpoint and summary."""
    base = f"{prefix.strip('/')}/{RUNS_DIR}/" if prefix.strip("/") else f"{RUNS_DIR}/"
    runs: dict[str, dict[str, Any]] = {}
    for blob in storage.list_blobs(bucket, prefix=base):
        rest = blob.name[len(base):].split("/")
        if len(rest) < 2:  # noqa: PLR2004 - runs/<run>/<file>
            continue
        updated = blob.updated.isoformat() if blob.updated else ""
        run = runs.setdefault(rest[0], {"updated": "", "ckpt": ("", ""), "summary": None})
        run["updated"] = max(run["updated"], updated)
        if rest[-1] == SUMMARY_FILE and len(rest) == 2:  # noqa: PLR2004 - the run's own summary
            run["summary"] = blob.name
        idx = next((i for i, p in enumerate(rest[:-1]) if p.startswith(CHECKPOINT_PREFIX)), None)
        if idx is not None:
            run["ckpt"] = max(run["ckpt"], (updated, "/".join(rest[: idx + 1])))
    if not runs:
        return None
    name, info = max(runs.items(), key=lambda kv: (kv[1]["updated"], kv[0]))
    ckpt_updated, ckpt = info["ckpt"]
    return Run(name=name, uri=f"gs://{bucket}/{base}{name}/", updated=info["updated"],
               checkpoint=f"gs://{bucket}/{base}{ckpt}" if ckpt else None, checkpoint_updated=ckpt_updated,
               summary=info["summary"])


def _summary_text(storage: Any, bucket: str, blob_name: str) -> str:
    try:
        summary = json.loads(storage.bucket(bucket).blob(blob_name).download_as_bytes())
    except (ValueError, TypeError):
        return "summary.json unreadable"
    if summary.get("completed"):
        step = summary.get("global_step")
        loss = summary.get("final_eval_loss")
        return f"finished at step {step}" + (f", final eval loss {loss:.4f}" if isinstance(loss, float) else "")
    return "summary.json written, not completed"


def run_lines(storage: Any, dep: Deployment) -> list[str]:
    run = newest_run(storage, dep.bucket, dep.prefix)
    if run is None:
        legacy = run_reports.newest_checkpoint(storage, dep.bucket, dep.prefix)  # a run from before runs/ existed
        if legacy is not None:
            return [f"Newest run: none under gs://{dep.bucket}/{dep.prefix}/{RUNS_DIR}/; newest checkpoint "
                    f"{legacy.path} ({legacy.updated})"]
        return [f"Newest run: none yet under gs://{dep.bucket}/{dep.prefix}/{RUNS_DIR}/"]
    state = _summary_text(storage, dep.bucket, run.summary) if run.summary else "in progress (no summary.json yet)"
    ckpt = f"{run.checkpoint} ({run.checkpoint_updated})" if run.checkpoint else "none yet"
    return [f"Newest run: {run.name}, {state}; last write {run.updated} ({run.uri})",
            f"Newest checkpoint: {ckpt}"]


def _unknown(what: str, exc: Exception) -> str:
    reason = str(exc) if isinstance(exc, UserError) else str(translate(exc, "read", what))
    return f"{what}: unknown ({reason.rstrip('.')})"


def _guarded(what: str, fn: Callable[[], list[str]]) -> list[str]:
    try:
        return fn()
    except Exception as exc:  # every part reports on its own; none ends the report
        return [_unknown(what, exc)]


_STORAGE_PATH_RE = re.compile(r"""--storage_path=['"]?gs://(?P<bucket>[a-z0-9][a-z0-9_.-]*)/?(?P<prefix>[^\s'"]*)""")


def storage_of(rayjob: dict[str, Any]) -> tuple[str, str] | None:
    """(bucket, prefix) the job really writes to: its entrypoint's --storage_path."""
    m = _STORAGE_PATH_RE.search((rayjob.get("spec") or {}).get("entrypoint") or "")
    return (m["bucket"], m["prefix"].strip("/")) if m else None


def deleting_lines(custom: Any, namespace: str, release: str) -> list[str]:
    """The release's RayJobs being deleted (an upgrade just replaced one: KubeRay stops its Ray job first). Helm
    refuses to roll back to such a revision ("original object RayJob ... not found") until it is gone."""
    items = custom.list_namespaced_custom_object(cluster.RAY_GROUP, cluster.RAY_VERSION, namespace,
                                                 cluster.RAYJOB_PLURAL,
                                                 label_selector=f"{cluster.INSTANCE_LABEL}={release}").get("items", [])
    return [f"RayJob {namespace}/{o['metadata']['name']} is being deleted (KubeRay stops its Ray job first): to roll "
            f"back to its revision, wait until it is gone: kubectl -n {namespace} wait "
            f"rayjob/{o['metadata']['name']} --for=delete --timeout=300s"
            for o in sorted(items, key=lambda o: o["metadata"]["name"]) if o["metadata"].get("deletionTimestamp")]


def lines(dep: Deployment, clients: Clients) -> list[str]:
    out: list[str] = []
    state: list[cluster.RayJobState] = []

    def rayjob() -> list[str]:
        nonlocal dep
        custom = clients.kube.get_custom()
        obj = cluster.find_rayjob(custom, dep.namespace, dep.release)
        s = cluster.rayjob_state(obj)
        state.append(s)
        found = [f"RayJob {dep.namespace}/{s.name}: deployment {s.deployment_status}, job {s.job_status}"
                 + (f" ({s.message})" if s.message else "")]
        found += kueue_check.status_lines(custom, obj)
        found += cluster.unplaceable_lines(clients.kube.get_core(), dep.namespace, s.ray_cluster)
        found += deleting_lines(custom, dep.namespace, dep.release)
        live = storage_of(obj)
        given = {"bucket", "prefix"} & set(dep.sources.flags)
        if live and not given and live != (dep.bucket, dep.prefix):
            dep = replace(dep, bucket=live[0], prefix=live[1])  # where this job writes, not the default
            found.append(f"Storage: gs://{live[0]}/{live[1]}/ (the RayJob's --storage_path)")
        return found

    def dashboard() -> list[str]:
        if not state:
            return ["Ray dashboard: unknown (no RayJob to ask about)"]
        s = state[0]
        dash = cluster.dashboard_job(clients.kube.get_core(), dep.namespace, s.ray_cluster, s.job_id)
        if dash:
            return [f"Ray dashboard: job {s.job_id} {dash.get('status', '?')} {dash.get('message') or ''}".rstrip()]
        return ["Ray dashboard: not reachable (the cluster is not up, or it was deleted after the job)"]

    out += _guarded("RayJob", rayjob)
    out += _guarded("Ray dashboard", dashboard)
    out += _guarded("Newest run", lambda: run_lines(clients.get_storage(), dep))

    def report() -> list[str]:
        return [run_reports.status_line(clients.get_storage(), dep.bucket, dep.prefix)]

    out += _guarded("Run report", report)
    return out
