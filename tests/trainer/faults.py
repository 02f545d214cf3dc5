"""Test-only fault injection for the trainer: a worker callback factory (vision_train.main(callbacks=…))
that kills one worker's process once, right after an optimizer step, to drill Ray's restart and resume."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from transformers import TrainerCallback


def marker(step: int) -> str:
    """The file in the run's directory that says the fault already fired."""
    return f".fault-injected-at-step-{step}"


class _KillOnce(TrainerCallback):
    def __init__(self, step: int, storage) -> None:
        self.step, self.storage = step, storage

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.storage.read_bytes(marker(self.step)) is None:
            self.storage.write_bytes(marker(self.step), str(os.getpid()).encode())
            print(f"[fault injection] killing worker pid {os.getpid()} after step {state.global_step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


@dataclass
class KillWorkerAfterStep:
    """The worker of rank 1 (rank 0 when alone) kills its own process once, after optimizer step `step`; a
    marker in the run's storage keeps it from firing again after Ray restarts the group."""

    step: int

    def __call__(self, ctx):
        return _KillOnce(self.step, ctx.storage) if ctx.rank == min(1, ctx.world_size - 1) else None


class _RemoveOnTrainBegin(TrainerCallback):
    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_begin(self, args, state, control, **kwargs):
        Path(self.path).unlink(missing_ok=True)


@dataclass
class RemoveFileOnTrainBegin:
    """Every worker deletes `path` (an image the scan accepted) before its first training step."""

    path: str

    def __call__(self, ctx):
        return _RemoveOnTrainBegin(self.path)


@dataclass
class RefuseOnRankOne:
    """A usage error on the worker of rank 1 only, while rank 0 goes on into the data scan's collective:
    the job must end with that one sentence, not wait forever for rank 1."""

    sentence: str

    def __call__(self, ctx):
        from trainer.job.flags import UsageError

        if ctx.rank == 1:
            raise UsageError(self.sentence)
        return None
