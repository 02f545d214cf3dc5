"""`data shard`: a parquet/jsonl/Hugging Face dataset as shards in the bucket for the trainer's streaming path."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any

from gemma3_ray.cli import apply_flag
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp import data_shards
from gemma3_ray.gcp.shard_source import open_source
from gemma3_ray.utils import plan
from gemma3_ray.utils.errors import EXIT_USAGE, NotLoggedIn, UserError

Out = Callable[[str], None]
DEFAULT_SHARD_SIZE = "256MB"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


class BadFlag(UserError):
    exit_code = EXIT_USAGE


def _out(line: str) -> None:
    print(line, flush=True)


def parse_size(text: str) -> int:
    """'256MB', '1GiB', '500k', '4096' -> bytes; a BadFlag sentence otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text or "")
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS or float(m.group(1)) * _UNITS[unit] < 1:
        raise BadFlag(f"--shard-size {text!r}: give a size such as 256MB, 1GiB or 64MiB (bytes of row data per shard)")
    return int(float(m.group(1)) * _UNITS[unit])


def cmd_shard(args: argparse.Namespace, clients: Clients | None, out: Out = _out, stream: Any = None) -> int:
    settings = data_shards.Settings(parse_size(args.shard_size), args.format, args.image_column)
    clients = clients or Clients(project=args.project)
    apply = apply_flag.applying(args, "data shard")

    def storage() -> Any:
        return clients.get_storage()

    where = args.to.rstrip("/")
    try:
        src = open_source(args.source, args.image_column, storage, args.split)
    except NotLoggedIn:
        if apply:
            raise
        out(f"Shards of {args.source} in {where}:")
        out(f"  ? source {args.source}: not checked (not logged in)")
        out(plan.offline())
        return 0
    rows = f"{src.rows} rows" if src.rows is not None else "rows not counted until read"
    files = f", {len(src.files)} file{'s' if len(src.files) != 1 else ''}" if src.files else ""
    out(f"Shards of {args.source} ({src.kind}{files}, {rows}; columns: {', '.join(src.columns)}) in {where}:")
    try:
        dest = data_shards.destination(where, storage)
        state = data_shards.read_state(dest, src, settings)
    except NotLoggedIn:
        if apply:
            raise
        out(f"  + write shards of about {args.shard_size} ({args.format}) and manifest.json  [destination not "
            "checked: not logged in]")
        out(plan.offline())
        return 0
    if state.complete:
        out(f"  = {len(state.done)} shards and manifest.json, every shard as its manifest records it")
        out("Nothing to do: the dataset is sharded. Train on it with --streaming=true "
            f"--dataset_name={where}.")
        return 0
    if state.done:
        resume_row = data_shards.start_rows(state.done)
        out(f"  = {len(state.done)} shards already written (rows 0..{resume_row - 1}): kept, the rest follows them")
    out(f"  + write the {'remaining ' if state.done else ''}shards of about {args.shard_size} of row data each "
        f"({args.format}: shard-NNNNN.{data_shards.SHARD_FORMATS[args.format]}), every image as bytes, each row's "
        "index as _row; then manifest.json (row counts, sha256 and md5 of every shard)")
    if not apply:
        out(plan.dry_run(why="nothing written", apply="gemma3-ray data shard … --apply",
                         note="an interrupted --apply resumes at the next shard"))
        return 0
    result = data_shards.write_all(src, dest, settings, state, out, data_shards.Progress(src.rows, stream))
    missing = sum(s["missing_images"] for s in result["shards"])
    out(f"Done: {result['rows']} rows in {len(result['shards'])} shards, manifest {dest.uri(data_shards.MANIFEST)}"
        + (f"; {missing} rows have no image (kept: the trainer counts them as missing_image)" if missing else ""))
    out(f"Train on it: --streaming=true --dataset_name={where}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    data = sub.add_parser("data", help="datasets in the bucket: `data shard` writes shards for streaming")
    verbs = data.add_subparsers(dest="data_command", metavar="VERB", required=True)
    p = verbs.add_parser("shard", help="a parquet/jsonl/Hugging Face dataset as shards of a chosen size, with a "
                         "manifest: plan (default) or --apply")
    p.add_argument("source", metavar="SOURCE", help="a .parquet/.jsonl file, a directory or gs:// prefix of them, or "
                   "a Hugging Face dataset id")
    p.add_argument("--to", required=True, help="where the shards go: gs://BUCKET/PREFIX (or a local directory)")
    p.add_argument("--shard-size", default=DEFAULT_SHARD_SIZE, help="row data per shard, e.g. 256MB, 1GiB "
                   f"(default {DEFAULT_SHARD_SIZE})")
    p.add_argument("--format", choices=sorted(data_shards.SHARD_FORMATS), default="parquet",
                   help="shard files: parquet (default) or webdataset (.tar: <row>.json + <row>.<image ext>)")
    p.add_argument("--image-column", default="image", help="the column holding the image: {bytes, path}, bytes, or "
                   "a path (local, relative to the data, or gs://), read into the shard (default image)")
    p.add_argument("--split", default="train", help="the split of a Hugging Face dataset (default train)")
    p.add_argument("--project", help="Google Cloud project of the storage client (default: the credentials')")
    apply_flag.add(p, "write the shards and the manifest")
    p.set_defaults(handler=lambda a, c: cmd_shard(a, c, stream=sys.stderr))
