"""Test-only fault injection for the trainer: a worker callback factory (vision_train.main(callbacks=…))
that kills one worker's process once, right after an optimizer step, to drill Ray's restart and resume."""

from __future__ import annotations

from dataclasses import dataclass

# No transformers here: see tests/trainer/worker_callbacks.py, where the callbacks themselves live.


def marker(step: int) -> str:
    """The file in the run's directory that says the fault already fired."""
    return f".fault-injected-at-step-{step}"


@dataclass
class KillWorkerAfterStep:
    """The worker of rank 1 (rank 0 when alone) kills its own process once, after optimizer step `step`; a
    marker in the run's storage keeps it from firing again after Ray restarts the group."""

    step: int

    def __call__(self, ctx):
        from tests.trainer.worker_callbacks import KillOnce

        return KillOnce(self.step, ctx.storage) if ctx.rank == min(1, ctx.world_size - 1) else None


@dataclass
class RemoveFileOnTrainBegin:
    """Every worker deletes `path` (an image the scan accepted) before its first training step."""

    path: str

    def __call__(self, ctx):
        from tests.trainer.worker_callbacks import RemoveOnTrainBegin

        return RemoveOnTrainBegin(self.path)


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
