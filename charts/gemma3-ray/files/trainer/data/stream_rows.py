"""The streaming path's Ray Data CPU stage: each row checked as the scan checks it, tokenised, its image decoded
and processed; bad rows dropped and recorded with their row ids in the run (``SKIPPED_DIR``); the epoch's
dataset (shards in the epoch's order, read, staged); the object store's bound. The streaming path as a whole:
``trainer.data.streaming``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from trainer.data.stream_plan import StreamPlan, pack_rows, unpack_rows
from trainer.job.flags import ANSWER_FIELD, IMAGE_FIELD, TrainArguments, UsageError
from trainer.job.shard_manifest import ROW_ID
from trainer.job.shard_read import STOP_MARK, read_train

SKIPPED_DIR = "streaming/skipped"  # in the run: one JSON-lines file per CPU-stage batch that dropped rows
STAGE_BATCH_ROWS = 16
# A shard read waits on the network more than it computes: a quarter CPU each, so reads still run where the
# training workers and the CPU stage hold every whole CPU.
READ_CPUS = 0.25
# A WebDataset sample's image is whichever of these members it has (the stream's reader, as Ray Data's, gives each
# extension its own column, None (Ray Data's: NaN) where a sample lacks it); `data shard` writes png/jpg/gif/bmp/webp, `img` for bytes it does
# not know (decoded here: corrupt_image if they are not an image) and `missing` (empty) for a row without one.
IMAGE_MEMBERS = ("png", "jpg", "jpeg", "webp", "gif", "bmp", "tif", "tiff", "img")


# ----------------------------------------------------------------------------------------------
# The Ray Data CPU stage: check, tokenise, decode and process each row; drop and record the bad ones.
# ----------------------------------------------------------------------------------------------
def canonical_row(raw: dict[str, Any], mapping: dict[str, str], shard_format: str, image_column: str) -> dict[str, Any]:
    """A shard's row as the job's fields (image, answer, the prompt's placeholders) plus its row id."""
    if shard_format == "webdataset":
        meta = json.loads(_bytes(raw.get("json")) or b"{}")
        data = next((_bytes(raw[k]) for k in raw if k.lower() in IMAGE_MEMBERS and _bytes(raw[k])), None)
        meta[image_column] = {"bytes": data, "path": meta.get(f"{image_column}_path")}
        raw = meta
    row = {f: raw.get(c) for f, c in mapping.items()}
    row[ROW_ID] = int(raw[ROW_ID])
    return row


def _bytes(value: Any) -> bytes | None:
    """A member's bytes, or None for what Ray Data puts where a sample lacks the member (NaN, None) or an empty one."""
    return bytes(value) if isinstance(value, bytes | bytearray) and value else None


def shard_image(value: Any) -> bytes | None:
    """A row's image bytes as its shard holds them ({bytes, path} or bytes); None is missing_image. Never read from
    the path: `data shard` put every image it found into the shard, and a path is the source's, not the worker's."""
    return _bytes(value.get("bytes")) if isinstance(value, dict) else _bytes(value)


def check_row(row: dict[str, Any], encoder, max_seq_length: int):
    """(problem, None) for a bad row, with the scan's reasons in the scan's order; else (None, (ids, labels,
    RGB image))."""
    from trainer.data.dataset import BadImage, decode_image

    answer = row.get(ANSWER_FIELD)
    if not isinstance(answer, str) or not answer.strip():
        return "empty_answer", None
    for f in encoder.fields:
        if row.get(f) is None or (isinstance(row[f], str) and not row[f].strip()):
            return "empty_prompt_field", None
    if encoder.image_marker_in(row):
        return "image_token_in_text", None
    data = shard_image(row.get(IMAGE_FIELD))
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
            row = canonical_row(raw, self.mapping, self.shard_format, self.image_column)
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


BAD_ROW_MARK = STOP_MARK  # brackets the one sentence a bad_rows=fail stop (or a shard read's) carries through Ray Data


# How long the CPU stage's actors may wait for their CPUs before the run stops with a sentence (Ray Data's default
# is forever: seen on make e2e, the stage's actor PENDING on a node whose CPUs the training workers held).
STAGE_START_TIMEOUT_S = 600
STAGE_START_MARK = "Timed out while starting actors"  # Ray Data's words (ActorPoolMapOperator.start)


def bad_row_stop(error: BaseException) -> str | None:
    """The sentence of a marked stop inside a Ray Data error (`row N: reason` of bad_rows=fail, a shard the read
    found gone, changed or forbidden), or None."""
    text = str(error)
    if BAD_ROW_MARK in text:
        return text.split(BAD_ROW_MARK)[1]
    return None


def stream_stop(error: BaseException, decoders: int, shards: dict[str, Any] | None = None) -> str | None:
    """One sentence for an error of the stream that retrying cannot fix (a bad row under bad_rows=fail, the CPU
    stage finding no CPU, an epoch with too few usable rows: a UsageError; with the run's checked `shards`, a shard
    deleted, replaced or no longer readable since the driver checked it), or None."""
    if isinstance(error, UsageError):
        return str(error)
    sentence = bad_row_stop(error)
    if sentence is not None:
        return sentence
    if STAGE_START_MARK in str(error):
        return (f"the streaming CPU stage's {decoders} actor(s) (1 CPU each) found no free CPU on the training "
                f"workers' nodes in {STAGE_START_TIMEOUT_S} s: give the worker pods training.streaming_decoders CPUs "
                f"beyond their training workers' (workers.resources), or lower training.streaming_decoders")
    if shards is not None:
        from trainer.job.shard_manifest import changed_shard

        changed = changed_shard(shards)
        if changed is not None:
            return f"{changed}; it changed while the run read it, so the run stops (every retry would fail the same way)"
    return None


def node_cpus(node_ids: list[str]) -> dict[str, float]:
    """{node id: its CPUs} of the live nodes among `node_ids` (Ray's view of the cluster)."""
    import ray

    wanted = set(node_ids)
    return {n["NodeID"]: float(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes()
            if n.get("Alive") and n["NodeID"] in wanted}


def placement_problem(decoders: int, cpus: dict[str, float], held: dict[str, float]) -> str | None:
    """One sentence when the CPU stage's `decoders` actors (1 CPU each, on the training workers' nodes only) cannot
    all be placed: `cpus` per node, `held` the CPUs the training workers hold there. Known before the first step;
    Ray Data would wait for them (STAGE_START_TIMEOUT_S) instead. None when they fit (other tasks may still hold
    those CPUs: then the timeout's sentence)."""
    import math

    room = sum(math.floor(cpus[n] - held.get(n, 0.0) + 1e-9) for n in cpus)
    if room >= decoders:
        return None
    said = (f"the streaming CPU stage's {decoders} decoder(s) need 1 CPU each on the training workers' nodes beyond "
            f"the training workers' {sum(held.values()):g} CPU(s), and those nodes have {sum(cpus.values()):g} "
            "CPU(s): ")
    if room > 0:
        return (said + f"room for {room} decoder(s); use --streaming_decoders={room} (chart: "
                "training.streaming_decoders), or give the workers' nodes more CPUs")
    return said + "room for none; give the workers' nodes more CPUs, or use fewer training workers per node"


def epoch_dataset(plan: StreamPlan, epoch: int, processor, args: TrainArguments, mapping: dict[str, str],
                  storage, exclude: set[int], decoders: int, node_ids: list[str] | None = None):
    """The epoch's Ray Data dataset (read, then the CPU stage), in the epoch's shard order. With `node_ids`, the
    CPU stage's actors run only on those nodes (the training workers': their image has the trainer's packages,
    a stock Ray head has not); the reads run anywhere (trainer.job.shard_read: standard library and pyarrow)."""
    ds = read_train(plan.shard_order(epoch), plan.shards.root, plan.shards.shard_format,
                    sorted({*mapping.values(), ROW_ID}), storage.emulator_host, READ_CPUS)
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
    ctx.wait_for_min_actors_s = STAGE_START_TIMEOUT_S  # the CPU stage's actors: a sentence, never a hang
    if object_store_bytes:
        ctx.execution_options.resource_limits = ctx.execution_options.resource_limits.copy(
            object_store_memory=object_store_bytes)


def skipped_rows(storage, epoch: int | None = None) -> dict[str, list[int]]:
    """{reason: row ids} of every row the CPU stages dropped in this run (each row once per reason); of `epoch`'s
    batches only, when given."""
    import pyarrow.fs as pafs

    fs, base = storage.fs()
    found: dict[str, set[int]] = {}
    for info in fs.get_file_info(pafs.FileSelector(f"{base}/{SKIPPED_DIR}", allow_not_found=True)):
        if info.type != pafs.FileType.File or (epoch is not None and
                                                not info.base_name.startswith(f"e{epoch:04d}-")):
            continue
        with fs.open_input_stream(info.path) as src:
            for line in src.read().decode().splitlines():
                rec = json.loads(line)
                found.setdefault(rec["reason"], set()).add(int(rec["row"]))
    return {reason: sorted(rows) for reason, rows in sorted(found.items())}
