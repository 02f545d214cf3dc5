"""The streaming input path (`--streaming=true`): the rows come from shards in the bucket through Ray Data, never
copied to a node whole.

- **Read**: Ray Data reads the manifest's parquet (or WebDataset .tar) shards under the dataset's gs:// prefix.
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
  epoch are saved with every checkpoint (`stream_state.json`: a bitmap of row ids). **Resume**: the
  interrupted epoch goes on without the rows it already trained (none is seen twice, none left out for it);
  the order of the rest differs from an uninterrupted run (Ray Data's split is not replayable across worker
  group starts). The rule is in `summary.json` (`streaming.resume_rule`).
- **Data wait**: the time each step waits for its rows, logged (`data_wait_s`) and summed in `summary.json`.
"""

from __future__ import annotations

import time
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
    step, from this rank's streaming_split of the epoch (rank 0 splits, every rank takes its part)."""

    def __init__(self, plan: StreamPlan, make_dataset, collate, rank: int, world_size: int, micro_batch: int,
                 accumulation: int, state: StreamState, broadcast, gather, start_step: int = 0,
                 no_step=lambda record: None):
        self.plan, self.make_dataset, self.collate, self.start_step = plan, make_dataset, collate, start_step
        self.rank, self.world_size, self.micro, self.accumulation = rank, world_size, micro_batch, accumulation
        self.state, self.broadcast, self.gather, self.no_step = state, broadcast, gather, no_step
        self.waits: list[float] = []  # seconds each step waited for its rows
        self.epochs: list[dict[str, Any]] = []  # per finished epoch: rows trained, twice, steps
        self.steps_done = 0  # optimizer steps whose rows were handed out, since this start

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
            self.epoch_open = True
            split = self._split(epoch)
            shuffle = {"local_shuffle_buffer_size": self.plan.window,
                       "local_shuffle_seed": self.plan.seed * 7919 + epoch * 104729 + self.rank} if self.plan.window else {}
            batches = iter(split.iter_batches(batch_size=group_rows, drop_last=True, batch_format="pyarrow",
                                              prefetch_batches=2, **shuffle))
            while True:
                start = time.perf_counter()
                group = next(batches, None)
                if group is None:
                    break
                self.waits.append(time.perf_counter() - start)
                rows = group.column(ROW_ID).to_pylist()
                self.state.rows.update(rows)
                self.steps_done += 1
                for j in range(self.accumulation):
                    yield self.collate(group.slice(j * self.micro, self.micro))
            self.epochs.append(self.epoch_record())
            self.epoch_open = False
            if self.epochs[-1]["steps"] == 0:  # every rank: the record is the group's
                self.no_step(self.epochs[-1])
        self.done = True

    def epoch_progress(self) -> float:
        """The stream's epoch as a number: the epoch, plus the share of its rows trained so far."""
        per_epoch = max(self.plan.steps_per_epoch() * self.plan.global_batch, 1)
        return round(self.state.epoch + min(1.0, len(self.state.rows) * self.world_size / per_epoch), 4)

    def close(self) -> None:
        """At the end of training (every rank): the record of an epoch max_steps cut short."""
        if getattr(self, "epoch_open", False):
            self.epochs.append({**self.epoch_record(), "cut_short_by_max_steps": True})
            self.epoch_open = False

    def epoch_record(self) -> dict[str, Any]:
        """The epoch's rows across the ranks (a collective: every rank calls it at the same point)."""
        everyone = self.gather(sorted(self.state.rows))
        union: set[int] = set()
        total = 0
        for rows in everyone:
            union.update(rows)
            total += len(rows)
        if self.state.resumed_rows:  # every rank holds the rows the resumed epoch had trained before
            total -= (len(everyone) - 1) * self.state.resumed_rows
        return {"epoch": self.state.epoch, "rows_trained": len(union), "rows_trained_twice": total - len(union),
                "steps": len(union) // self.plan.global_batch, "resumed_with_rows": self.state.resumed_rows}


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


def stream_callback(batches: StreamingBatches, total_rows: int, rank: int, gather):
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
            everyone = gather(sorted(batches.state.rows))  # every rank: a collective
            if rank == 0:
                rows: set[int] = set()
                for part in everyone:
                    rows.update(part)
                ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if ckpt.is_dir():
                    (ckpt / STATE_FILE).write_bytes(batches.state.to_json(rows, total_rows, state.global_step))

    return StreamCallback()


def read_eval_rows(plan: StreamPlan, mapping: dict[str, str], storage, encoder, max_seq_length: int):
    """(the eval split's good rows as the job's fields with their row ids, {row: reason} of its bad ones): the
    last `eval_rows` rows of the manifest, read from the shards that hold them (pyarrow; no Ray Data)."""
    import io
    import tarfile

    from trainer.job.storage import filesystem

    good, bad = [], {}
    for shard in plan.eval_shards():
        fs, path = filesystem(shard.uri, storage.emulator_host)
        with fs.open_input_file(path) as fh:
            data = fh.read()
        if plan.shards.shard_format == "webdataset":
            samples: dict[str, dict[str, Any]] = {}
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                for member in tar.getmembers():
                    key, _, ext = member.name.partition(".")
                    samples.setdefault(key, {})[ext] = tar.extractfile(member).read()
            raws = list(samples.values())
        else:
            import pyarrow.parquet as pq

            raws = pq.read_table(io.BytesIO(data), columns=sorted({*mapping.values(), ROW_ID})).to_pylist()
        for raw in raws:
            row = canonical_row(raw, mapping, plan.shards.shard_format, plan.shards.image_column)
            if row[ROW_ID] < plan.first_eval_row:
                continue
            problem, _ = check_row(row, encoder, max_seq_length)
            if problem:
                bad[row[ROW_ID]] = problem
            else:
                good.append(row)
    return sorted(good, key=lambda r: r[ROW_ID]), bad



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

    batches = StreamingBatches(plan, make_dataset, collate_group(encoder, args.use_gpu), setup.rank,
                               setup.world_size, micro_batch, accumulation, state, setup.broadcast, setup.gather,
                               setup.start_step, no_step)
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
    callback = stream_callback(batches, plan.shards.rows, setup.rank, setup.gather)
    return batches, evaluation, Collator(encoder, ".", None), stats, callback, plan


def streaming_trainer(trainer_cls: Any, batches: StreamingBatches) -> Any:
    """`trainer_cls` (a transformers Trainer) whose training micro-batches are `batches` (already collated, this
    rank's own: no sampler, no accelerate sharding)."""

    class Streamed(trainer_cls):
        def get_train_dataloader(self):
            return batches

    Streamed.__name__ = Streamed.__qualname__ = f"Streamed{trainer_cls.__name__}"
    return Streamed


def summary_section(plan: StreamPlan, batches: StreamingBatches, args: TrainArguments) -> dict[str, Any]:
    """What summary.json says about the stream: the rules, each epoch's rows, the data wait."""
    waits = batches.waits
    return {"shards": len(plan.shards.shards), "shard_format": plan.shards.shard_format,
            "content_sha256": plan.shards.content_sha256, "shuffle_rule": plan.shuffle_rule(),
            "shuffle_window": plan.window, "resume_rule": RESUME_RULE, "eval_rule":
            f"the last {plan.eval_rows} rows of the manifest's order (eval_fraction {args.eval_fraction})",
            "epochs": batches.epochs, "resumed_with_rows": batches.state.resumed_rows if batches.epochs == [] else
            batches.epochs[0].get("resumed_with_rows", 0),
            "data_wait_s": {"steps": len(waits), "total": round(sum(waits), 4),
                            "first_step": round(waits[0], 4) if waits else None,
                            "steady_mean": round(sum(waits[1:]) / (len(waits) - 1), 6) if len(waits) > 1 else None,
                            "steady_max": round(max(waits[1:]), 6) if len(waits) > 1 else None}}
