"""Which checkpoint a worker resumes from: the newest one that loads, older ones after a broken one.

Candidates, newest first: the run's newest checkpoint (Ray Train restores it on a restart), the run's
older registered checkpoints, then the checkpoint --resume_from named. Each is read in full (every file
the Trainer loads: trainer state, adapter, optimizer, scheduler, RNG states) before training starts; a
broken one is reported and skipped, so a restart never fails again on the same file.

Each worker reads a remote checkpoint from a copy of its own, in its scratch directory (``local_copy``),
never from Ray's ``Checkpoint.as_directory()``: that one download directory is shared by the processes
of a node, and a process that asks after the first download has finished downloads again into it,
rewriting the files another rank is reading. A restart of the 2-worker gs:// drill then found its good
step-2 checkpoint broken ("tokenizer.json: its sha256 differs from its manifest's") and stopped: seen in
1 of 3 runs here; two processes opening one checkpoint that way read a rewritten file in 13 of 15 opens.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.job import checkpoint_manifest
from trainer.job.flags import UsageError
from trainer.job.runs import TRAINER_STATE_FILE, run_checkpoints
from trainer.job.storage import Storage, filesystem


@dataclass
class Resume:
    """The checkpoint a worker resumes from (None: a fresh start) and the ones that did not load."""

    directory: str | None = None
    step: int | None = None
    uri: str | None = None
    broken: list[dict[str, str]] = field(default_factory=list)  # [{"checkpoint": uri, "problem": why}]


def load_problem(directory: Path) -> str | None:
    """Why the Trainer could not load this checkpoint directory, or None: its manifest verifies, and every file
    it reads is read."""
    import torch
    from safetensors import safe_open

    problem = checkpoint_manifest.local_problem(directory)  # every file there, with its size and sha256
    if problem:
        return problem
    if not (directory / TRAINER_STATE_FILE).is_file():
        return f"no {TRAINER_STATE_FILE}"
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        try:
            if path.suffix in (".pt", ".pth", ".bin"):
                torch.load(path, map_location="cpu", weights_only=False)
            elif path.suffix == ".safetensors":
                with safe_open(str(path), framework="pt") as tensors:
                    for key in tensors.keys():  # noqa: SIM118 - safe_open has no __iter__
                        tensors.get_tensor(key)
            elif path.suffix == ".json":
                json.loads(path.read_text())
        except Exception as e:  # noqa: BLE001 - whatever the loader would raise
            return f"{path.name}: {type(e).__name__}: {str(e)[:200]}"
    return None


def _candidates(config: dict[str, Any], storage: Storage) -> list[tuple[str, Any]]:
    """(uri, ray.train.Checkpoint), newest first."""
    import ray.train

    def at(uri: str):
        fs, path = filesystem(uri, storage.emulator_host)
        return ray.train.Checkpoint(path=path, filesystem=fs)

    out: list[tuple[str, Any]] = []
    newest = ray.train.get_checkpoint()
    seen: set[str] = set()
    if newest is not None:
        uri = storage.uri(*Path(newest.path).parts[-2:])  # checkpoints/checkpoint-NNNNNN under this run
        out.append((uri, newest))
        seen.add(uri)
    for _, uri in reversed(run_checkpoints(storage)[0]):  # the driver set an unusable snapshot aside
        if uri not in seen:
            out.append((uri, at(uri)))
            seen.add(uri)
    if config.get("resume_checkpoint") and not out:
        out.append((config["resume_checkpoint"], at(config["resume_checkpoint"])))
    return out


@contextlib.contextmanager
def local_copy(checkpoint, scratch: Path) -> Iterator[Path]:
    """A ray.train.Checkpoint as a local directory that only this process reads and writes: the directory
    itself when it is local, else a download of its own under `scratch`, removed on exit."""
    import pyarrow.fs as pafs

    if isinstance(checkpoint.filesystem, pafs.LocalFileSystem):
        yield Path(checkpoint.path)
        return
    scratch.mkdir(parents=True, exist_ok=True)
    target = Path(tempfile.mkdtemp(prefix="resume-", dir=scratch))
    try:
        checkpoint.to_directory(str(target))
        yield target
    finally:
        shutil.rmtree(target, ignore_errors=True)


def choose_checkpoint(config: dict[str, Any], storage: Storage, stack: contextlib.ExitStack, rank: int,
                      scratch: Path) -> Resume:
    """The newest candidate that loads, kept as a local directory (under this worker's `scratch` when it is
    remote) until `stack` closes."""
    resume = Resume()
    for uri, checkpoint in _candidates(config, storage):
        attempt = contextlib.ExitStack()
        directory = attempt.enter_context(local_copy(checkpoint, scratch))
        problem = load_problem(directory)
        if problem is None:
            stack.push(attempt.pop_all())
            resume.directory, resume.uri = str(directory), uri
            resume.step = checkpoint_manifest.state_step((directory / TRAINER_STATE_FILE).read_bytes())  # verified
            break
        attempt.close()
        resume.broken.append({"checkpoint": uri, "problem": problem})
        if rank == 0:
            print(f"[resume] checkpoint {uri} does not load ({problem}); trying the next older one", flush=True)
    if rank == 0 and resume.uri:
        newer = "".join(f"; not from {b['checkpoint']}: it does not load" for b in resume.broken)
        print(f"[resume] resuming from {resume.uri} at step {resume.step}{newer}", flush=True)
    if resume.broken and resume.uri is None:
        tried = "; ".join(f"{b['checkpoint']}: {b['problem']}" for b in resume.broken)
        raise UsageError(f"no checkpoint of this run loads ({tried}); continue from a good one with "
                           "--resume_from=<checkpoint path> in a new run")
    return resume


def current_flags_callback():
    """A TrainerCallback: after a resume, this job's flags win over what the checkpoint saved. The Trainer
    restores the checkpoint's logging/eval/save cadence (TrainerState) and its learning rate (the optimizer's
    param groups and the constant schedule's base_lrs): a restart that changed the cadence, or a
    continuation (--resume_from) with another learning_rate, would otherwise keep the old values."""
    from transformers import TrainerCallback

    class CurrentFlags(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            state.compute_steps(args, state.max_steps)
            if optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = group["initial_lr"] = args.learning_rate
            schedule = getattr(lr_scheduler, "scheduler", lr_scheduler)
            if schedule is not None and hasattr(schedule, "base_lrs"):
                schedule.base_lrs = [args.learning_rate] * len(schedule.base_lrs)

    return CurrentFlags()
