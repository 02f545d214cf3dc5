"""A shard as the stream reads it: its bytes read whole (one shard at a time: `data shard` bounds a shard's size,
256 MB by default) and checked against the manifest's sha256 on gs:// as on a local disk, then parsed into rows
(parquet: the columns the run maps; WebDataset: each sample's members as columns, as Ray Data's reader gives them).
The train split reads through `ShardRead` (a Ray Data task per shard), the eval split through `shard_bytes`. A shard
gone, changed or not readable is one sentence (``ManifestError``): no retry reads it. The streaming path as a whole:
``trainer.data.streaming``.

In job/, standard library and pyarrow only: Ray Data runs the read tasks on any node, a stock Ray head included.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from typing import Any

from trainer.job.shard_manifest import ManifestError, Shard, denied, forbidden, missing, other_hash
from trainer.job.storage import filesystem

# Brackets a sentence that stops the stream (a bad row under bad_rows=fail, a shard no retry reads) through Ray
# Data's error, which wraps the task's exception in its own text.
STOP_MARK = "\x1estop\x1e"
STOPS = "the run stops (every retry would fail the same way)"


def shard_bytes(shard: Shard, root: str, emulator_host: str | None) -> bytes:
    """The shard's bytes, checked against the manifest's sha256; ManifestError (one sentence) for a shard gone,
    changed or one the job may not read."""
    fs, path = filesystem(shard.uri, emulator_host)
    try:
        with fs.open_input_stream(path) as src:
            data = src.read()
    except FileNotFoundError as e:
        raise missing(root, shard.name) from e
    except OSError as e:
        if denied(e):
            raise ManifestError(forbidden(root, e)) from e
        if "NOT_FOUND" in str(e) or "No such" in str(e):
            raise missing(root, shard.name) from e
        raise
    if hashlib.sha256(data).hexdigest() != shard.sha256:
        raise other_hash(root, shard.name, "sha256")
    return data


def webdataset_samples(data: bytes) -> list[dict[str, Any]]:
    """A tar's samples in order: {member extension: bytes} per key (a member `KEY.EXT`)."""
    samples: dict[str, dict[str, Any]] = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                key, _, ext = member.name.partition(".")
                samples.setdefault(key, {"__key__": key})[ext] = tar.extractfile(member).read()
    return list(samples.values())


def shard_table(data: bytes, shard_format: str, columns: list[str]):
    """The shard's rows as a pyarrow table: parquet's `columns`; a tar's samples, one binary column per member
    extension (null where a sample lacks it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if shard_format != "webdataset":
        return pq.read_table(io.BytesIO(data), columns=columns)
    samples = webdataset_samples(data)
    keys = sorted({k for s in samples for k in s} - {"__key__"})
    return pa.table({"__key__": pa.array([s["__key__"] for s in samples], pa.string()),
                     **{k: pa.array([s.get(k) for s in samples], pa.binary()) for k in keys}})


class ShardRead:
    """The Ray Data read of the train split: a batch of shards ({uri, name, sha256}) in, their rows out; a shard no
    retry reads stops the stream with its sentence (STOP_MARK)."""

    def __init__(self, root: str, shard_format: str, columns: list[str], emulator_host: str | None):
        self.root, self.shard_format, self.columns, self.emulator_host = root, shard_format, columns, emulator_host

    def __call__(self, batch) -> Any:
        import pyarrow as pa

        batch = batch.to_pydict() if hasattr(batch, "to_pydict") else batch
        tables = []
        for uri, name, sha in zip(batch["uri"], batch["name"], batch["sha256"], strict=True):
            try:
                data = shard_bytes(Shard(name, uri, 0, 0, 0, sha, ""), self.root, self.emulator_host)
            except ManifestError as e:
                raise ValueError(f"{STOP_MARK}{e}; {STOPS}{STOP_MARK}") from None
            tables.append(shard_table(data, self.shard_format, self.columns))
        return pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]


def read_train(shards: list[Shard], root: str, shard_format: str, columns: list[str], emulator_host: str | None,
               num_cpus: float):
    """The epoch's Ray Data dataset of `shards`' rows, in their order (one block per shard)."""
    import ray.data

    items = [{"uri": s.uri, "name": s.name, "sha256": s.sha256} for s in shards]
    read = ShardRead(root, shard_format, columns, emulator_host)  # an instance: Ray Data runs it as tasks
    return ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read, batch_size=1, batch_format="pyarrow", num_cpus=num_cpus)
