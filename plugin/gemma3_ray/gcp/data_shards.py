"""`data shard`: a dataset as shards of a chosen size in the bucket, with the manifest the trainer checks.

Shards are parquet (or WebDataset .tar) files of whole rows, each about `shard_bytes` of row data, named
`shard-NNNNN.<ext>` under the destination prefix. Each row keeps its index in the source (`_row`) and its
image as bytes. After every shard, `_shard_progress.json` records the shards written so far (name, rows,
first row, size, sha256, md5), so an interrupted run resumes at the next shard: the shards already there are
checked against that record and kept. `manifest.json` is written last, from the same records; the trainer's
streaming path reads it (trainer/job/shard_manifest.py: the same format).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gemma3_ray.gcp.shard_source import ROW_ID, Source, image_value, rows
from gemma3_ray.utils.errors import EXIT_USAGE, UserError

MANIFEST = "manifest.json"
PROGRESS = "_shard_progress.json"
FORMAT = "gemma3-ray-shards/1"
SHARD_FORMATS = {"parquet": "parquet", "webdataset": "tar"}
PARQUET_ROW_GROUP_ROWS = 256  # Ray Data reads a shard in row groups: a small one keeps a worker's memory small
HASH_CHUNK = 1 << 20


class DestinationError(UserError):
    """The destination holds something else (another dataset's shards) or a shard that does not verify."""

    exit_code = EXIT_USAGE


class Destination(Protocol):
    def uri(self, name: str) -> str: ...
    def get(self, name: str) -> bytes | None: ...
    def stat(self, name: str) -> tuple[int, str] | None: ...  # (size, base64 md5) or None when missing
    def put_file(self, name: str, local: Path) -> None: ...
    def put_bytes(self, name: str, data: bytes) -> None: ...
    def delete(self, name: str) -> None: ...


@dataclass
class GcsDestination:
    """gs://bucket/prefix through the google-cloud-storage client (an upload appears whole or not at all)."""

    client: Any
    bucket: str
    prefix: str

    def _blob(self, name: str) -> Any:
        return self.client.bucket(self.bucket).blob(f"{self.prefix}/{name}" if self.prefix else name)

    def uri(self, name: str) -> str:
        return f"gs://{self.bucket}/{self.prefix}/{name}" if self.prefix else f"gs://{self.bucket}/{name}"

    def get(self, name: str) -> bytes | None:
        blob = self._blob(name)
        return blob.download_as_bytes() if blob.exists() else None

    def stat(self, name: str) -> tuple[int, str] | None:
        blob = self.client.bucket(self.bucket).get_blob(f"{self.prefix}/{name}" if self.prefix else name)
        return None if blob is None else (int(blob.size), blob.md5_hash or "")

    def put_file(self, name: str, local: Path) -> None:
        self._blob(name).upload_from_filename(str(local))

    def put_bytes(self, name: str, data: bytes) -> None:
        self._blob(name).upload_from_string(data)

    def delete(self, name: str) -> None:
        blob = self._blob(name)
        if blob.exists():
            blob.delete()


@dataclass
class LocalDestination:
    """A local directory (a file is written under a temporary name and renamed: it appears whole)."""

    root: Path

    def uri(self, name: str) -> str:
        return str(self.root / name)

    def get(self, name: str) -> bytes | None:
        path = self.root / name
        return path.read_bytes() if path.is_file() else None

    def stat(self, name: str) -> tuple[int, str] | None:
        path = self.root / name
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            return path.stat().st_size, file_hashes(fh)[1]

    def put_file(self, name: str, local: Path) -> None:
        self.put_bytes(name, local.read_bytes())

    def put_bytes(self, name: str, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{name}.part"
        tmp.write_bytes(data)
        tmp.replace(self.root / name)

    def delete(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


def destination(to: str, storage: Callable[[], Any]) -> Destination:
    if to.startswith("gs://"):
        bucket, _, prefix = to[len("gs://"):].partition("/")
        if not bucket:
            raise DestinationError(f"--to {to}: name a bucket, e.g. gs://my-bucket/datasets/products")
        return GcsDestination(storage(), bucket, prefix.strip("/"))
    return LocalDestination(Path(to))


def file_hashes(fh: Any) -> tuple[str, str]:
    """(sha256 hex, md5 base64 as GCS writes md5Hash) of an open binary file."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    while chunk := fh.read(HASH_CHUNK):
        sha.update(chunk)
        md5.update(chunk)
    return sha.hexdigest(), base64.b64encode(md5.digest()).decode()


@dataclass(frozen=True)
class Settings:
    shard_bytes: int
    shard_format: str  # parquet | webdataset
    image_column: str

    def key(self, src: Source) -> str:
        """What the shards depend on: the source and these settings (a resume with others is refused)."""
        text = json.dumps({"source": src.identity(), "shard_bytes": self.shard_bytes, "format": self.shard_format,
                           "image_column": self.image_column}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def shard_name(index: int, shard_format: str) -> str:
    return f"shard-{index:05d}.{SHARD_FORMATS[shard_format]}"


def row_size(row: dict[str, Any], image_column: str) -> int:
    """The bytes a row adds to a shard (its image and its other values), before compression."""
    image = row[image_column].get("bytes") or b""
    return len(image) + sum(len(str(v)) for k, v in row.items() if k != image_column)


def shard_rows(src: Source, settings: Settings, start: int) -> Iterator[list[dict[str, Any]]]:
    """The rows from `start` on, images read, cut into shards of about `shard_bytes` each (a shard ends after
    the row that reaches the size; where a shard ends depends only on the rows from its start)."""
    batch: list[dict[str, Any]] = []
    size = 0
    for row in rows(src, start):
        row[settings.image_column] = image_value(src, row.get(settings.image_column))
        batch.append(row)
        size += row_size(row, settings.image_column)
        if size >= settings.shard_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _image_ext(data: bytes | None) -> str:
    if not data:
        return "missing"
    for magic, ext in ((b"\x89PNG", "png"), (b"\xff\xd8", "jpg"), (b"GIF8", "gif"), (b"BM", "bmp")):
        if data.startswith(magic):
            return ext
    return "webp" if data[8:12] == b"WEBP" else "img"


def write_shard(batch: list[dict[str, Any]], settings: Settings, columns: list[str], path: Path) -> None:
    """One shard file at `path`: parquet (the source's columns, the image as {bytes, path}, and _row) or a
    WebDataset tar (per row `<_row>.json` with the other columns and `<_row>.<ext>` with the image)."""
    if settings.shard_format == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist([{c: r.get(c) for c in [*columns, ROW_ID]} for r in batch])
        image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        table = table.cast(pa.schema([pa.field(f.name, image) if f.name == settings.image_column else
                                      pa.field(f.name, pa.int64()) if f.name == ROW_ID else f for f in table.schema]))
        pq.write_table(table, str(path), row_group_size=PARQUET_ROW_GROUP_ROWS)
        return
    with tarfile.open(path, "w") as tar:
        for r in batch:
            key = f"{r[ROW_ID]:010d}"
            image = r[settings.image_column]
            meta = {c: r.get(c) for c in columns if c != settings.image_column}
            meta[ROW_ID] = r[ROW_ID]
            meta[f"{settings.image_column}_path"] = image.get("path")
            for name, data in ((f"{key}.json", json.dumps(meta, default=str).encode()),
                               (f"{key}.{_image_ext(image.get('bytes'))}", image.get("bytes") or b"")):
                info = tarfile.TarInfo(name)
                info.size, info.mtime = len(data), 0  # no time in the bytes: the same rows give the same shard
                tar.addfile(info, io.BytesIO(data))


@dataclass
class State:
    """What the destination holds for this source and settings: the shards done, and whether it is complete."""

    done: list[dict[str, Any]]
    complete: bool


def read_state(dest: Destination, src: Source, settings: Settings) -> State:
    """The shards already written for the same source and settings (manifest, else progress record); refuses a
    destination that holds another dataset's shards, and names a recorded shard that is missing or changed."""
    key = settings.key(src)
    for name, complete in ((MANIFEST, True), (PROGRESS, False)):
        raw = dest.get(name)
        if raw is None:
            continue
        try:
            record = json.loads(raw)
            found_key, shards = record["key"], list(record["shards"])
        except (ValueError, KeyError, TypeError) as e:
            raise DestinationError(f"{dest.uri(name)} is not a shard {'manifest' if complete else 'progress record'} "
                                   f"this command wrote ({type(e).__name__}); delete it or choose another --to") from e
        if found_key != key:
            raise DestinationError(f"{dest.uri('')} holds the shards of another dataset or other settings ({name}); "
                                   "choose another --to, or delete that prefix first")
        for shard in shards:
            problem = shard_problem(dest, shard)
            if problem:
                if complete:
                    raise DestinationError(f"{dest.uri(shard['name'])} {problem}: run `gemma3-ray data shard` with "
                                           "the same flags after deleting it and manifest.json to write it again")
                return State(done=_before(shards, shard), complete=False)  # written again from there
        return State(done=shards, complete=complete)
    return State(done=[], complete=False)


def _before(shards: list[dict[str, Any]], bad: dict[str, Any]) -> list[dict[str, Any]]:
    return shards[: shards.index(bad)]


def shard_problem(dest: Destination, shard: dict[str, Any]) -> str | None:
    """Why a recorded shard is not what was written (missing, another size, another md5), or None."""
    found = dest.stat(shard["name"])
    if found is None:
        return "is missing"
    size, md5 = found
    if size != shard["bytes"]:
        return f"has {size} bytes, its record says {shard['bytes']}"
    if md5 and md5 != shard["md5"]:
        return "has another md5 than its record (it changed after it was written)"
    return None


def manifest(src: Source, settings: Settings, shards: list[dict[str, Any]], columns: dict[str, str]) -> dict[str, Any]:
    digest = hashlib.sha256("".join(s["sha256"] for s in shards).encode()).hexdigest()
    return {"format": FORMAT, "key": settings.key(src), "shard_format": settings.shard_format,
            "image_column": settings.image_column, "row_id_column": ROW_ID,
            "rows": sum(s["rows"] for s in shards), "columns": columns, "content_sha256": digest,
            "source": src.identity(), "shards": shards}


class Progress:
    """A progress bar on stderr: one line redrawn on a terminal, a line per shard elsewhere (logs)."""

    def __init__(self, total_rows: int | None, stream: Any = None):
        self.total, self.stream = total_rows, stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()

    def update(self, shards: int, rows_done: int, written: int) -> None:
        rate = rows_done / max(time.monotonic() - self.started, 1e-6)
        if self.total:
            filled = int(30 * rows_done / max(self.total, 1))
            bar = f"[{'#' * filled}{'.' * (30 - filled)}] {rows_done}/{self.total} rows"
        else:
            bar = f"{rows_done} rows"
        line = f"{bar}, {shards} shards, {written / 1e6:.1f} MB, {rate:.0f} rows/s"
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def write_all(src: Source, dest: Destination, settings: Settings, state: State, out: Callable[[str], None],
              progress: Progress) -> dict[str, Any]:
    """Write the shards after those `state` holds, recording each in the progress record as it lands, then the
    manifest; returns the manifest."""
    shards = list(state.done)
    start = shards[-1]["first_row"] + shards[-1]["rows"] if shards else 0
    columns = list(src.columns)
    written = sum(s["bytes"] for s in shards)
    with tempfile.TemporaryDirectory(prefix="gemma3-ray-shard-") as tmp:
        for batch in shard_rows(src, settings, start):
            name = shard_name(len(shards), settings.shard_format)
            local = Path(tmp) / name
            write_shard(batch, settings, columns, local)
            with open(local, "rb") as fh:
                sha, md5 = file_hashes(fh)
            dest.put_file(name, local)
            local.unlink()
            record = {"name": name, "rows": len(batch), "first_row": batch[0][ROW_ID], "bytes": local_size(sha, dest,
                                                                                                          name),
                      "sha256": sha, "md5": md5, "missing_images": sum(1 for r in batch
                                                                       if not r[settings.image_column]["bytes"])}
            shards.append(record)
            written += record["bytes"]
            dest.put_bytes(PROGRESS, json.dumps({"key": settings.key(src), "shards": shards}, indent=1).encode())
            progress.update(len(shards), start_rows(shards), written)
    progress.close()
    if not shards:
        raise DestinationError(f"source {src.name} has no rows: nothing to shard")
    columns_out = {**src.columns, settings.image_column: "struct<bytes: binary, path: string>", ROW_ID: "int64"}
    result = manifest(src, settings, shards, columns_out)
    dest.put_bytes(MANIFEST, json.dumps(result, indent=1).encode())
    dest.delete(PROGRESS)
    return result


def local_size(_sha: str, dest: Destination, name: str) -> int:
    """The size of the shard as the destination holds it (what the trainer's check compares)."""
    found = dest.stat(name)
    if found is None:
        raise DestinationError(f"{dest.uri(name)} is missing right after it was written")
    return found[0]


def start_rows(shards: list[dict[str, Any]]) -> int:
    return shards[-1]["first_row"] + shards[-1]["rows"] if shards else 0
