"""The end of every `make e2e`, on every exit path: the run's releases, namespaces, cluster-scoped objects and
storage removed (unless --keep), what is left named, the local cluster stopped, the table printed and
summary.json written with the run's result. Whatever goes wrong here is one of the record's errors (the run
fails), never an exception that skips the summary."""

from __future__ import annotations

import shutil
import time

from e2e.stages.setup import CLUSTER_SH
from e2e.support import foreign
from e2e.support.errors import StageError
from e2e.support.harness import OUT, Harness, run_script
from e2e.support.record import Record
from e2e.support.session import Session
from e2e.support.storage.run_storage import RunStorage


def cleanup(rec: Record, harness: Harness | None, session: Session | None, stack: list, keep: bool) -> None:
    """The clean-up, then the table and summary.json with the result (rec.verdict()); an exception here is an
    error of the run, with its traceback in the log."""
    t0 = time.time()
    try:
        problems = _cleanup(rec, harness, session, stack, keep)
    except Exception as e:  # noqa: BLE001 - the summary is written whatever broke
        rec.log_traceback()
        problems = [f"{type(e).__name__}: {e} (a defect of the e2e harness; traceback in e2e.log)"]
    rec.errors += [f"clean-up: {p}" for p in problems if not p.startswith("left: ")]
    for p in problems:
        rec.say(f"[e2e] cleanup: {p}")
    rec.ended = True
    if "deadline" in rec.facts:  # the bound e2e/README.md states, measured by every run
        rec.facts["deadline"].update(cleanup_s=round(time.time() - t0, 1),
                                     ended_past_s=round(time.time() - rec.facts["deadline"]["E2E_DEADLINE"], 1))
    rec.say("\n" + rec.table())
    rec.say(f"[e2e] {rec.write()} (log: {OUT / 'e2e.log'})")


def _cleanup(rec: Record, harness: Harness | None, session: Session | None, stack: list, keep: bool) -> list[str]:
    say = rec.say
    problems: list[str] = []
    objs: list = []
    stores: list[RunStorage] = [obj for kind, obj in stack if kind == "storage"]
    if harness is not None and session is not None and not keep and session.before:
        try:
            objs = session.cluster_objects()
        except StageError as e:
            problems.append(f"listing the run's cluster-scoped objects: {e}")
    for obj in reversed(stores):
        obj.stop()  # the port-forward; the emulator's Deployment goes with its namespace
    if harness is not None and not keep:
        try:
            problems += harness.cleanup()
            if session is not None:
                problems += session.delete(objs, [])
        except StageError as e:
            problems.append(f"cleanup of releases: {e}")
    for obj in stores:  # E2E_BUCKET: the run's prefix, after the releases (no pod writes there any more)
        if keep and obj.mode == "bucket":
            say(f"[e2e] --keep: the run's objects stay in {obj.root}/; delete them with: gcloud storage rm -r "
                f"{obj.root}/")
        elif not keep:
            problems += [f"deleting {obj.root}/: {p}" for p in obj.cleanup()]
    if (session is not None or stores) and not keep:
        left: list[str] = []
        if session is not None:
            try:
                left = session.left()
            except StageError as e:
                left = [f"(could not ask the cluster: {e})"]
            say(f"[e2e] left on the cluster: {', '.join(left) if left else 'nothing'}")
        for obj in stores:
            if obj.mode == "bucket":
                in_bucket = obj.left()
                say(f"[e2e] left in the bucket: {', '.join(in_bucket) if in_bucket else 'nothing'}")
                left += in_bucket
        rec.facts["left"] = left
        if left:
            problems.append(f"left: {', '.join(left)}")
    if session is not None:  # the nodes put back, the Lease's renewal stopped; deleted when nothing is left
        problems += session.close(release=not keep and not rec.facts.get("left"))
    for kind, obj in reversed(stack):
        if kind == "storage":
            continue
        elif kind == "foreign" and harness is not None:  # the shared drills' "other team", made by this run
            try:
                problems += foreign.remove(harness.kube, obj)
            except StageError as e:
                problems.append(f"removing the drills' other-team objects: {e}")
        elif kind == "cluster" and not keep:
            try:
                run_script([str(CLUSTER_SH), "stop", str(obj)], OUT / "cluster.log", 300, "cluster stop")
                shutil.rmtree(obj, ignore_errors=True)
            except StageError as e:
                problems.append(str(e))
        elif kind == "cluster":
            say(f"[e2e] --keep: the local cluster runs on; stop it with: e2e/cluster/cluster.sh stop {obj}")
    return problems

