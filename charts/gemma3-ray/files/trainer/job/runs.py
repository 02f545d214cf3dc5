"""Run identity: <storage_path>/runs/<run_name>, and what the driver does with it.

Decided before any worker starts: train fresh, resume the run's own newest checkpoint, continue another
run (--resume_from), or nothing (the run already finished).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trainer.job import checkpoint_manifest, run_definition, stored
from trainer.job.flags import TrainArguments, UsageError, is_checkpoint_path
from trainer.job.storage import Storage, filesystem, storage_at

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
TRAINER_STATE_FILE = checkpoint_manifest.TRAINER_STATE_FILE
# checkpoint-<step>, or checkpoint-<step>-<n> when a retrained step's name was taken (never written into)
CHECKPOINT_NAME_PATTERN = re.compile(r"checkpoint-(\d+)(?:-(\d+))?")
BROKEN_DIR = "broken_checkpoints"  # where the driver moves a run's checkpoints that are not intact


def new_run_name(root: Storage) -> str:
    """A fresh run name from the UTC time (a suffix when that name is taken)."""
    base = datetime.now(timezone.utc).strftime("run-%Y%m%d-%H%M%S")
    name, n = base, 1
    while root.exists(f"{RUNS_DIR}/{name}"):
        n += 1
        name = f"{base}-{n}"
    return name


def _snapshot_consistent(value: dict[str, Any], at: str) -> str | None:
    """Ray Train's own restore asserts these: one report index per result, one spec per pending result, and the
    latest and pending results among the results."""
    names = {r["checkpoint_dir_name"] for r in value["checkpoint_results"]}
    latest = value.get("latest_checkpoint_result")
    if len(value["checkpoint_results"]) != len(value["checkpoint_report_indices"]):
        return "checkpoint_results and checkpoint_report_indices differ in length"
    if len(value["pending_training_results"]) != len(value["pending_validation_specs"]):
        return "pending_training_results and pending_validation_specs differ in length"
    if latest and latest["checkpoint_dir_name"] not in names:
        return f"latest_checkpoint_result {latest['checkpoint_dir_name']!r} is not among checkpoint_results"
    stray = [r["checkpoint_dir_name"] for r in value["pending_training_results"] if r["checkpoint_dir_name"] not in names]
    return f"pending result {stray[0]!r} is not among checkpoint_results" if stray else None


_RESULT = stored.fields({"checkpoint_dir_name": stored.TEXT, "metrics": stored.is_a(dict, "a JSON object")},
                        {"version": stored.is_a(int, "an integer")})
_NAMES = stored.each(stored.TEXT)
# Ray Train 2.60's checkpoint-manager snapshot (ray/train/v2/_internal/execution/checkpoint/checkpoint_manager.py,
# _CheckpointManagerState): every field its restore needs.
SNAPSHOT = stored.both(stored.fields({
    "checkpoint_results": stored.each(_RESULT), "checkpoint_report_indices": stored.each(stored.is_a(int, "an integer")),
    "pending_training_results": stored.each(_RESULT), "pending_validation_specs": stored.each(stored.ANY),
    "current_report_index": stored.is_a(int, "an integer"), "validated_checkpoint_dir_names": _NAMES,
    "timed_out_validation_checkpoint_dir_names": _NAMES, "failed_validation_checkpoint_dir_names": _NAMES,
}, {"latest_checkpoint_result": lambda v, at: None if v is None else _RESULT(v, at), "ray_version": stored.TEXT}),
    _snapshot_consistent)


def _by_step(run: Storage, names: set[str]) -> list[tuple[int, str]]:
    found = []
    for name in names:
        match = CHECKPOINT_NAME_PATTERN.fullmatch(name)
        if match:
            found.append((int(match.group(1)), int(match.group(2) or 0), run.uri(CHECKPOINTS_DIR, name)))
    return [(step, uri) for step, _, uri in sorted(found)]


def registered_checkpoints(run: Storage) -> list[tuple[int, str]]:
    """(step, URI) of the checkpoints Ray Train registered for this run, oldest first.

    Ray Train lists them in its checkpoint-manager snapshot and restores the newest on a restart; a
    directory it never registered (an upload cut short) is not a checkpoint. stored.Unusable when the
    snapshot is torn or not what Ray Train writes (its own restore would fail on it).
    """
    snapshot, problem = stored.read(run.child(CHECKPOINTS_DIR), RAY_CHECKPOINT_SNAPSHOT, SNAPSHOT)
    if problem:
        raise stored.Unusable(problem)
    return _by_step(run, {r["checkpoint_dir_name"] for r in snapshot["checkpoint_results"]}) if snapshot else []


def run_checkpoints(run: Storage) -> tuple[list[tuple[int, str]], str | None]:
    """(step, URI) of the run's checkpoints, oldest first: those Ray Train registered, or, when its snapshot is
    unusable, the checkpoint directories in checkpoints/ (each verified by its manifest before use); and why
    the snapshot is unusable (None when it is not)."""
    try:
        return registered_checkpoints(run), None
    except stored.Unusable as e:
        return _by_step(run, set(run.list_dir(CHECKPOINTS_DIR))), str(e)


def set_aside(run: Storage, plan: RunPlan) -> None:
    """Before Ray Train restores the run: an unusable snapshot moves to broken_checkpoints/ (Ray Train then starts a
    new registry; the workers resume plan.resume_checkpoint), then the broken checkpoints are quarantined."""
    if plan.snapshot_problem:
        fs, base = run.fs()
        fs.create_dir(f"{base}/{BROKEN_DIR}", recursive=True)
        fs.move(f"{base}/{CHECKPOINTS_DIR}/{RAY_CHECKPOINT_SNAPSHOT}", f"{base}/{BROKEN_DIR}/{RAY_CHECKPOINT_SNAPSHOT}")
    quarantine(run, plan.broken)


def quarantine(run: Storage, broken: list[dict[str, str]]) -> None:
    """Take the run's broken checkpoints out of Ray Train's registry and out of checkpoints/ (moved to
    broken_checkpoints/), before Ray Train restores it: Ray then restores the newest intact checkpoint, a
    retrained step is written into a fresh directory, and the registry lists only what exists (Ray 2.60
    retains and deletes by directory; one retrained into a broken one's directory was later deleted)."""
    names = {b["checkpoint"].rsplit("/", 1)[1] for b in broken}
    if not names:
        return
    rel = f"{CHECKPOINTS_DIR}/{RAY_CHECKPOINT_SNAPSHOT}"
    raw = run.read_bytes(rel)
    for name in sorted(names) if raw is None else []:  # no registry (set aside): only the directories move
        run.move_dir(f"{CHECKPOINTS_DIR}/{name}", f"{BROKEN_DIR}/{name}")
    if raw is None:
        return
    snapshot = json.loads(raw)  # checked by registered_checkpoints (SNAPSHOT) when the plan was made
    kept = [(r, i) for r, i in zip(snapshot.get("checkpoint_results", []),
                                   snapshot.get("checkpoint_report_indices", []), strict=True)
            if r["checkpoint_dir_name"] not in names]
    snapshot["checkpoint_results"] = [r for r, _ in kept]
    snapshot["checkpoint_report_indices"] = [i for _, i in kept]
    latest = snapshot.get("latest_checkpoint_result")
    if latest and latest["checkpoint_dir_name"] in names:
        snapshot["latest_checkpoint_result"] = max(kept, key=lambda k: k[1])[0] if kept else None
    pending = [(r, v) for r, v in zip(snapshot.get("pending_training_results", []),
                                      snapshot.get("pending_validation_specs", []), strict=True)
               if r["checkpoint_dir_name"] not in names]
    snapshot["pending_training_results"] = [r for r, _ in pending]
    snapshot["pending_validation_specs"] = [v for _, v in pending]
    for key in ("validated_checkpoint_dir_names", "timed_out_validation_checkpoint_dir_names",
                "failed_validation_checkpoint_dir_names"):
        if key in snapshot:
            snapshot[key] = [n for n in snapshot[key] if n not in names]
    run.write_bytes(rel, json.dumps(snapshot).encode())  # first: a crash before the move leaves it unlisted
    for name in sorted(names):
        run.move_dir(f"{CHECKPOINTS_DIR}/{name}", f"{BROKEN_DIR}/{name}")


def checkpoint_step(uri: str) -> int:
    """The optimizer step of a checkpoint directory (its trainer_state.json, checked)."""
    raw = storage_at(uri).read_bytes(TRAINER_STATE_FILE)
    if raw is None:
        raise UsageError(f"resume_from: {uri} is not a checkpoint (no {TRAINER_STATE_FILE} in it)")
    try:
        return checkpoint_manifest.state_step(raw)
    except stored.Unusable as e:
        problem = checkpoint_problem(uri, storage_at(uri).emulator_host) or str(e)  # the manifest's word first
        raise UsageError(f"resume_from: checkpoint {uri} does not load ({problem}); name an intact one") from e


def checkpoint_problem(uri: str, emulator_host: str | None) -> str | None:
    """Why a checkpoint is not intact, or None: it is intact only if its manifest verifies (every file the
    workers saved is there with its size and checksum; checkpoint_manifest.py). Without torch."""
    fs, base = filesystem(uri, emulator_host)
    return checkpoint_manifest.remote_problem(fs, base, uri.startswith("gs://"))


def newest_intact(checkpoints: list[tuple[int, str]], emulator_host: str | None,
                  whose: str) -> tuple[int, str, str, list[dict[str, str]]]:
    """(step, URI, note on newer broken ones, [{checkpoint, problem}] of those) of the newest intact checkpoint."""
    broken: list[str] = []
    found: list[dict[str, str]] = []
    for step, uri in reversed(checkpoints):
        problem = checkpoint_problem(uri, emulator_host)
        if problem is None:
            return step, uri, "".join(f"; {b} does not load" for b in broken), found
        broken.append(f"{uri} ({problem})")
        found.append({"checkpoint": uri, "problem": problem})
    raise UsageError(f"no checkpoint of {whose} loads: {'; '.join(broken)}; continue from a good one with "
                     "--resume_from=<checkpoint path> in a new run")


def adapter_changes(uri: str, new: dict[str, Any]) -> list[str]:
    """The adapter-shape changes a checkpoint's own adapter_config.json shows (its rank, trained embeddings), for a
    checkpoint whose run recorded no definition."""
    config, _ = stored.read(storage_at(uri), run_definition.ADAPTER_CONFIG_FILE, run_definition.ADAPTER_CONFIG)
    if config is None:
        return []
    saved = {"lora_r": config["r"], "train_embeddings": bool(config.get("modules_to_save"))}
    return run_definition.changes({"flags": saved}, {"flags": {k: new["flags"][k] for k in saved}},
                                  only=run_definition.ADAPTER_SHAPE)


@dataclass
class RunPlan:
    """What the driver decided about this run before any worker starts."""

    name: str
    storage: Storage  # <storage_path>/runs/<name>
    resume_checkpoint: str | None  # another run's checkpoint, used when this run has none of its own
    log_line: str  # the driver's first line
    finished: dict[str, Any] | None  # the summary of a completed run (nothing to train)
    definition: dict[str, Any] | None = None  # what defines the run (run_definition.py), recorded at its start
    broken: list[dict[str, str]] = field(default_factory=list)  # the run's own broken checkpoints, to quarantine
    snapshot_problem: str | None = None  # why Ray Train's snapshot is unusable: set aside before Ray restores the run


SUMMARY = stored.fields({"completed": stored.FLAG, "global_step": stored.COUNT})  # what plan_run reads of it


def plan_run(args: TrainArguments, root: Storage) -> RunPlan:
    """Name the run, and decide: fresh, resume within the run, continue another run, or already finished.
    A restart whose definition (data, flags other than RESTART_FREE) differs from the one the run recorded
    at its start is refused, naming what changed and the two ways on. A file of the run that is torn or not
    what the trainer wrote is passed over and said in the first line (`notes`)."""
    named = args.run_name is not None
    name = args.run_name or new_run_name(root)
    run = root.child(f"{RUNS_DIR}/{name}")
    notes: list[str] = []
    summary, problem = stored.read(run, SUMMARY_FILE, SUMMARY)
    if problem:
        notes.append(f"its {SUMMARY_FILE} is unusable ({problem}): not taken as finished")
    new = run_definition.definition(args, storage_at(args.dataset_name).emulator_host)
    old, problem = stored.read(run, run_definition.DEFINITION_FILE, run_definition.SHAPE)
    if problem:
        notes.append(f"its {run_definition.DEFINITION_FILE} is unusable ({problem}): recorded again from this job's "
                     "settings")
    changed = run_definition.changes(old, new) if old is not None else []
    own, snapshot_problem = run_checkpoints(run)
    if snapshot_problem:
        notes.append(f"Ray Train's {RAY_CHECKPOINT_SNAPSHOT} is unusable ({snapshot_problem}): set aside, the run's "
                     "checkpoint directories listed instead")
    said = "".join(f"; {n}" for n in notes)
    finished = bool(summary and summary["completed"])
    if changed and (own or finished):  # a finished run too: its name never means other data or flags
        also = (f", or continue this run's checkpoint with the new settings with --run_name=<new name> "
                f"--resume_from={name}") if own else ""
        raise UsageError(f"run {name} was started with other settings ({run_definition.changes_text(changed)}): "
                         f"start a new run with --run_name=<new name>{also}")
    if finished:
        line = f"run {name} already finished at step {summary['global_step']}; nothing to train"
        return RunPlan(name, run, None, line, summary)
    if own:
        step, uri, broken, broken_uris = newest_intact(own, run.emulator_host, f"run {name}")
        newest = "newest intact" if broken else "newest"
        return RunPlan(name, run, uri if snapshot_problem else None,  # without a registry: the workers' start
                       f"resuming {name} from step {step} (restart of this run: its {newest} checkpoint "
                       f"{uri}{broken}{said})", None, old or new, broken_uris, snapshot_problem)  # old: before #21
    if args.resume_from:
        if is_checkpoint_path(args.resume_from):
            uri = args.resume_from  # one spelling (flags.PATH_FLAGS): absolute, or gs:// without a trailing /
            step = checkpoint_step(uri)
            problem = checkpoint_problem(uri, storage_at(uri).emulator_host)  # the manifest, then its trainer state
            if problem:
                raise UsageError(f"resume_from: checkpoint {uri} does not load ({problem}); name an intact one")
            broken = ""
        else:
            other, _ = run_checkpoints(root.child(f"{RUNS_DIR}/{args.resume_from}"))  # only read: nothing set aside
            if not other:
                raise UsageError(f"resume_from={args.resume_from}: no checkpoint of that run under "
                                 f"{root.uri(RUNS_DIR, args.resume_from)}; runs there: {root.list_dir(RUNS_DIR)}")
            step, uri, broken, _ = newest_intact(other, root.emulator_host, f"run {args.resume_from}")
        origin, problem = stored.read(storage_at(uri.rsplit("/", 2)[0]), run_definition.DEFINITION_FILE,
                                      run_definition.SHAPE)  # <run>/checkpoints/<checkpoint>
        shape = (run_definition.changes(origin, new, only=run_definition.ADAPTER_SHAPE) if origin is not None
                 else adapter_changes(uri, new))
        if shape:
            raise UsageError(f"resume_from={args.resume_from}: its checkpoint {uri} was trained with another adapter "
                             f"shape ({'; '.join(shape)}); a checkpoint continues only with the adapter shape it was "
                             f"trained with ({', '.join(run_definition.ADAPTER_SHAPE)}): keep those flags, or drop "
                             "--resume_from to train a new adapter")
        differ = run_definition.changes(origin, new) if origin is not None else []
        new["continued_from"] = {"checkpoint": uri, "step": step, "changes": differ}
        settings = (f"; with new settings: {run_definition.changes_text(differ)}" if differ
                    else f"; its run's definition is unusable ({problem})" if problem
                    else "; its run recorded no definition" if origin is None else "")
        return RunPlan(name, run, uri, f"resuming {name} from step {step} (--resume_from={args.resume_from}: "
                                       f"checkpoint {uri}{broken}{settings}{said})", None, new,
                       snapshot_problem=snapshot_problem)
    why = [] if named else ["no --run_name given: named from the UTC time"]
    if changed:  # an earlier attempt of this run that left no checkpoint: nothing of it is kept
        why = [f"its earlier attempt left no checkpoint; started again with new settings: "
               f"{run_definition.changes_text(changed)}"]
    why += notes
    return RunPlan(name, run, None, f"fresh run {name}" + (f" ({'; '.join(why)})" if why else ""), None, new,
                   snapshot_problem=snapshot_problem)
