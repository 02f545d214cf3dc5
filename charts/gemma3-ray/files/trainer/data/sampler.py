"""The training rows' order: each epoch a permutation seeded by the seed and the epoch, cut to whole global
batches (the counting, and its checks on the head, are trainer.job.epochs). Imported by the workers only (torch).
"""

from __future__ import annotations

from typing import Any


class WholeBatchSampler:
    """The training rows' order for one epoch: `torch.randperm(rows)` seeded by seed + epoch, cut to whole
    global batches. `set_epoch` is called by the Trainer (and accelerate) at each epoch."""

    def __init__(self, rows: int, global_batch: int, seed: int):
        self.rows, self.global_batch, self.seed, self.epoch = rows, global_batch, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.rows // self.global_batch * self.global_batch

    def __iter__(self):
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.rows, generator=generator)[: len(self)].tolist()


def whole_batches(trainer_cls: Any, global_batch: int) -> Any:
    """`trainer_cls` (a transformers Trainer) whose training rows come from a WholeBatchSampler."""

    class WholeBatches(trainer_cls):
        def _get_train_sampler(self, train_dataset=None):
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            return WholeBatchSampler(len(dataset), global_batch, self.args.data_seed or self.args.seed)

    WholeBatches.__name__ = WholeBatches.__qualname__ = f"WholeBatches{trainer_cls.__name__}"
    return WholeBatches
