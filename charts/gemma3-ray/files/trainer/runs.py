"""Run identity: <storage_path>/runs/<run_name>, and what the driver does with it.

Decided before any worker starts: train fresh, resume the run's own newest checkpoint, continue another
run (--resume_from), or nothing (the run already finished).
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import run_definition
from flags import TrainArguments, UsageError, is_checkpoint_path
from storage import Storage, filesystem, storage_at

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


def checkpoint_problem(uri: str, emulator_host: str | None) -> str | None:
    """Why a checkpoint is visibly broken (a file cut short, unreadable JSON), or None. Cheap and without
    torch: zip directories (torch.save) and safetensors headers only; the workers load it in full."""
    import pyarrow.fs as pafs

    fs, base = filesystem(uri, emulator_host)
    files = [i for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True)) if i.type == pafs.FileType.File]
    if TRAINER_STATE_FILE not in {Path(i.path).name for i in files}:
        return f"no {TRAINER_STATE_FILE}"
    for info in sorted(files, key=lambda i: i.path):
        name = Path(info.path).name
        try:
            with fs.open_input_file(info.path) as fh:
                if name.endswith(".json"):
                    json.loads(fh.read())
                elif name.endswith((".pt", ".pth", ".bin")) and fh.read(2) == b"PK":
                    fh.seek(0)
                    with zipfile.ZipFile(fh) as archive:  # a file cut short has lost its central directory
                        ends = [m.header_offset + m.compress_size for m in archive.infolist()]
                    if max(ends, default=0) > info.size:
                        return f"{name}: {info.size} bytes, shorter than its zip directory says"
                elif name.endswith(".safetensors"):
                    header_len = int.from_bytes(fh.read(8), "little")
                    header = json.loads(fh.read(header_len))
                    data = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
                    if 8 + header_len + data != info.size:
                        return f"{name}: {info.size} bytes, its header says {8 + header_len + data}"
        except (zipfile.BadZipFile, ValueError, KeyError, TypeError, OSError) as e:
            return f"{name}: {type(e).__name__}: {str(e)[:200]}"
    return None


def newest_intact(checkpoints: list[tuple[int, str]], emulator_host: str | None, whose: str) -> tuple[int, str, str]:
    """(step, URI, note on newer broken ones) of the newest checkpoint that is not visibly broken."""
    broken: list[str] = []
    for step, uri in reversed(checkpoints):
        problem = checkpoint_problem(uri, emulator_host)
        if problem is None:
            return step, uri, "".join(f"; {b} does not load" for b in broken)
        broken.append(f"{uri} ({problem})")
    raise UsageError(f"no checkpoint of {whose} loads: {'; '.join(broken)}; continue from a good one with "
                     "--resume_from=<checkpoint path> in a new run")


@dataclass
class RunPlan:
    """What the driver decided about this run before any worker starts."""

    name: str
    storage: Storage  # <storage_path>/runs/<name>
    resume_checkpoint: str | None  # another run's checkpoint, used when this run has none of its own
    log_line: str  # the driver's first line
    finished: dict[str, Any] | None  # the summary of a completed run (nothing to train)
    definition: dict[str, Any] | None = None  # what defines the run (run_definition.py), recorded at its start


def plan_run(args: TrainArguments, root: Storage) -> RunPlan:
    """Name the run, and decide: fresh, resume within the run, continue another run, or already finished.
    A restart whose definition (data, flags other than RESTART_FREE) differs from the one the run recorded
    at its start is refused, naming what changed and the two ways on."""
    named = args.run_name is not None
    name = args.run_name or new_run_name(root)
    run = root.child(f"{RUNS_DIR}/{name}")
    raw = run.read_bytes(SUMMARY_FILE)
    summary = json.loads(raw) if raw else None
    if summary and summary.get("completed"):
        line = f"run {name} already finished at step {summary.get('global_step')}; nothing to train"
        return RunPlan(name, run, None, line, summary)
    new = run_definition.definition(args, storage_at(args.dataset_name).emulator_host)
    old = run_definition.read(run)
    changed = run_definition.changes(old, new) if old is not None else []
    own = registered_checkpoints(run)
    if own:
        if changed:
            raise UsageError(
                f"run {name} was started with other settings ({run_definition.changes_text(changed)}): start a new "
                f"run with --run_name=<new name>, or continue this run's checkpoint with the new settings with "
                f"--run_name=<new name> --resume_from={name}")
        step, uri, broken = newest_intact(own, run.emulator_host, f"run {name}")
        newest = "newest intact" if broken else "newest"
        return RunPlan(name, run, None, f"resuming {name} from step {step} (restart of this run: its {newest} "
                                        f"checkpoint {uri}{broken})", None, old or new)  # a run of before #21: new
    if args.resume_from:
        if is_checkpoint_path(args.resume_from):
            uri = args.resume_from.rstrip("/")
            if not uri.startswith("gs://"):
                uri = str(Path(uri).resolve())
            step = checkpoint_step(uri)
            problem = checkpoint_problem(uri, storage_at(uri).emulator_host)
            if problem:
                raise UsageError(f"resume_from: checkpoint {uri} does not load ({problem}); name an intact one")
            broken = ""
        else:
            other = registered_checkpoints(root.child(f"{RUNS_DIR}/{args.resume_from}"))
            if not other:
                raise UsageError(f"resume_from={args.resume_from}: no checkpoint of that run under "
                                 f"{root.uri(RUNS_DIR, args.resume_from)}; runs there: {root.list_dir(RUNS_DIR)}")
            step, uri, broken = newest_intact(other, root.emulator_host, f"run {args.resume_from}")
        origin = run_definition.read(storage_at(uri.rsplit("/", 2)[0]))  # <run>/checkpoints/<checkpoint>
        differ = run_definition.changes(origin, new) if origin is not None else []
        new["continued_from"] = {"checkpoint": uri, "step": step, "changes": differ}
        settings = (f"; with new settings: {run_definition.changes_text(differ)}" if differ
                    else "; its run recorded no definition" if origin is None else "")
        return RunPlan(name, run, uri, f"resuming {name} from step {step} (--resume_from={args.resume_from}: "
                                       f"checkpoint {uri}{broken}{settings})", None, new)
    why = "" if named else " (no --run_name given: named from the UTC time)"
    if changed:  # an earlier attempt of this run that left no checkpoint: nothing of it is kept
        why = f" (its earlier attempt left no checkpoint; started again with new settings: " \
              f"{run_definition.changes_text(changed)})"
    return RunPlan(name, run, None, f"fresh run {name}{why}", None, new)


