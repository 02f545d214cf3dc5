"""Test-only worker callbacks the elastic drill registers (callback factories for vision_train.main):
record the sample ids of every optimizer step per rank, and hold the rank of one node after a step until
the drill has changed the cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# No transformers here: see tests/trainer/worker_callbacks.py, where the callbacks themselves live.


@dataclass
class RecordSamples:
    """Factory: every worker records its micro-batches' sample ids (see worker_callbacks.SampleRecorder)."""

    out_dir: str
    id_pattern: str

    def __call__(self, ctx: Any = None) -> Any:
        from tests.trainer.worker_callbacks import SampleRecorder

        return SampleRecorder(self.out_dir, self.id_pattern)


@dataclass
class HoldOnNode:
    """Factory: the worker on node `node_id` holds after step `at_step`, once (see worker_callbacks.HoldAfterStep)."""

    node_id: str
    at_step: int
    marker: str

    def __call__(self, ctx: Any) -> Any:
        from tests.trainer.worker_callbacks import HoldAfterStep

        return HoldAfterStep(self.node_id, self.at_step, self.marker, ctx.storage)
