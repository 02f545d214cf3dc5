"""Test-only worker callback factories (vision_train.main(callbacks=…)) that look, not touch: what a Ray Train
worker's process has imported when its training begins."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# No transformers here: see tests/trainer/worker_callbacks.py, where the callbacks themselves live.


@dataclass
class RecordLoadedModules:
    """Every worker writes, at the start of training, which of `names` its process has loaded, one JSON file per
    worker process in `out_dir`."""

    out_dir: str
    names: tuple[str, ...]

    def __call__(self, ctx):
        from tests.trainer.worker_callbacks import ModulesAtTrainBegin

        return ModulesAtTrainBegin(self.out_dir, ctx.rank, self.names)


def loaded_modules(out_dir: Path) -> list[dict]:
    """What RecordLoadedModules wrote: one {"rank", "loaded"} per worker process."""
    return [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank-*.json"))]
