"""The dataset `data shard` reads: parquet or jsonl files (local or gs://) or a Hugging Face dataset, row by row.

Every row keeps its index in the source (`_row` in the shards: the id the trainer's bad-row counts name), and
its image becomes bytes (a path next to the data or in the bucket is read once, here), so the shards hold all
the trainer needs. The schema is read and checked before anything is written: every file must have the same
columns and types, the image column must exist, and no column may be called `_row`.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gemma3_ray.utils.errors import EXIT_USAGE, UserError

ROW_ID = "_row"  # the row's index in the source; the trainer names rows by it
SUFFIXES = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}
READ_BATCH_ROWS = 256


class SourceError(UserError):
    """The source cannot be sharded as it is (missing, mixed kinds, a schema that does not match)."""

    exit_code = EXIT_USAGE


@dataclass
class Source:
    """A dataset to shard: where it is, its files (none for a Hugging Face dataset), their kind, columns
    ({name: type}), the row count when it is known without reading the rows, and how to read image paths."""

    name: str
    kind: str  # parquet | jsonl | hf
    files: list[str]
    columns: dict[str, str]
    rows: int | None
    image_column: str
    read_file: Callable[[str], bytes | None]  # a path (local or gs://) -> its bytes, None if missing
    base: str  # relative image paths resolve against it
    hf: Any = field(default=None, repr=False)  # the Hugging Face dataset (streaming), for kind hf
    opener: Callable[[str], Any] | None = field(default=None, repr=False)  # gs:// path -> a seekable reader

    def identity(self) -> dict[str, Any]:
        """What the source is, for the manifest and the resume check (its files' names; not their bytes)."""
        return {"name": self.name, "kind": self.kind, "files": [posixpath.basename(f) for f in self.files],
                "rows": self.rows, "columns": self.columns}


def _gcs_split(uri: str) -> tuple[str, str]:
    bucket, _, name = uri[len("gs://"):].partition("/")
    return bucket, name


def open_source(name: str, image_column: str, storage: Callable[[], Any], hf_split: str = "train") -> Source:
    """The source `name`: a local/gs:// .parquet/.jsonl file or a directory/prefix of them, else a Hugging
    Face dataset id. `storage` makes the Cloud Storage client (only called for gs:// names)."""
    if name.startswith("gs://"):
        client = storage()
        bucket, prefix = _gcs_split(name)
        blobs = [b.name for b in client.list_blobs(bucket, prefix=prefix.rstrip("/"))]
        files = sorted(f"gs://{bucket}/{b}" for b in blobs
                       if (b == prefix or b.startswith(prefix.rstrip("/") + "/")) and Path(b).suffix in SUFFIXES)

        def read_file(path: str) -> bytes | None:
            b, n = _gcs_split(path)
            blob = client.bucket(b).blob(n)
            try:
                return blob.download_as_bytes()
            except Exception as e:  # noqa: BLE001 - google's NotFound: the row has no image
                if type(e).__name__ == "NotFound":
                    return None
                raise

        def opener(path: str) -> Any:
            b, n = _gcs_split(path)
            return client.bucket(b).blob(n).open("rb")  # seekable: parquet reads only the parts it needs

        base = name.rstrip("/") if files and files[0] != name else name.rsplit("/", 1)[0]
        src = _file_source(name, files, image_column, read_file, base, opener)
        return src
    path = Path(name)
    if path.exists():
        files = [str(path)] if path.is_file() else sorted(str(p) for p in path.rglob("*") if p.suffix in SUFFIXES)

        def read_local(p: str) -> bytes | None:
            if p.startswith("gs://"):
                b, n = _gcs_split(p)
                try:
                    return storage().bucket(b).blob(n).download_as_bytes()
                except Exception as e:  # noqa: BLE001
                    if type(e).__name__ == "NotFound":
                        return None
                    raise
            try:
                return Path(p).read_bytes()
            except OSError:
                return None

        base = str(path.resolve() if path.is_dir() else path.resolve().parent)
        return _file_source(name, files, image_column, read_local, base)
    if name.startswith((".", "/")) or name.count("/") > 1:
        raise SourceError(f"source {name}: no such file or directory (a .parquet/.jsonl file, a directory or gs:// "
                          "prefix of them, or a Hugging Face dataset id like org/name)")
    return _hf_source(name, image_column, hf_split)


def _file_source(name: str, files: list[str], image_column: str, read_file: Callable[[str], bytes | None],
                 base: str, opener: Callable[[str], Any] | None = None) -> Source:
    kinds = {SUFFIXES[Path(f).suffix] for f in files}
    if not files:
        raise SourceError(f"source {name}: no .parquet or .jsonl files there")
    if len(kinds) != 1:
        raise SourceError(f"source {name}: mixes parquet and jsonl files; shard one kind at a time")
    kind = kinds.pop()
    columns: dict[str, str] | None = None
    rows: int | None = 0
    for f in files:
        got, n = _file_schema(f, kind, read_file, opener)
        if columns is None:
            columns = got
        elif got != columns:
            diff = sorted(set(got.items()) ^ set(columns.items()))
            raise SourceError(f"source {name}: {posixpath.basename(f)} has another schema than "
                              f"{posixpath.basename(files[0])} (differs in {', '.join(c for c, _ in diff[:3])}); "
                              "shard files of one schema together")
        rows = None if rows is None or n is None else rows + n
    src = Source(name, kind, files, columns or {}, rows, image_column, read_file, base, opener=opener)
    check_columns(src)
    return src


def _file_schema(path: str, kind: str, read_file: Callable[[str], bytes | None],
                 opener: Callable[[str], Any] | None) -> tuple[dict[str, str], int | None]:
    """({column: type}, rows) of one file: parquet from its footer, jsonl from every line (rows counted)."""
    if kind == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(opener(path) if opener and path.startswith("gs://") else path)
        return {f.name: str(f.type) for f in pf.schema_arrow}, pf.metadata.num_rows
    raw = _read_text(path, read_file)
    lines = [line for line in raw.splitlines() if line.strip()]
    if not lines:
        return {}, 0
    return _jsonl_schema(path, lines), len(lines)


def _jsonl_schema(path: str, lines: list[str]) -> dict[str, str]:
    """{column: type} over every line (a column's first appearance sets its place): int and float mix as double, a
    null takes the column's type; any other mix is one sentence naming the column and both lines (it would end the
    write part way, in pyarrow)."""
    types: dict[str, str] = {}
    since: dict[str, int] = {}
    for number, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SourceError(f"{path}: line {number} is not JSON ({e.msg})") from e
        if not isinstance(obj, dict):
            raise SourceError(f"{path}: line {number} is not a JSON object")
        for key, value in obj.items():
            kind, old = _json_type(value), types.get(key)
            if old in (None, "null") or (old, kind) == ("int64", "double"):
                types[key], since[key] = kind, number
            elif kind not in ("null", old) and (old, kind) != ("double", "int64"):
                raise SourceError(f"{path}: column {key!r} is {old} on line {since[key]} and {kind} on line {number}; "
                                  "give a column one type on every line")
    return types


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "struct"
    return {bool: "bool", int: "int64", float: "double", str: "string"}.get(type(value), "null" if value is None
                                                                           else type(value).__name__)


def _read_text(path: str, read_file: Callable[[str], bytes | None]) -> str:
    data = read_file(path) if path.startswith("gs://") else Path(path).read_bytes()
    return (data or b"").decode("utf-8")


def _hf_source(name: str, image_column: str, split: str) -> Source:
    try:
        import datasets
    except ImportError as e:
        raise SourceError(f"source {name}: a Hugging Face dataset needs the `datasets` package (pip install "
                          "datasets), or give a parquet/jsonl file") from e
    try:
        ds = datasets.load_dataset(name, split=split, streaming=True)
    except Exception as e:  # noqa: BLE001 - not found, offline, no such split: one sentence
        raise SourceError(f"source {name}: cannot open it as a Hugging Face dataset ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:160]})") from e
    features = ds.features or {}
    if image_column in features and isinstance(features[image_column], datasets.Image):
        ds = ds.cast_column(image_column, datasets.Image(decode=False))
    info = getattr(ds, "info", None)
    splits = getattr(info, "splits", None) or {}
    rows = splits[split].num_examples if split in splits else None
    columns = {k: type(v).__name__ if not hasattr(v, "dtype") else str(v.dtype) for k, v in features.items()}
    src = Source(name, "hf", [], columns, rows, image_column, lambda p: None, ".", hf=ds)
    check_columns(src)
    return src


def check_columns(src: Source) -> None:
    if src.image_column not in src.columns:
        raise SourceError(f"source {src.name}: no image column {src.image_column!r} (columns: "
                          f"{', '.join(sorted(src.columns)) or 'none'}); name it with --image-column")
    if ROW_ID in src.columns:
        raise SourceError(f"source {src.name}: has a column {ROW_ID!r}, the name the shards give each row's index; "
                          "rename it first")


def rows(src: Source, start: int = 0) -> Iterator[dict[str, Any]]:
    """The source's rows from index `start` on, each with its index in ROW_ID, image not yet read."""
    index = 0
    if src.kind == "hf":
        for row in src.hf:
            if index >= start:
                yield {**row, ROW_ID: index}
            index += 1
        return
    for path in src.files:
        if src.kind == "parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(src.opener(path) if src.opener and path.startswith("gs://") else path)
            if index + pf.metadata.num_rows <= start:  # a file wholly before the resume point: not read
                index += pf.metadata.num_rows
                continue
            for batch in pf.iter_batches(batch_size=READ_BATCH_ROWS):
                for row in batch.to_pylist():
                    if index >= start:
                        yield {**row, ROW_ID: index}
                    index += 1
        else:
            for n, line in enumerate(_read_text(path, src.read_file).splitlines(), 1):
                if not line.strip():
                    continue
                if index >= start:
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise SourceError(f"{path}: line {n} is not JSON ({e.msg})") from e
                    yield {**row, ROW_ID: index}
                index += 1


def image_value(src: Source, value: Any) -> dict[str, Any]:
    """The image as the shards store it: {bytes, path} (bytes None when the image cannot be found: the trainer
    counts such a row as missing_image, it is not dropped here)."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
    elif isinstance(value, bytes | bytearray):
        data, path = bytes(value), None
    else:
        data, path = None, str(value) if value else None
    if not data and path:
        full = path if path.startswith("gs://") or posixpath.isabs(path) else f"{src.base}/{path}"
        data = src.read_file(full)
    return {"bytes": bytes(data) if data else None, "path": path}
