"""The stream's record counts what was trained (trainer/data/streaming.py `StreamingBatches`): each rank's rows as a
multiset (a row trained twice within a rank, across ranks or across a resume is counted, never hidden by a set), the
steps each rank took, the rows the epoch left out by id (the equal split's and each rank's remainder: every row of
the epoch neither trained nor skipped as bad), and `epochs` as trained, not the plan's ~1.0.

Real Ray Data on the local Ray cluster (`ray.data.from_items` split by `streaming_split(equal=True)`, as the run
splits its epoch); ranks as threads (tests/trainer/thread_group.py) with a real barrier for the collectives. The
rows are bare row ids: the CPU stage and the model are not what is counted here."""

from __future__ import annotations

import itertools

from tests.trainer.thread_group import ThreadGroup
from trainer.data import stream_plan, streaming
from trainer.job.shard_manifest import Shard, ShardSet


def plan(rows: int, global_batch: int, epochs: int | None = 1) -> stream_plan.StreamPlan:
    shards = ShardSet("mem://d", "parquet", rows, {}, "image", "", (Shard("s.parquet", "mem://d/s.parquet", rows, 0,
                                                                        1, "", ""),))
    return stream_plan.StreamPlan(shards, 0, global_batch, 0, 0, epochs)


def rows_dataset(ids: list[int]):
    """A make_dataset of the epoch's rows `ids` (in this order, duplicates kept); ignores what it is told to leave
    out (a resume whose exclusion failed: the record must see it)."""
    import ray.data

    def make(epoch: int, exclude: set[int]):
        return ray.data.from_items([{"_row": i} for i in ids], override_num_blocks=1)

    return make


def run(world: int, p, make, micro: int, accumulation: int, state=None, limit=None, skipped=None):
    """Every rank's StreamingBatches, each taken to its end (or `limit` micro-batches), then closed; the ranks' rows
    in the order each yielded them."""
    import ray.data

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    group = ThreadGroup(world, timeout=120)
    slots: dict[int, object] = {}

    def gather(rank):
        def g(value):
            group.barrier.wait()
            slots[rank] = value
            group.barrier.wait()
            out = [slots[r] for r in range(world)]
            group.barrier.wait()
            return out
        return g

    everyone: list = [None] * world
    seen: list[list[int]] = [[] for _ in range(world)]

    def rank_main(rank: int) -> None:
        b = streaming.StreamingBatches(p, make, lambda t: t.column("_row").to_pylist(), rank, world, micro,
                                       accumulation, state or stream_plan.StreamState(),
                                       lambda v: group.broadcast(rank, v), gather(rank),
                                       skipped=skipped or (lambda epoch: set()))
        for batch in itertools.islice(b, limit):
            seen[rank] += batch
        b.close()
        everyone[rank] = b

    group.run(rank_main, join_timeout=300)
    return everyone, seen


def test_a_row_trained_twice_within_a_rank_is_counted_by_id(ray_cluster) -> None:
    (b,), (seen,) = run(1, plan(6, 2), rows_dataset([0, 1, 2, 3, 4, 5, 2, 4]), 2, 1)
    assert sorted(seen) == [0, 1, 2, 2, 3, 4, 4, 5]
    (epoch,) = b.epochs
    assert (epoch["rows_trained"], epoch["rows_trained_twice"], epoch["rows_trained_twice_ids"]) == (6, 2, [2, 4])
    assert epoch["steps"] == 4 and epoch["ranks"] == [{"rank": 0, "steps": 4, "rows": 8}]
    assert epoch["rows_left_out"] == 0 and epoch["rows_left_out_ids"] == []


def test_a_row_trained_again_after_a_resume_is_counted(ray_cluster) -> None:
    """The checkpoint's state had trained rows 0 and 1 (one step); the resumed stream gets them again."""
    resumed = stream_plan.StreamState.from_json(stream_plan.StreamState(0, 0).to_json({0, 1}, 6, 1))
    (b,), _ = run(1, plan(6, 2), rows_dataset([0, 1, 2, 3, 4, 5]), 2, 1, state=resumed)
    (epoch,) = b.epochs
    assert (epoch["rows_trained"], epoch["rows_trained_twice"], epoch["rows_trained_twice_ids"]) == (6, 2, [0, 1])
    assert epoch["steps"] == 1 + 3 and epoch["resumed_with_rows"] == 2 and epoch["resumed_with_steps"] == 1


def test_twice_trained_rows_survive_the_checkpoint() -> None:
    from collections import Counter

    state = stream_plan.StreamState(0, 0)
    raw = state.to_json({0, 1, 2}, 6, 2, twice=Counter({1: 1}))
    back = stream_plan.StreamState.from_json(raw)
    assert back.rows == {0, 1, 2} and back.twice == Counter({1: 1}) and back.resumed_steps == 2


def test_the_rows_an_epoch_leaves_out_are_recorded_by_id(ray_cluster) -> None:
    """World 1: the 7th row does not fill a step of 2 and is left out; world 2: the equal split drops a row of 9 and
    each rank's remainder of 4 rows in steps of 2 is none: one row left out, the one neither rank trained. A row
    skipped as bad is not left out."""
    (b,), (seen,) = run(1, plan(7, 2), rows_dataset(list(range(7))), 2, 1)
    (epoch,) = b.epochs
    assert seen == [0, 1, 2, 3, 4, 5] and epoch["rows_left_out_ids"] == [6] and epoch["rows_left_out"] == 1

    everyone, seen = run(2, plan(10, 4), rows_dataset(list(range(9))), 2, 1, skipped=lambda epoch: {9})
    trained = set(seen[0]) | set(seen[1])
    assert len(trained) == 8 and not set(seen[0]) & set(seen[1])
    epoch = everyone[0].epochs[0]
    assert epoch["rows_left_out_ids"] == sorted(set(range(9)) - trained) and epoch["rows_left_out"] == 1
    assert epoch["ranks"] == [{"rank": 0, "steps": 2, "rows": 4}, {"rank": 1, "steps": 2, "rows": 4}]
    assert epoch["steps"] == 2 and epoch["rows_trained"] == 8 and epoch["rows_trained_twice"] == 0


def test_max_steps_at_an_epochs_last_step_leaves_the_epoch_whole(ray_cluster) -> None:
    """The Trainer stops pulling at max_steps, so the stream never passes the epoch's last yield (`limit` here): an
    epoch whose every step was taken is whole, its rows left out recorded by id (fewer than one step takes); one
    stopped a step earlier is cut short. World 2: the equal split's dropped row is the one left out."""
    (b,), _ = run(1, plan(9, 2), rows_dataset(list(range(9))), 2, 1, limit=4)
    (epoch,) = b.epochs
    assert "cut_short_by_max_steps" not in epoch and epoch["steps"] == 4
    assert epoch["rows_left_out"] == 1 and epoch["rows_left_out_ids"] == [8] and b.epochs_trained() == 1.0

    (b,), _ = run(1, plan(9, 2), rows_dataset(list(range(9))), 2, 1, limit=3)
    (epoch,) = b.epochs
    assert epoch["cut_short_by_max_steps"] and "rows_left_out" not in epoch and epoch["steps"] == 3

    everyone, seen = run(2, plan(9, 4), rows_dataset(list(range(9))), 2, 1, limit=2)
    epoch = everyone[0].epochs[0]
    assert "cut_short_by_max_steps" not in epoch and epoch["rows_trained"] == 8
    assert epoch["rows_left_out_ids"] == sorted(set(range(9)) - set(seen[0]) - set(seen[1]))


def test_epochs_in_the_record_are_the_epochs_trained(ray_cluster) -> None:
    """max_steps: 6 steps of 2 over 8 rows: one whole epoch and half the next, 1.5 (not the Trainer's ~1.0)."""
    (b,), _ = run(1, plan(8, 2, epochs=None), rows_dataset(list(range(8))), 2, 1, limit=6)
    first, second = b.epochs
    assert first["steps"] == 4 and second["steps"] == 2 and second["cut_short_by_max_steps"]
    assert b.epochs_trained() == 1.5
    from trainer.job.arguments import parse_args

    args = parse_args(["--use_gpu=false", "--eval_fraction=0", "--max_steps=6", "--global_batch_size=2"])
    section = streaming.summary_section(b.plan, b, args, 0)
    assert section["epochs_trained"] == 1.5 and section["planned"]["steps_per_epoch"] == 4
    # the summary's per-epoch figures: the whole epoch's, as trained (summary.json's `epochs` is epochs_trained)
    assert streaming.observed_epoch(section) == {"rows_per_epoch": 8, "rows_left_out_per_epoch": 0,
                                                 "steps_per_epoch": 4}
    assert streaming.observed_epoch({"epochs": [second]}) == dict.fromkeys(
        ("rows_per_epoch", "rows_left_out_per_epoch", "steps_per_epoch"))
