"""Elastic training: the range of worker counts Ray Train may use, and the per-worker batch that keeps
the global batch (and so the optimizer steps and the data order) on whatever count a (re)start gets."""

from __future__ import annotations


class BatchSplitError(ValueError):
    """The global batch cannot be split evenly over the workers Ray Train started."""


def ray_num_workers(num_workers: int, min_workers: int | None) -> int | tuple[int, int]:
    """`ScalingConfig(num_workers=…)`: fixed, or the elastic `(min_workers, num_workers)` range."""
    if min_workers is None or min_workers >= num_workers:
        return num_workers
    return (min_workers, num_workers)


def split_batch(global_batch: int, micro_batch: int, world_size: int) -> tuple[int, int]:
    """(micro-batch, accumulation steps) with micro-batch × accumulation × world_size == global_batch:
    the largest micro-batch up to `micro_batch` that divides this worker's share."""
    if global_batch % world_size:
        raise BatchSplitError(
            f"global batch {global_batch} does not split over {world_size} workers; choose a global batch "
            f"divisible by every worker count the job can run on (whole nodes between min_workers and num_workers)"
        )
    share = global_batch // world_size
    micro = next(m for m in range(min(micro_batch, share), 0, -1) if share % m == 0)
    return micro, share // micro
