"""The dataset checked on the Ray head before any worker starts: its columns, and its row count where the
files' metadata says it (parquet), with Ray alone (pyarrow comes with Ray Train; no `datasets`, no torch).

The workers' loading (trainer.data.dataset) reads the same sources by the same rules: a hub id, or
local/gs:// parquet/jsonl files (a gs:// prefix's data files copied once per node, images left in the bucket).
"""

from __future__ import annotations

import json
from pathlib import Path

from trainer.job.flag_values import column_mapping
from trainer.job.flags import TrainArguments, UsageError
from trainer.job.node_cache import copy_data_files, per_process
from trainer.job.storage import cache_root, filesystem

DATA_SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


def is_file_source(name: str) -> bool:
    return name.startswith("gs://") or name.startswith("/") or name.startswith(".") or Path(name).exists()


def data_files(name: str, local: Path) -> tuple[list[Path], str]:
    """The data files under a local path and the builder that reads them (parquet or json)."""
    files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.suffix in DATA_SUFFIXES)
    kinds = {DATA_SUFFIXES.get(p.suffix) for p in files}
    if not files or None in kinds or len(kinds) != 1:
        raise UsageError(
            f"dataset_name: {name} must be one .parquet/.jsonl file or a directory of one kind of them "
            f"(found {[p.name for p in files][:5]})"
        )
    return files, kinds.pop()


def check_schema(columns: list[str], mapping: dict[str, str], source: str) -> None:
    """Fail before any model download when a mapped column is missing."""
    missing = {f: c for f, c in mapping.items() if c not in columns}
    if missing:
        wanted = ", ".join(f"{c!r} (for {f})" for f, c in missing.items())
        raise UsageError(
            f"dataset {source}: missing column(s) {wanted}. Expected columns {sorted(set(mapping.values()))}, "
            f"found {sorted(columns)}. Rename them with --column_mapping, "
            f'e.g. --column_mapping={{"{next(iter(missing))}":"<your column>"}}.'
        )


def gcs(emulator_host: str | None):
    """gs:// URI -> (this process's GCS filesystem, path): one client per process, not one per image."""
    return per_process(emulator_host or "", lambda: filesystem("gs://", emulator_host)[0])


def check_dataset_before_download(args: TrainArguments, emulator_host: str | None, version: str = "") -> int | None:
    """Columns of the data, checked before any model download (reads only the schema where it can); the number of
    rows when it is known without reading them (parquet metadata), else None. Runs on the driver, i.e. on a head
    with Ray alone (pyarrow comes with Ray Train): a Hub dataset, which needs `datasets`, is left to the workers."""
    mapping = column_mapping(args)
    name = args.dataset_name
    if not is_file_source(name):
        return None  # the workers load it (and check its columns) with `datasets`
    if name.startswith("gs://"):  # the node copy of the data files, the one the workers read
        try:
            path = copy_data_files(name, cache_root(args), gcs(emulator_host), set(DATA_SUFFIXES), version)
        except FileNotFoundError as e:
            raise UsageError(f"dataset_name: {name} does not exist") from e
    else:
        path = Path(name)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in DATA_SUFFIXES)
    if not files:
        raise UsageError(f"dataset_name: no .parquet/.jsonl files at {name}")
    rows = None
    if files[0].suffix == ".parquet":
        import pyarrow.parquet as pq

        columns = pq.read_schema(files[0]).names
        rows = sum(pq.read_metadata(f).num_rows for f in files if f.suffix == ".parquet")
    else:
        with open(files[0]) as fh:
            first = fh.readline()
        columns = list(json.loads(first).keys()) if first.strip() else []
    check_schema(columns, mapping, name)
    return rows
