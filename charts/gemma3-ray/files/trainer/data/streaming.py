"""The streaming input path (`--streaming=true`): the rows come from shards in the bucket through Ray Data, never
copied to a node whole.

- **Read**: Ray Data reads the manifest's parquet (or WebDataset .tar) shards under the dataset's gs:// prefix.
- **CPU stages** (`RowStage`, Ray Data actors with one CPU each, on any node with CPUs: the head, the CPU
  group, the GPU nodes' spare cores): each row is checked as the scan checks it (the same reasons: missing or
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

import base64
import json
import math
import random
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from trainer.job.flags import ANSWER_FIELD, IMAGE_FIELD, TrainArguments
from trainer.job.shard_manifest import ROW_ID, ShardSet

SKIPPED_DIR = "streaming/skipped"  # in the run: one JSON-lines file per CPU-stage batch that dropped rows
STATE_FILE = "stream_state.json"  # in each checkpoint: the epoch and the rows it has trained
STAGE_BATCH_ROWS = 16
# A shard read waits on the network more than it computes: a quarter CPU each, so reads still run where the
# training workers and the CPU stage hold every whole CPU.
READ_CPUS = 0.25
SHUFFLE_RULE = ("each epoch: the shards in an order seeded by seed and the epoch, then each worker's rows through "
                "a shuffle window of {window} rows seeded by seed, the epoch and the rank")
NO_SHUFFLE_RULE = "none (streaming_shuffle_window=0): the manifest's order of shards and rows"
RESUME_RULE = ("a restart resumes the newest checkpoint's epoch without the rows that epoch had trained "
               "(stream_state.json in the checkpoint): no row is trained twice or left out by the restart; the "
               "order of the rest differs from an uninterrupted run")


# ----------------------------------------------------------------------------------------------
# What a run streams: the checked shards, which rows are held out, how many epochs.
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamPlan:
    shards: ShardSet
    eval_rows: int  # the last eval_rows rows of the manifest's order are the eval split
    global_batch: int
    seed: int
    window: int
    epochs: int  # how many epochs the stream holds (the Trainer stops at max_steps)

    @property
    def first_eval_row(self) -> int:
        return self.shards.rows - self.eval_rows

    @property
    def train_rows(self) -> int:
        return self.first_eval_row

    def train_shards(self) -> list:
        return [s for s in self.shards.shards if s.first_row < self.first_eval_row]

    def eval_shards(self) -> list:
        return [s for s in self.shards.shards if s.first_row + s.rows > self.first_eval_row]

    def steps_per_epoch(self) -> int:
        """Steps an epoch of good rows trains (fewer when rows turn out bad or a worker's remainder is left out)."""
        return self.train_rows // self.global_batch

    def shard_order(self, epoch: int) -> list:
        shards = self.train_shards()
        if self.window:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(shards)
        return shards

    def shuffle_rule(self) -> str:
        return SHUFFLE_RULE.format(window=self.window) if self.window else NO_SHUFFLE_RULE


def plan_stream(args: TrainArguments, shards: ShardSet) -> StreamPlan:
    eval_rows = math.ceil(shards.rows * args.eval_fraction) if args.eval_fraction > 0 else 0
    plan = StreamPlan(shards, eval_rows, args.global_batch_size, args.seed, args.streaming_shuffle_window, 1)
    epochs = math.ceil(args.max_steps / max(plan.steps_per_epoch(), 1)) + 1 if args.max_steps > 0 else \
        math.ceil(args.num_train_epochs)
    return StreamPlan(shards, eval_rows, args.global_batch_size, args.seed, args.streaming_shuffle_window, epochs)


def max_steps(args: TrainArguments, plan: StreamPlan) -> int:
    """The Trainer's max_steps: the flag's, else the epochs' steps as the manifest's rows give them."""
    return args.max_steps if args.max_steps > 0 else max(1, math.ceil(args.num_train_epochs * plan.steps_per_epoch()))


# ----------------------------------------------------------------------------------------------
# Row ids as a compact bitmap (what a checkpoint keeps of the epoch's trained rows).
# ----------------------------------------------------------------------------------------------
def pack_rows(rows: set[int], total: int) -> str:
    bits = bytearray((total + 7) // 8)
    for r in rows:
        bits[r >> 3] |= 1 << (r & 7)
    return base64.b64encode(zlib.compress(bytes(bits), 6)).decode()


def unpack_rows(packed: str) -> set[int]:
    bits = zlib.decompress(base64.b64decode(packed))
    return {i * 8 + b for i, byte in enumerate(bits) if byte for b in range(8) if byte >> b & 1}


# ----------------------------------------------------------------------------------------------
# The Ray Data CPU stage: check, tokenise, decode and process each row; drop and record the bad ones.
# ----------------------------------------------------------------------------------------------
def _canonical(raw: dict[str, Any], mapping: dict[str, str], shard_format: str, image_column: str) -> dict[str, Any]:
    """A shard's row as the job's fields (image, answer, the prompt's placeholders) plus its row id."""
    if shard_format == "webdataset":
        meta = json.loads(raw.get("json") or b"{}")
        data = next((raw[k] for k in raw if k not in ("json", "__key__", "__url__") and raw.get(k)), None)
        meta[image_column] = {"bytes": data, "path": meta.get(f"{image_column}_path")}
        raw = meta
    row = {f: raw.get(c) for f, c in mapping.items()}
    row[ROW_ID] = int(raw[ROW_ID])
    return row


def check_row(row: dict[str, Any], encoder, max_seq_length: int):
    """(problem, None) for a bad row, with the scan's reasons in the scan's order; else (None, (ids, labels,
    RGB image))."""
    from trainer.data.dataset import BadImage, decode_image, image_bytes

    answer = row.get(ANSWER_FIELD)
    if not isinstance(answer, str) or not answer.strip():
        return "empty_answer", None
    for f in encoder.fields:
        if row.get(f) is None or (isinstance(row[f], str) and not row[f].strip()):
            return "empty_prompt_field", None
    if encoder.image_marker_in(row):
        return "image_token_in_text", None
    data = image_bytes(row.get(IMAGE_FIELD), ".", None)
    if data is None:
        return "missing_image", None
    try:
        image = decode_image(data)
    except BadImage as e:
        return e.reason, None
    ids, labels = encoder.encode(row)
    if len(ids) > max_seq_length:
        return "too_long", None
    return None, (ids, labels, image)


class RowStage:
    """The Ray Data stage (an actor per CPU): shard rows in, training rows out (`_row`, `input_ids`, `labels`,
    `pixel_values` as float32 bytes and their shape). Bad rows are dropped and written to the run's
    SKIPPED_DIR with their reason; under bad_rows=fail the first one stops the stream with `row N: reason`."""

    def __init__(self, processor, args: dict[str, Any], mapping: dict[str, str], shard_format: str, image_column: str,
                 storage: dict[str, Any], epoch: int, first_eval_row: int, exclude: str | None):
        from trainer.data.encoding import SampleEncoder
        from trainer.job.storage import Storage

        self.args = TrainArguments(**args)
        self.encoder = SampleEncoder(processor, self.args)
        self.processor, self.mapping, self.shard_format, self.image_column = processor, mapping, shard_format, image_column
        self.storage, self.epoch, self.first_eval_row = Storage(**storage), epoch, first_eval_row
        self.exclude = unpack_rows(exclude) if exclude else set()

    def __call__(self, batch) -> Any:
        import numpy as np
        import pyarrow as pa

        rows = batch.to_pylist() if hasattr(batch, "to_pylist") else batch
        good, bad = [], []
        for raw in rows:
            row = _canonical(raw, self.mapping, self.shard_format, self.image_column)
            if row[ROW_ID] >= self.first_eval_row or row[ROW_ID] in self.exclude:
                continue
            problem, done = check_row(row, self.encoder, self.args.max_seq_length)
            if problem:
                if self.args.bad_rows == "fail":
                    hint = " (raise --max_seq_length)" if problem == "too_long" else ""
                    raise ValueError(f"{BAD_ROW_MARK}row {row[ROW_ID]}: {problem}{hint}; --bad_rows=skip would skip "
                                     f"such rows{BAD_ROW_MARK}")
                bad.append({"row": row[ROW_ID], "reason": problem, "epoch": self.epoch})
            else:
                good.append((row[ROW_ID], *done))
        if bad:
            self.storage.write_bytes(f"{SKIPPED_DIR}/e{self.epoch:04d}-{uuid.uuid4().hex}.jsonl",
                                     "".join(json.dumps(b) + "\n" for b in bad).encode())
        pixels = (self.processor.image_processor(images=[g[3] for g in good], return_tensors="np")["pixel_values"]
                  if good else np.zeros((0, 1, 1, 1), dtype=np.float32))
        pixels = np.ascontiguousarray(pixels, dtype=np.float32)
        return pa.table({
            ROW_ID: pa.array([g[0] for g in good], pa.int64()),
            "input_ids": pa.array([g[1] for g in good], pa.list_(pa.int64())),
            "labels": pa.array([g[2] for g in good], pa.list_(pa.int64())),
            "pixel_values": pa.array([p.tobytes() for p in pixels], pa.large_binary()),
            "pixel_shape": pa.array([list(p.shape) for p in pixels], pa.list_(pa.int64())),
        })


BAD_ROW_MARK = "\x1ebad_rows=fail\x1e"  # brackets the one sentence a bad_rows=fail stop carries through Ray Data


def bad_row_stop(error: BaseException) -> str | None:
    """The `row N: reason` sentence of a bad_rows=fail stop inside a Ray Data error, or None."""
    text = str(error)
    if BAD_ROW_MARK in text:
        return text.split(BAD_ROW_MARK)[1]
    return None


def epoch_dataset(plan: StreamPlan, epoch: int, processor, args: TrainArguments, mapping: dict[str, str],
                  storage, exclude: set[int], decoders: int, node_ids: list[str] | None = None):
    """The epoch's Ray Data dataset (read, then the CPU stage), in the epoch's shard order. With `node_ids`, the
    CPU stage's actors run only on those nodes (the training workers': their image has the trainer's packages,
    a stock Ray head has not); the reads run anywhere (pyarrow, which Ray Data brings)."""
    import ray.data

    from trainer.job.storage import filesystem

    shards = plan.shard_order(epoch)
    fs, _ = filesystem(shards[0].uri, storage.emulator_host)
    paths = [filesystem(s.uri, storage.emulator_host)[1] for s in shards]
    if plan.shards.shard_format == "webdataset":
        ds = ray.data.read_webdataset(paths, filesystem=fs, decoder=None, override_num_blocks=len(paths),
                                      num_cpus=READ_CPUS)
    else:
        columns = sorted({*mapping.values(), ROW_ID})
        ds = ray.data.read_parquet(paths, filesystem=fs, override_num_blocks=len(paths),
                                   num_cpus=READ_CPUS).select_columns(columns)
    from dataclasses import asdict

    placement = {"label_selector": {"ray.io/node-id": f"in({','.join(sorted(set(node_ids)))})"}} if node_ids else {}
    return ds.map_batches(
        RowStage, batch_format="pyarrow", batch_size=STAGE_BATCH_ROWS, num_cpus=1, concurrency=decoders, **placement,
        fn_constructor_kwargs={"processor": processor, "args": asdict(args), "mapping": mapping,
                               "shard_format": plan.shards.shard_format, "image_column": plan.shards.image_column,
                               "storage": asdict(storage), "epoch": epoch, "first_eval_row": plan.first_eval_row,
                               "exclude": pack_rows(exclude, plan.shards.rows) if exclude else None})


def configure_data_context(object_store_bytes: int | None) -> None:
    """Ray Data's limits for this process's datasets: the order kept (reproducible on one worker) and the
    object store memory the streaming executor may hold (the rest waits: bounded memory, no spill)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    if object_store_bytes:
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=object_store_bytes)


# ----------------------------------------------------------------------------------------------
# The worker side: the Trainer's train dataloader.
# ----------------------------------------------------------------------------------------------
@dataclass
class StreamState:
    """Where the stream is: the epoch, the step it began at, and the rows this rank trained in it."""

    epoch: int = 0
    epoch_start_step: int = 0
    rows: set[int] = field(default_factory=set)  # this rank's rows of the epoch (all ranks' after a resume)
    resumed_rows: int = 0

    def to_json(self, all_rows: set[int], total: int, step: int) -> bytes:
        return json.dumps({"format": 1, "epoch": self.epoch, "epoch_start_step": self.epoch_start_step,
                           "step": step, "rows_trained": len(all_rows), "rows": pack_rows(all_rows, total)}).encode()

    @classmethod
    def from_json(cls, raw: bytes | None) -> StreamState | None:
        if not raw:
            return None
        try:
            obj = json.loads(raw)
            rows = unpack_rows(obj["rows"])
            return cls(int(obj["epoch"]), int(obj["epoch_start_step"]), rows, len(rows))
        except (ValueError, KeyError, TypeError, zlib.error):
            return None


class StreamingBatches:
    """The micro-batches of this rank, epoch after epoch: a group of `accumulation` micro-batches per optimizer
    step, from this rank's streaming_split of the epoch (rank 0 splits, every rank takes its part)."""

    def __init__(self, plan: StreamPlan, make_dataset, collate, rank: int, world_size: int, micro_batch: int,
                 accumulation: int, state: StreamState, broadcast, gather, start_step: int = 0):
        self.plan, self.make_dataset, self.collate, self.start_step = plan, make_dataset, collate, start_step
        self.rank, self.world_size, self.micro, self.accumulation = rank, world_size, micro_batch, accumulation
        self.state, self.broadcast, self.gather = state, broadcast, gather
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
        for epoch in range(self.state.epoch, self.plan.epochs):
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
            row = _canonical(raw, mapping, plan.shards.shard_format, plan.shards.image_column)
            if row[ROW_ID] < plan.first_eval_row:
                continue
            problem, _ = check_row(row, encoder, max_seq_length)
            if problem:
                bad[row[ROW_ID]] = problem
            else:
                good.append(row)
    return sorted(good, key=lambda r: r[ROW_ID]), bad


def skipped_rows(storage) -> dict[str, list[int]]:
    """{reason: row ids} of every row the CPU stages dropped in this run (each row once per reason)."""
    import pyarrow.fs as pafs

    fs, base = storage.fs()
    found: dict[str, set[int]] = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{base}/{SKIPPED_DIR}", allow_not_found=True)):
        if info.type != pafs.FileType.File:
            continue
        with fs.open_input_stream(info.path) as src:
            for line in src.read().decode().splitlines():
                rec = json.loads(line)
                found.setdefault(rec["reason"], set()).add(int(rec["row"]))
    return {reason: sorted(rows) for reason, rows in sorted(found.items())}


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
    from trainer.job.flags import column_mapping
    from trainer.job.shard_manifest import from_config

    mapping = column_mapping(args)
    plan = plan_stream(args, from_config(setup.shards))
    encoder = SampleEncoder(processor, args)
    configure_data_context(setup.object_store_bytes)
    state = setup.state or StreamState()

    def make_dataset(epoch: int, exclude: set[int]):
        return epoch_dataset(plan, epoch, processor, args, mapping, setup.storage, exclude, setup.decoders,
                             setup.node_ids)

    batches = StreamingBatches(plan, make_dataset, collate_group(encoder, args.use_gpu), setup.rank,
                               setup.world_size, micro_batch, accumulation, state, setup.broadcast, setup.gather,
                               setup.start_step)
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
