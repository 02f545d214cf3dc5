"""The streaming input path (`--streaming=true`): the rows come from shards in the bucket through Ray Data, never
copied to a node whole.

- **Read**: a Ray Data task per shard reads the manifest's parquet (or WebDataset .tar) shards under the dataset's
  gs:// prefix, each checked against the manifest's sha256 (``trainer.job.shard_read``).
- **CPU stages** (`RowStage`, Ray Data actors with one CPU each, on the training workers' nodes only, whose
  image has the trainer's packages: the GPU nodes' spare cores; a node needs `streaming_decoders` CPUs free
  beyond its training workers'): each row is checked as the scan checks it (the same reasons: missing or
  corrupt image, too large, image markers in a text, empty answer or prompt field, too long), bad rows are
  dropped and recorded with their row ids (`streaming/skipped/` in the run), good rows are tokenised and their
  image decoded and processed into pixel values; only those travel on.
- **One `streaming_split` per GPU worker** (`equal=True`: every worker gets as many rows), built by rank 0 for
  each epoch and handed to every rank. Each worker takes whole optimizer steps of rows (micro-batch ×
  accumulation), so every step trains exactly the global batch, on every worker count; a worker's last rows
  that do not fill a step are left out of that epoch (counted).
- **Shuffle**: each epoch, the shards' order is a permutation seeded by `seed` and the epoch, and each worker
  draws its rows through a shuffle window of `streaming_shuffle_window` rows (Ray Data's local shuffle buffer,
  seeded by `seed`, the epoch and the rank); 0 keeps the manifest's order (no shuffle).
- **Every row once per epoch**: each row of the epoch is trained at most once; the rows trained so far in the
  epoch are saved with every checkpoint (`stream_state.json`: a bitmap of row ids, and the rows trained more than
  once). **The record** counts what was trained, not what was planned (``RECORD_RULE``): each rank's rows as a
  multiset, its steps, the rows an epoch left out by id; the eval split a bounded sample (``EVAL_SAMPLE_ROWS``). **Resume**: the
  interrupted epoch goes on without the rows it already trained (none is seen twice, none left out for it);
  the order of the rest differs from an uninterrupted run (Ray Data's split is not replayable across worker
  group starts). The rule is in `summary.json` (`streaming.resume_rule`).
- **Data wait**: the time each step waits for its rows, logged (`data_wait_s`) and summed in `summary.json`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainer.data.stream_plan import RESUME_RULE, STATE_FILE, StreamPlan, StreamState, plan_stream
from trainer.data.stream_rows import canonical_row, check_row, configure_data_context, epoch_dataset
from trainer.job.flags import TrainArguments
from trainer.job.shard_manifest import ROW_ID

# ----------------------------------------------------------------------------------------------
# The worker side: the Trainer's train dataloader.
# ----------------------------------------------------------------------------------------------

class StreamingBatches:
    """The micro-batches of this rank, epoch after epoch: a group of `accumulation` micro-batches per optimizer
    step, from this rank's streaming_split of the epoch (rank 0 splits, every rank takes its part). What it yields
    is counted as it goes: this rank's rows as a multiset (a row yielded twice is counted twice), its steps, and
    the rows of a last group too small for a step (left out, by id)."""

    def __init__(self, plan: StreamPlan, make_dataset, collate, rank: int, world_size: int, micro_batch: int,
                 accumulation: int, state: StreamState, broadcast, gather, start_step: int = 0,
                 no_step=lambda record: None, skipped=lambda epoch: set()):
        self.plan, self.make_dataset, self.collate, self.start_step = plan, make_dataset, collate, start_step
        self.rank, self.world_size, self.micro, self.accumulation = rank, world_size, micro_batch, accumulation
        self.state, self.broadcast, self.gather, self.no_step = state, broadcast, gather, no_step
        self.skipped = skipped  # epoch -> the row ids the CPU stage skipped as bad in it (rank 0 reads them)
        self.waits: list[float] = []  # seconds each step waited for its rows
        self.epochs: list[dict[str, Any]] = []  # per finished epoch: what was trained (epoch_record)
        self.steps_done = 0  # optimizer steps whose rows were handed out, since this start
        self.counts: Counter = Counter()  # this rank's rows of the epoch since this start, each as often as yielded
        self.epoch_steps = 0  # this rank's steps of the epoch since this start

    def _split(self, epoch: int):
        iterators = None
        if self.rank == 0:
            iterators = self.make_dataset(epoch, self.state.rows if epoch == self.state.epoch else set()) \
                .streaming_split(self.world_size, equal=True)
        return self.broadcast(iterators)[self.rank]

    def __iter__(self):
        if getattr(self, "done", False):  # the Trainer asks again after the last epoch: nothing more
            return
        group_rows = self.micro * self.accumulation
        import itertools

        epochs = itertools.count(self.state.epoch) if self.plan.epochs is None else \
            range(self.state.epoch, self.plan.epochs)
        for epoch in epochs:
            if epoch != self.state.epoch:
                self.state = StreamState(epoch, self.start_step + self.steps_done)
            self.counts, self.epoch_steps, self.epoch_open = Counter(), 0, True
            split = self._split(epoch)
            shuffle = {"local_shuffle_buffer_size": self.plan.window,
                       "local_shuffle_seed": self.plan.seed * 7919 + epoch * 104729 + self.rank} if self.plan.window else {}
            # drop_last off: a last group too small for a step is seen, counted as left out, and not trained
            batches = iter(split.iter_batches(batch_size=group_rows, drop_last=False, batch_format="pyarrow",
                                              prefetch_batches=2, **shuffle))
            while True:
                start = time.perf_counter()
                group = next(batches, None)
                if group is None or group.num_rows < group_rows:
                    break
                self.waits.append(time.perf_counter() - start)
                self.counts.update(group.column(ROW_ID).to_pylist())
                self.steps_done += 1
                self.epoch_steps += 1
                for j in range(self.accumulation):
                    yield self.collate(group.slice(j * self.micro, self.micro))
            self.epochs.append(self.epoch_record(whole=True))
            self.epoch_open = False
            if self.epochs[-1]["steps"] == 0:  # every rank: the record is the group's
                self.no_step(self.epochs[-1])
        self.done = True

    def epoch_progress(self) -> float:
        """The stream's epoch as a number (for the train logs, no collective): the epoch, plus the share of its
        rows trained so far (this rank's count times the ranks, over the plan's rows of an epoch)."""
        per_epoch = max(self.plan.steps_per_epoch() * self.plan.global_batch, 1)
        done = self.state.resumed_rows + sum(self.counts.values()) * self.world_size
        return round(self.state.epoch + min(1.0, done / per_epoch), 4)

    def epochs_trained(self) -> float:
        """The epochs this run trained, as trained: the epochs before this start's first, each whole epoch of this
        start, and an epoch max_steps cut short as its rows over the last whole epoch's rows (the plan's rows of an
        epoch when none was whole)."""
        first = self.epochs[0]["epoch"] if self.epochs else self.state.epoch
        whole = [e for e in self.epochs if not e.get("cut_short_by_max_steps")]
        cut = [e for e in self.epochs if e.get("cut_short_by_max_steps")]
        per_epoch = whole[-1]["rows_trained"] if whole else self.plan.steps_per_epoch() * self.plan.global_batch
        part = cut[0]["rows_trained"] / per_epoch if cut and per_epoch else 0.0
        return round(first + len(whole) + part, 4)

    def close(self) -> None:
        """At the end of training (every rank): the record of the epoch max_steps ended. The Trainer stops pulling at
        max_steps, so the stream never passes the epoch's last yield: the epoch is whole when fewer rows than one step
        takes are left neither trained nor skipped (no further step could form; a whole epoch always leaves fewer),
        else cut short. Rank 0 decides (it reads the skipped rows); the other ranks' records are not reported."""
        if getattr(self, "epoch_open", False):
            record = self.epoch_record(whole=True)
            left = record.get("rows_left_out")
            if left is None or left >= self.plan.global_batch:
                record = {k: v for k, v in record.items() if k not in ("rows_left_out", "rows_left_out_ids")}
                record["cut_short_by_max_steps"] = True
            self.epochs.append(record)
            self.epoch_open = False

    def tally(self) -> tuple[Counter, list[tuple[int, int]]]:
        """(every row of the epoch with the times it was trained, across the ranks and the checkpoint it resumed
        from; [(steps, rows)] of each rank since this start): a collective, every rank calls it at the same point."""
        everyone = self.gather((sorted(self.counts.elements()), self.epoch_steps))
        merged = Counter(self.state.rows) + self.state.twice
        for rows, _ in everyone:
            merged.update(rows)
        return merged, [(steps, len(rows)) for rows, steps in everyone]

    def epoch_record(self, whole: bool) -> dict[str, Any]:
        """The epoch as trained (a collective): rows trained once or more, those trained twice by id, the steps
        (the checkpoint's and this start's), each rank's steps and rows, and for a `whole` epoch the rows it left
        out by id (every row of its training split neither trained nor skipped as bad: the equal split's drop and
        each rank's last rows that fill no step; rank 0 reads the skipped rows, the others record None)."""
        merged, ranks = self.tally()
        twice = sorted(r for r, n in merged.items() if n > 1)
        record = {"epoch": self.state.epoch, "rows_trained": len(merged),
                  "rows_trained_twice": sum(n - 1 for n in merged.values()), "rows_trained_twice_ids": twice[:ID_LIMIT],
                  "steps": self.state.resumed_steps + max(steps for steps, _ in ranks),
                  "ranks": [{"rank": r, "steps": steps, "rows": rows} for r, (steps, rows) in enumerate(ranks)],
                  "resumed_with_rows": self.state.resumed_rows, "resumed_with_steps": self.state.resumed_steps}
        if whole:
            left = left_out(self.plan.train_rows, merged, self.skipped(self.state.epoch)) if self.rank == 0 else None
            record["rows_left_out"] = None if left is None else len(left)
            record["rows_left_out_ids"] = None if left is None else left[:ID_LIMIT]
        return record


ID_LIMIT = 1000  # row ids listed per kind in an epoch's record (the counts are whole)


def left_out(train_rows: int, trained: Counter, skipped: set[int]) -> list[int]:
    """The training split's row ids neither trained nor skipped (a bitmap: bounded for millions of rows)."""
    import numpy as np

    seen = np.zeros(train_rows, dtype=bool)
    for ids in (list(trained), list(skipped)):
        ids = np.asarray([i for i in ids if 0 <= i < train_rows], dtype=np.int64)
        seen[ids] = True
    return np.flatnonzero(~seen).tolist()


def collate_group(encoder, use_gpu: bool):
    """A micro-batch (pyarrow rows of the stage's output) as the Trainer's inputs: the file path's padding
    (SampleEncoder.batch) with the pixel values the CPU stage made."""
    import numpy as np

    def collate(table) -> dict[str, Any]:
        ids = table.column("input_ids").to_pylist()
        labels = table.column("labels").to_pylist()
        shapes = table.column("pixel_shape").to_pylist()
        pixels = np.stack([np.frombuffer(b, dtype=np.float32).reshape(s) for b, s in
                           zip(table.column("pixel_values").to_pylist(), shapes, strict=True)])
        return encoder.batch(list(zip(ids, labels, strict=True)), None, pixel_values=pixels)

    return collate


def stream_callback(batches: StreamingBatches, total_rows: int, rank: int):
    """The Trainer callback of the streaming path: `data_wait_s` (the mean wait of a step for its rows since the
    last log) in each train log, and `stream_state.json` (the epoch's trained rows of every rank) in each
    checkpoint. Put it before the run's reporter: the reporter records the log and uploads the checkpoint."""
    from pathlib import Path

    from transformers import TrainerCallback

    class StreamCallback(TrainerCallback):
        logged = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            waits = batches.waits[self.logged:]
            self.logged = len(batches.waits)
            if logs is not None and "loss" in logs and waits:
                logs["data_wait_s"] = sum(waits) / len(waits)
            if logs is not None and "epoch" in logs:  # the Trainer's epoch counts max_steps, not the stream's epochs
                logs["epoch"] = batches.epoch_progress()

        def on_save(self, args, state, control, **kwargs):
            merged, _ = batches.tally()  # every rank: a collective
            if rank == 0:
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    twice = Counter({r: n - 1 for r, n in merged.items() if n > 1})
                    (ckpt / STATE_FILE).write_bytes(batches.state.to_json(set(merged), total_rows, state.global_step,
                                                                          twice))

    return StreamCallback()


def read_eval_rows(plan: StreamPlan, mapping: dict[str, str], storage, encoder, max_seq_length: int):
    """(the eval sample's good rows as the job's fields with their row ids, {row: reason} of the bad ones read): the
    first EVAL_SAMPLE_ROWS good rows of the held-out split (the last `eval_rows` rows of the manifest), read from
    the shards that hold them, in order, none past the one that fills the sample (each checked against the
    manifest's sha256; no Ray Data). A shard gone, changed or forbidden is one sentence (UsageError)."""
    from trainer.job.flags import UsageError
    from trainer.job.shard_manifest import ManifestError
    from trainer.job.shard_read import shard_bytes, shard_table

    good, bad = [], {}
    columns = sorted({*mapping.values(), ROW_ID})
    for shard in plan.eval_shards():
        if len(good) >= EVAL_SAMPLE_ROWS:
            break
        try:
            data = shard_bytes(shard, plan.shards.root, storage.emulator_host)
        except ManifestError as e:
            raise UsageError(f"the eval split: {e}") from None
        for raw in shard_table(data, plan.shards.shard_format, columns).to_pylist():
            row = canonical_row(raw, mapping, plan.shards.shard_format, plan.shards.image_column)
            if row[ROW_ID] < plan.first_eval_row:
                continue
            problem, _ = check_row(row, encoder, max_seq_length)
            if problem:
                bad[row[ROW_ID]] = problem
            elif len(good) < EVAL_SAMPLE_ROWS:
                good.append(row)
    return sorted(good, key=lambda r: r[ROW_ID]), bad


# Every worker holds the eval sample in memory (the Trainer's evaluation shards it across the ranks): at most this
# many rows, whatever eval_fraction holds out of a large dataset.
EVAL_SAMPLE_ROWS = 512


def eval_rule(plan: StreamPlan, args: TrainArguments, sampled: int) -> str:
    return (f"the last {plan.eval_rows} rows of the manifest's order are held out (eval_fraction {args.eval_fraction}); "
            f"the eval loss is over the first good ones of them, at most {EVAL_SAMPLE_ROWS} ({sampled} here), which "
            "each worker reads once and holds in memory")


@dataclass
class StreamSetup:
    """What a worker's streaming path needs beyond the flags: the checked shards (the driver's), the run's files
    (bad rows are recorded there), this worker's place in the group and the group's collectives, and where a
    resume starts. Alone by default (tests, bench: one worker, no Ray Train)."""

    shards: dict[str, Any]  # shard_manifest.to_config
    storage: Any  # the run's Storage
    rank: int = 0
    world_size: int = 1
    broadcast: Any = staticmethod(lambda value: value)
    gather: Any = staticmethod(lambda value: [value])
    state: StreamState | None = None
    start_step: int = 0
    decoders: int = 1
    object_store_bytes: int | None = None
    node_ids: list[str] | None = None  # where the CPU stage may run (None: anywhere)


def prepare_stream(args: TrainArguments, processor, setup: StreamSetup, micro_batch: int, accumulation: int):
    """(the train micro-batches, the eval rows as a `datasets.Dataset` or None, the eval collator, the stats, the
    Trainer callback, the plan): the streaming path's counterpart of dataset.prepare_data, without a scan."""
    from trainer.data.dataset import Collator
    from trainer.data.encoding import SampleEncoder
    from trainer.job.flag_values import column_mapping
    from trainer.job.shard_manifest import from_config

    mapping = column_mapping(args)
    plan = plan_stream(args, from_config(setup.shards))
    encoder = SampleEncoder(processor, args)
    configure_data_context(setup.object_store_bytes)
    state = setup.state or StreamState()

    def make_dataset(epoch: int, exclude: set[int]):
        return epoch_dataset(plan, epoch, processor, args, mapping, setup.storage, exclude, setup.decoders,
                             setup.node_ids)

    def no_step(record: dict[str, Any]) -> None:  # an epoch whose good rows filled no step: the file path's stop
        from trainer.data.dataset import count_by_reason
        from trainer.data.stream_rows import skipped_rows
        from trainer.job.elastic import worker_counts
        from trainer.job.epochs import check_usable

        skipped = count_by_reason(skipped_rows(setup.storage))
        good = plan.train_rows - sum(skipped.values())
        check_usable(good, plan.global_batch, f"of {plan.shards.rows} rows, {sum(skipped.values())} skipped as they "
                     f"streamed, {plan.eval_rows} held out for eval", worker_counts(args.num_workers, args.min_workers),
                     args.dataset_name, skipped)

    def skipped_in(epoch: int) -> set[int]:
        from trainer.data.stream_rows import skipped_rows

        return {row for rows in skipped_rows(setup.storage, epoch).values() for row in rows}

    batches = StreamingBatches(plan, make_dataset, collate_group(encoder, args.use_gpu), setup.rank,
                               setup.world_size, micro_batch, accumulation, state, setup.broadcast, setup.gather,
                               setup.start_step, no_step, skipped_in)
    evaluation, eval_bad = None, {}
    if plan.eval_rows:
        rows, eval_bad = read_eval_rows(plan, mapping, setup.storage, encoder, args.max_seq_length)
        if rows:
            import datasets

            evaluation = datasets.Dataset.from_list(rows)
    stats = {
        "rows": plan.shards.rows,
        "train_rows": plan.train_rows,
        "eval_rows": len(evaluation) if evaluation is not None else 0,
        "skipped_rows": {},  # counted as the stream goes: filled in at the end (worker.finish)
        "skipped_row_ids": {},
        "eval_skipped": eval_bad,
        "scan_reused": False,
        "rows_per_epoch": plan.steps_per_epoch() * plan.global_batch,
        "rows_left_out_per_epoch": plan.train_rows - plan.steps_per_epoch() * plan.global_batch,
        "steps_per_epoch": plan.steps_per_epoch(),
    }
    callback = stream_callback(batches, plan.shards.rows, setup.rank)
    return batches, evaluation, Collator(encoder, ".", None), stats, callback, plan


def streaming_trainer(trainer_cls: Any, batches: StreamingBatches) -> Any:
    """`trainer_cls` (a transformers Trainer) whose training micro-batches are `batches` (already collated, this
    rank's own: no sampler, no accelerate sharding)."""

    class Streamed(trainer_cls):
        def get_train_dataloader(self):
            return batches

    Streamed.__name__ = Streamed.__qualname__ = f"Streamed{trainer_cls.__name__}"
    return Streamed


RECORD_RULE = ("each epoch as trained: the rows each rank was handed for its steps, counted as a multiset across the "
               "ranks and the checkpoint resumed from (rows_trained_twice: the times beyond once, with their ids); "
               "steps counted; rows_left_out: the training split's rows neither trained nor skipped as bad (the equal "
               f"split's drop and each rank's last rows that fill no step), by id (the first {ID_LIMIT} of each list)")


def observed_epoch(section: dict[str, Any]) -> dict[str, Any]:
    """rows_per_epoch, rows_left_out_per_epoch, steps_per_epoch of the summary as the last whole epoch trained them
    (None each when no epoch was whole: max_steps ended the first)."""
    whole = [e for e in section["epochs"] if not e.get("cut_short_by_max_steps")]
    last = whole[-1] if whole else {}
    return {"rows_per_epoch": last.get("rows_trained"), "rows_left_out_per_epoch": last.get("rows_left_out"),
            "steps_per_epoch": last.get("steps")}


def summary_section(plan: StreamPlan, batches: StreamingBatches, args: TrainArguments,
                    eval_sampled: int) -> dict[str, Any]:
    """What summary.json says about the stream: the rules, each epoch as trained (and the plan's figures beside
    them), the epochs trained, the data wait."""
    waits = batches.waits
    return {"shards": len(plan.shards.shards), "shard_format": plan.shards.shard_format,
            "content_sha256": plan.shards.content_sha256, "shuffle_rule": plan.shuffle_rule(),
            "shuffle_window": plan.window, "resume_rule": RESUME_RULE, "eval_rule":
            eval_rule(plan, args, eval_sampled),
            "epochs": batches.epochs, "epochs_trained": batches.epochs_trained(), "record_rule": RECORD_RULE,
            "planned": {"rows_per_epoch": plan.steps_per_epoch() * plan.global_batch,
                        "rows_left_out_per_epoch": plan.train_rows - plan.steps_per_epoch() * plan.global_batch,
                        "steps_per_epoch": plan.steps_per_epoch()},
            "resumed_with_rows": batches.state.resumed_rows if batches.epochs == [] else
            batches.epochs[0].get("resumed_with_rows", 0),
            "data_wait_s": {"steps": len(waits), "total": round(sum(waits), 4),
                            "first_step": round(waits[0], 4) if waits else None,
                            "steady_mean": round(sum(waits[1:]) / (len(waits) - 1), 6) if len(waits) > 1 else None,
                            "steady_max": round(max(waits[1:]), 6) if len(waits) > 1 else None}}
