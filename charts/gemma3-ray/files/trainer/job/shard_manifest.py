"""The streaming dataset's manifest (`gemma3-ray data shard` writes it): read and checked by the driver before any
worker starts.

A streaming `dataset_name` is a gs:// prefix (or a local directory) holding `manifest.json` and the shards it
lists, each with its rows, its first row's index, its size, sha256 and md5. The driver checks, without reading
a row: the manifest is whole (every key, types, contiguous row ranges that add up to its row count), the columns
the run maps are there, and every shard is there with its size and md5 (a gs:// object's md5 is its metadata;
a local file is hashed). Anything else is one sentence naming the shard or the column, before any GPU starts.
Every shard's bytes are checked against the manifest's sha256 again when the stream reads them
(``trainer.job.shard_read``), on gs:// as on a local disk (``NO_MD5_RULE``: an object without an md5).

Standard library and pyarrow (which comes with Ray) only.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

MANIFEST_FILE = "manifest.json"
FORMAT = "gemma3-ray-shards/1"
SHARD_SUFFIX = {"parquet": "parquet", "webdataset": "tar"}
ROW_ID = "_row"
HASH_CHUNK = 1 << 20
SHARD_KEYS = {"name": str, "rows": int, "first_row": int, "bytes": int, "sha256": str, "md5": str}


# A gs:// object GCS gives no md5 (a composite object, e.g. from a parallel composite upload) is not skipped:
NO_MD5_RULE = ("a gs:// shard without an md5 (a composite object) is checked by its size on the head and by the "
               "manifest's sha256 of its bytes when the stream reads it, as every shard is")


class ManifestError(ValueError):
    """The manifest or a shard is not what `data shard` wrote; the message names it and the fix."""


@dataclass(frozen=True)
class Shard:
    name: str
    uri: str
    rows: int
    first_row: int
    size: int
    sha256: str
    md5: str


@dataclass(frozen=True)
class ShardSet:
    """A checked streaming dataset: where it is, its shards in manifest order and what the rows hold."""

    root: str
    shard_format: str  # parquet | webdataset
    rows: int
    columns: dict[str, str]
    image_column: str
    content_sha256: str  # the data's identity (over every shard's sha256)
    shards: tuple[Shard, ...]

    def uris(self) -> list[str]:
        return [s.uri for s in self.shards]


def _rewrite(root: str) -> str:
    return f"`gemma3-ray data shard SOURCE --to {root} --apply`"


def parse(raw: bytes | None, root: str) -> ShardSet:
    """The manifest at `root`, checked as a whole; ManifestError naming what is wrong otherwise."""
    where = f"{root}/{MANIFEST_FILE}"
    if raw is None:
        raise ManifestError(f"dataset_name: {root} has no {MANIFEST_FILE}: a streaming dataset is the shards "
                            f"`gemma3-ray data shard` writes; write them with {_rewrite(root)}")
    try:
        obj = json.loads(raw)
    except ValueError as e:
        raise ManifestError(f"{where} is not JSON ({e}); write the shards again with {_rewrite(root)}") from e
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        found = obj.get("format") if isinstance(obj, dict) else type(obj).__name__
        raise ManifestError(f"{where}: format {found!r}, this trainer reads {FORMAT!r}; write the shards with "
                            f"{_rewrite(root)}")
    problems = []
    for key, kind in (("rows", int), ("columns", dict), ("image_column", str), ("shard_format", str),
                      ("content_sha256", str), ("shards", list)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            problems.append(f"{key} is not a{'n' if kind is int else ''} {kind.__name__}")
    if problems:
        raise ManifestError(f"{where}: {'; '.join(problems)}; write the shards again with {_rewrite(root)}")
    if obj["shard_format"] not in SHARD_SUFFIX:
        raise ManifestError(f"{where}: shard_format {obj['shard_format']!r} is not one of {sorted(SHARD_SUFFIX)}")
    shards, next_row = [], 0
    for i, entry in enumerate(obj["shards"]):
        bad = [k for k, kind in SHARD_KEYS.items() if not isinstance((entry or {}).get(k), kind)
               or isinstance(entry.get(k), bool)] if isinstance(entry, dict) else list(SHARD_KEYS)
        if bad:
            raise ManifestError(f"{where}: shard {i} lacks a valid {', '.join(bad)}; write the shards again with "
                                f"{_rewrite(root)}")
        name = entry["name"]
        if "/" in name or "\\" in name or name in ("", ".", "..", MANIFEST_FILE) or \
                not name.endswith("." + SHARD_SUFFIX[obj["shard_format"]]):
            raise ManifestError(f"{where}: shard {i} is named {name!r}, not a {obj['shard_format']} file beside the "
                                "manifest")
        if entry["first_row"] != next_row or entry["rows"] < 1 or entry["bytes"] < 1:
            raise ManifestError(f"{where}: {name} starts at row {entry['first_row']} with {entry['rows']} rows, "
                                f"the shards before it end at row {next_row}: the manifest is not one dataset")
        next_row += entry["rows"]
        shards.append(Shard(name, f"{root}/{name}", entry["rows"], entry["first_row"], entry["bytes"],
                            entry["sha256"], entry["md5"]))
    if next_row != obj["rows"] or not shards:
        raise ManifestError(f"{where}: its shards hold {next_row} rows, it says {obj['rows']}; write the shards again "
                            f"with {_rewrite(root)}")
    return ShardSet(root, obj["shard_format"], obj["rows"], dict(obj["columns"]), obj["image_column"],
                    obj["content_sha256"], tuple(shards))


def check_columns(shards: ShardSet, mapping: dict[str, str]) -> None:
    """Every column the run maps is in the shards; else one sentence naming them (before any GPU starts)."""
    missing = {f: c for f, c in mapping.items() if c not in shards.columns}
    if missing:
        wanted = ", ".join(f"{c!r} (for {f})" for f, c in missing.items())
        raise ManifestError(
            f"dataset {shards.root}: missing column(s) {wanted}. Its shards have {sorted(set(shards.columns) - {ROW_ID})}. "
            f'Rename them with --column_mapping, e.g. --column_mapping={{"{next(iter(missing))}":"<your column>"}}.')
    image = mapping.get("image")
    if image is not None and image != shards.image_column:
        raise ManifestError(f"dataset {shards.root}: the image column is {shards.image_column!r} (its shards hold its "
                            f"bytes), the run maps image to {image!r}: use --column_mapping="
                            f'{{"image":"{shards.image_column}"}}')


def _md5_of(fs, path: str) -> str:
    with fs.open_input_file(path) as fh:
        meta = {(k.decode() if isinstance(k, bytes) else k): v for k, v in dict(fh.metadata() or {}).items()}
    md5 = meta.get("md5Hash", b"")
    return md5.decode() if isinstance(md5, bytes) else str(md5)


def _hashes(fs, path: str) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    with fs.open_input_stream(path) as src:
        while chunk := src.read(HASH_CHUNK):
            sha.update(chunk)
            md5.update(chunk)
    return sha.hexdigest(), base64.b64encode(md5.digest()).decode()


def _fix(root: str) -> str:
    return f"write it again: delete it and {MANIFEST_FILE}, then run {_rewrite(root)} with the same source and flags"


def missing(root: str, name: str) -> ManifestError:
    return ManifestError(f"dataset {root}: shard {name} is missing ({MANIFEST_FILE} lists it); {_fix(root)}")


def other_hash(root: str, name: str, kind: str) -> ManifestError:
    return ManifestError(f"dataset {root}: shard {name} has another {kind} than {MANIFEST_FILE} records (it changed "
                         f"after it was written); {_fix(root)}")


def check_shards(shards: ShardSet, fs, base: str, is_gcs: bool, hash_local: bool = True) -> None:
    """Every shard the manifest lists is there, with its size and md5 (gs://: its metadata, NO_MD5_RULE without
    one; local: hashed unless `hash_local` is off); else ManifestError naming the first shard that is not."""
    import pyarrow.fs as pafs

    found = {i.path.rsplit("/", 1)[-1]: i for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))}
    for shard in shards.shards:
        info = found.get(shard.name)
        if info is None or info.type != pafs.FileType.File:
            raise missing(shards.root, shard.name)
        if info.size != shard.size:
            raise ManifestError(f"dataset {shards.root}: shard {shard.name} has {info.size} bytes, {MANIFEST_FILE} "
                                f"says {shard.size} (damaged or cut short); {_fix(shards.root)}")
        if is_gcs:
            md5 = _md5_of(fs, info.path)
            if md5 and md5 != shard.md5:
                raise other_hash(shards.root, shard.name, "md5")
        elif hash_local and _hashes(fs, info.path)[0] != shard.sha256:
            raise other_hash(shards.root, shard.name, "sha256")


def load(fs, base: str, root: str, is_gcs: bool, mapping: dict[str, str] | None = None) -> ShardSet:
    """The checked ShardSet at `root` (pyarrow `fs` and its path `base`): manifest, columns, every shard."""
    import pyarrow.fs as pafs

    path = f"{base}/{MANIFEST_FILE}"
    raw = None
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as src:
            raw = src.read()
    shards = parse(raw, root)
    if mapping is not None:
        check_columns(shards, mapping)
    check_shards(shards, fs, base, is_gcs)
    return shards


def to_config(shards: ShardSet) -> dict[str, Any]:
    """The checked set as plain data (it travels to the workers in the train config)."""
    return {"root": shards.root, "shard_format": shards.shard_format, "rows": shards.rows,
            "columns": shards.columns, "image_column": shards.image_column,
            "content_sha256": shards.content_sha256,
            "shards": [{"name": s.name, "uri": s.uri, "rows": s.rows, "first_row": s.first_row, "size": s.size,
                        "sha256": s.sha256, "md5": s.md5} for s in shards.shards]}


def from_config(obj: dict[str, Any]) -> ShardSet:
    return ShardSet(obj["root"], obj["shard_format"], obj["rows"], dict(obj["columns"]), obj["image_column"],
                    obj["content_sha256"], tuple(Shard(s["name"], s["uri"], s["rows"], s["first_row"], s["size"],
                                                       s["sha256"], s["md5"]) for s in obj["shards"]))


def check_for_run(args) -> ShardSet:
    """The run's streaming dataset (`dataset_name`), checked as a whole on the head; UsageError otherwise."""
    from trainer.job.flag_values import column_mapping
    from trainer.job.flags import UsageError
    from trainer.job.storage import filesystem, storage_at

    root = args.dataset_name.rstrip("/")
    try:
        fs, base = filesystem(root, storage_at(root).emulator_host)
        return load(fs, base, root, root.startswith("gs://"), column_mapping(args))
    except ManifestError as e:
        raise UsageError(str(e)) from e
    except OSError as e:
        if not denied(e):
            raise
        raise UsageError(forbidden(root, e)) from e


def denied(error: BaseException) -> bool:
    """Whether `error` is a refusal to read (pyarrow: PermissionError for a local EACCES and for GCS's 403)."""
    return isinstance(error, PermissionError) or "PERMISSION_DENIED" in str(error)


def forbidden(root: str, error: BaseException) -> str:
    """One sentence for a dataset the job may not read: no retry gives it the permission."""
    why = str(error).splitlines()[0] if str(error) else type(error).__name__
    why = why.split("Status(", 1)[-1].rstrip(")") if "Status(" in why else why
    return (f"dataset {root}: the job may not read it ({why}): grant the job's service account "
            "roles/storage.objectViewer on the bucket (or the prefix), or use a dataset it can read")


def changed_shard(config: dict[str, Any]) -> str | None:
    """After a stream failed: the first shard of the checked set (`to_config`'s) that is no longer what the manifest
    records (missing, another size, another md5; metadata only), or one the job may no longer read, as one
    sentence; None when every shard is still as checked."""
    from trainer.job.storage import filesystem, storage_at

    shards = from_config(config)
    try:
        fs, base = filesystem(shards.root, storage_at(shards.root).emulator_host)
        check_shards(shards, fs, base, shards.root.startswith("gs://"), hash_local=False)
    except ManifestError as e:
        return str(e)
    except OSError as e:
        return forbidden(shards.root, e) if denied(e) else None
    return None
