"""Run identity: <storage_path>/runs/<run_name>, and what the driver does with it.

Decided before any worker starts: train fresh, resume the run's own newest checkpoint, continue another
run (--resume_from), or nothing (the run already finished).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flags import TrainArguments, UsageError, is_checkpoint_path
from storage import Storage, storage_at

# A run's directory: Ray Train's checkpoints, the adapter, the merged model, the metrics and summary.
RUNS_DIR = "runs"
CHECKPOINTS_DIR = "checkpoints"
FINAL_DIR = "final"
MERGED_DIR = "merged"
TENSORBOARD_DIR = "tensorboard"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
# A flag or input problem a worker found (bad_rows=fail, no usable rows): the driver reports it and
# exits 2, and Ray does not retry a job that would fail the same way.
USAGE_ERROR_FILE = "usage_error.txt"
# Ray Train's record of the checkpoints it registered (in CHECKPOINTS_DIR; restored on a restart).
RAY_CHECKPOINT_SNAPSHOT = "checkpoint_manager_snapshot.json"
TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINT_NAME_PATTERN = re.compile(r"checkpoint-(\d+)")


def new_run_name(root: Storage) -> str:
    """A fresh run name from the UTC time (a suffix when that name is taken)."""
    base = datetime.now(timezone.utc).strftime("run-%Y%m%d-%H%M%S")
    name, n = base, 1
    while root.exists(f"{RUNS_DIR}/{name}"):
        n += 1
        name = f"{base}-{n}"
    return name


def registered_checkpoints(run: Storage) -> list[tuple[int, str]]:
    """(step, URI) of the checkpoints Ray Train registered for this run, oldest first.

    Ray Train lists them in its checkpoint-manager snapshot and restores the newest on a restart; a
    directory it never registered (an upload cut short) is not a checkpoint.
    """
    raw = run.read_bytes(f"{CHECKPOINTS_DIR}/{RAY_CHECKPOINT_SNAPSHOT}")
    if not raw:
        return []
    snapshot = json.loads(raw)
    names = {r["checkpoint_dir_name"] for r in snapshot.get("checkpoint_results", [])}
    if snapshot.get("latest_checkpoint_result"):
        names.add(snapshot["latest_checkpoint_result"]["checkpoint_dir_name"])
    found = []
    for name in names:
        match = CHECKPOINT_NAME_PATTERN.fullmatch(name)
        if match:
            found.append((int(match.group(1)), run.uri(CHECKPOINTS_DIR, name)))
    return sorted(found)


def checkpoint_step(uri: str) -> int:
    """The optimizer step of a checkpoint directory (its trainer_state.json)."""
    raw = storage_at(uri).read_bytes(TRAINER_STATE_FILE)
    if raw is None:
        raise UsageError(f"resume_from: {uri} is not a checkpoint (no {TRAINER_STATE_FILE} in it)")
    return int(json.loads(raw)["global_step"])


@dataclass
class RunPlan:
    """What the driver decided about this run before any worker starts."""

    name: str
    storage: Storage  # <storage_path>/runs/<name>
    resume_checkpoint: str | None  # another run's checkpoint, used when this run has none of its own
    log_line: str  # the driver's first line
    finished: dict[str, Any] | None  # the summary of a completed run (nothing to train)


def plan_run(args: TrainArguments, root: Storage) -> RunPlan:
    """Name the run, and decide: fresh, resume within the run, continue another run, or already finished."""
    named = args.run_name is not None
    name = args.run_name or new_run_name(root)
    run = root.child(f"{RUNS_DIR}/{name}")
    raw = run.read_bytes(SUMMARY_FILE)
    summary = json.loads(raw) if raw else None
    if summary and summary.get("completed"):
        line = f"run {name} already finished at step {summary.get('global_step')}; nothing to train"
        return RunPlan(name, run, None, line, summary)
    own = registered_checkpoints(run)
    if own:
        step, uri = own[-1]
        return RunPlan(name, run, None, f"resuming {name} from step {step} (restart of this run: its newest "
                                        f"checkpoint {uri})", None)
    if args.resume_from:
        if is_checkpoint_path(args.resume_from):
            uri = args.resume_from.rstrip("/")
            if not uri.startswith("gs://"):
                uri = str(Path(uri).resolve())
            step = checkpoint_step(uri)
        else:
            other = registered_checkpoints(root.child(f"{RUNS_DIR}/{args.resume_from}"))
            if not other:
                raise UsageError(f"resume_from={args.resume_from}: no checkpoint of that run under "
                                 f"{root.uri(RUNS_DIR, args.resume_from)}; runs there: {root.list_dir(RUNS_DIR)}")
            step, uri = other[-1]
        return RunPlan(name, run, uri, f"resuming {name} from step {step} (--resume_from={args.resume_from}: "
                                       f"checkpoint {uri})", None)
    why = "" if named else " (no --run_name given: named from the UTC time)"
    return RunPlan(name, run, None, f"fresh run {name}{why}", None)


