"""The global batch on every worker count a run may take: the exact per-worker split (micro-batch x
accumulation x workers == global batch) or a refusal naming the nearest valid values; and the worker
range for Ray Train (`min_workers`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainer.job.flags import UsageError


class BatchSplitError(UsageError):
    """The global batch cannot be split exactly over a worker count the run may take."""


@dataclass(frozen=True)
class BatchShape:
    """How one optimizer step's samples are split: workers x micro-batch x accumulation = global batch."""

    global_batch: int
    micro_batch: int
    accumulation: int


def ray_num_workers(num_workers: int, min_workers: int | None) -> int | tuple[int, int]:
    """`ScalingConfig(num_workers=…)`: fixed, or the elastic `(min_workers, num_workers)` range."""
    if min_workers is None or min_workers >= num_workers:
        return num_workers
    return (min_workers, num_workers)


def worker_counts(num_workers: int, min_workers: int | None) -> list[int]:
    """Every worker count the run may take: num_workers, or each count from min_workers to num_workers."""
    low = num_workers if min_workers is None else min(min_workers, num_workers)
    return list(range(low, num_workers + 1))


def _divisor_up_to(n: int, cap: int) -> int:
    return next(m for m in range(min(cap, n), 0, -1) if n % m == 0)


def split_batch(global_batch: int, micro_cap: int, world_size: int) -> BatchShape:
    """The exact split on `world_size` workers: each worker's share is global_batch / world_size, its
    micro-batch the share's largest divisor up to `micro_cap`, the accumulation the rest. Raises
    BatchSplitError when the workers do not divide the global batch."""
    if global_batch % world_size:
        raise BatchSplitError(f"global_batch_size={global_batch} does not split over {world_size} workers")
    share = global_batch // world_size
    micro = _divisor_up_to(share, micro_cap)
    return BatchShape(global_batch, micro, share // micro)


def nearest_batches(global_batch: int, counts: list[int]) -> list[int]:
    """The nearest global batch sizes below and above `global_batch` that every count in `counts` divides."""
    step = math.lcm(*counts)
    below, above = global_batch // step * step, -(-global_batch // step) * step
    return [b for b in (below, above) if b > 0 and b != global_batch] or [step]


def run_shapes(global_batch: int, micro_cap: int, num_workers: int, min_workers: int | None) -> dict[int, BatchShape]:
    """{worker count: its exact split} for every worker count the run may take, checked at the start.
    Raises BatchSplitError with one sentence naming the counts that do not divide and the nearest fixes."""
    counts = worker_counts(num_workers, min_workers)
    bad = [w for w in counts if global_batch % w]
    if bad:
        fixes = " or ".join(f"--global_batch_size={b}" for b in nearest_batches(global_batch, counts))
        if len(counts) == 1:
            near = [w for w in range(num_workers - 1, 0, -1) if global_batch % w == 0][:1] + \
                [w for w in range(num_workers + 1, global_batch + 1) if global_batch % w == 0][:1]
            also = f", or --num_workers={' or '.join(map(str, near))}" if near else ""
            where = f"{num_workers} workers"
        else:
            also = ""
            where = f"{', '.join(map(str, bad))} of the worker counts {counts[0]}..{counts[-1]} (min_workers..num_workers)"
        raise BatchSplitError(f"global_batch_size={global_batch} does not split exactly over {where} "
                              f"(micro-batch x accumulation x workers must equal it): use {fixes}{also}")
    return {w: split_batch(global_batch, micro_cap, w) for w in counts}


def describe(shape: BatchShape, world_size: int, micro_cap: int) -> str:
    """One log line: how an optimizer step's samples are split, and why the micro-batch is below its cap
    when it has to be (the share has no larger divisor up to the cap)."""
    line = (f"[batch] global batch {shape.global_batch} = {world_size} workers x micro-batch {shape.micro_batch} "
            f"x {shape.accumulation} accumulation")
    share = shape.global_batch // world_size
    target = min(micro_cap, share)
    if shape.micro_batch < target:
        per = world_size * micro_cap
        fixes = [b for b in (share // micro_cap * per, (share // micro_cap + 1) * per) if b > 0]
        line += (f" (micro-batch {shape.micro_batch}, not {target}: {share} samples per worker have no divisor "
                 f"between {shape.micro_batch + 1} and {target}; global_batch_size={' or '.join(map(str, fixes))} "
                 f"would run micro-batches of {micro_cap})")
    return line
