"""The elastic batch split: the same global batch on every worker count, the recipe's micro-batch as an
upper bound, a clear error where no even split exists; and the Ray worker range."""

from __future__ import annotations

import pytest

from trainer.job import elastic


@pytest.mark.parametrize("world", [1, 2, 4, 8, 16, 32, 64])
def test_the_global_batch_is_the_same_on_every_worker_count(world: int) -> None:
    shape = elastic.split_batch(64, 12, world)
    assert shape.micro_batch * shape.accumulation * world == shape.global_batch == 64
    assert shape.micro_batch <= 12


def test_fewer_workers_accumulate_more() -> None:
    assert elastic.split_batch(4, 1, 2) == elastic.BatchShape(4, 1, 2)
    assert elastic.split_batch(4, 1, 1) == elastic.BatchShape(4, 1, 4)
    assert elastic.split_batch(64, 12, 16) == elastic.BatchShape(64, 4, 1)  # the share (4) caps the micro-batch
    assert elastic.split_batch(64, 12, 1) == elastic.BatchShape(64, 8, 8)  # the largest divisor of 64 up to 12
    assert elastic.split_batch(96, 12, 4) == elastic.BatchShape(96, 12, 2)


def test_an_uneven_split_names_the_fix() -> None:
    with pytest.raises(elastic.BatchSplitError, match="global_batch_size=64 does not split over 12 workers"):
        elastic.split_batch(64, 4, 12)


def test_ray_worker_range() -> None:
    assert elastic.ray_num_workers(16, None) == 16
    assert elastic.ray_num_workers(16, 8) == (8, 16)
    assert elastic.ray_num_workers(16, 16) == 16
