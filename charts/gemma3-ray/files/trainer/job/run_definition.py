"""What defines a run: its data (the data files' content, or the gs:// objects' generations) and every flag
that changes training, recorded at its start (`run_definition.json`) and compared at every restart.

Every flag defines the run except those in flags.RESTART_FREE (where the run lives, logging and
checkpoint cadence, the workers, speed levers with the same arithmetic, what happens after training).
Standard library and pyarrow only: the driver computes it before anything starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from trainer.job import stored
from trainer.job.flags import RESTART_FREE, TrainArguments
from trainer.job.storage import filesystem

DEFINITION_FILE = "run_definition.json"
# The flags that make the adapter's shape (which weights exist, their sizes, the base they apply to): a checkpoint
# continues (--resume_from) only with these unchanged; every other flag may change in a continuation.
ADAPTER_SHAPE = ("model_id", "quantization", "lora_r", "lora_target", "train_embeddings")
ADAPTER_CONFIG_FILE = "adapter_config.json"  # PEFT's, in every checkpoint: its rank and saved modules
ADAPTER_CONFIG = stored.fields({"r": stored.COUNT}, {"modules_to_save": stored.ANY})
FORMAT = 1
DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
HASH_CHUNK = 1 << 20
SHOWN_CHANGES = 6
SHOWN_VALUE_CHARS = 40  # a changed value longer than this shows only where it differs ...
SHOWN_CONTEXT = 16  # ... with this many characters either side
SHOWN_DIFF_CHARS = 80  # ... and at most this many of the differing part


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def data_files(name: str, emulator_host: str | None = None) -> dict[str, str]:
    """{data file: identity} of a dataset: the sha256 of each local file, the generation of each gs:// object
    (its update time and size, from the listing: nothing is downloaded); {} for a hub dataset (by its name)."""
    if name.startswith("gs://"):
        import pyarrow.fs as pafs

        fs, path = filesystem(name, emulator_host)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            infos = [info]
        else:
            infos = [i for i in fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
                     if i.type == pafs.FileType.File and i.path.endswith(DATA_SUFFIXES)]
        # Each object's generation as its metadata listing gives it: the update time (a rewrite, even of
        # the same bytes, is a new generation with its own) and size; no object is opened or downloaded.
        return {(i.path[len(path.rstrip("/")) + 1:] or Path(i.path).name): f"generation:{i.mtime_ns}:{i.size}"
                for i in sorted(infos, key=lambda i: i.path)}
    local = Path(name)
    if local.is_file():
        return {local.name: _sha256(local)}
    if local.is_dir():
        return {str(p.relative_to(local)): _sha256(p) for p in sorted(local.rglob("*"))
                if p.is_file() and p.suffix in DATA_SUFFIXES}
    return {}


def identity(files: dict[str, str], name: str) -> str:
    """One short digest of the data: its name and each file's identity."""
    text = json.dumps({"dataset": name, "files": files}, sort_keys=True)
    return "data:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def definition(args: TrainArguments, emulator_host: str | None = None) -> dict[str, Any]:
    """This run's definition: every flag that is not RESTART_FREE, and the data's identity."""
    files = data_files(args.dataset_name, emulator_host)
    flags = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainArguments) if f.name not in RESTART_FREE}
    return {"format": FORMAT, "flags": flags, "data": {"dataset": args.dataset_name, "files": files,
                                                       "identity": identity(files, args.dataset_name)}}


def _shown(old: Any, new: Any) -> tuple[str, str]:
    """Two differing values as JSON, short ones whole; of long ones the part where they differ, with
    SHOWN_CONTEXT characters either side (`…` where cut): two long paths that differ at the end never read the
    same."""
    a, b = json.dumps(old), json.dumps(new)
    if len(a) <= SHOWN_VALUE_CHARS and len(b) <= SHOWN_VALUE_CHARS:
        return a, b
    p = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    q = next((i for i, (x, y) in enumerate(zip(reversed(a[p:]), reversed(b[p:]), strict=False)) if x != y),
             min(len(a), len(b)) - p)

    def cut(text: str) -> str:
        start = max(0, p - SHOWN_CONTEXT) if p - SHOWN_CONTEXT > 1 else 0  # never an ellipsis for the quote alone
        end = min(len(text) - max(0, q - SHOWN_CONTEXT), p + SHOWN_DIFF_CHARS)
        end = len(text) if end >= len(text) - 1 else end
        quote = '"' if text.startswith('"') else ""
        return (f"{quote}…" if start else "") + text[start:end] + (f"…{quote}" if end < len(text) else "")

    return cut(a), cut(b)


def changes(old: dict[str, Any], new: dict[str, Any], only: tuple[str, ...] | None = None) -> list[str]:
    """What differs between two definitions, as `name old → new` (the data by file); `only`: these flags only."""
    out = []
    old_flags, new_flags = old.get("flags", {}), new.get("flags", {})
    for name in sorted(set(old_flags) | set(new_flags)):
        if name in RESTART_FREE:
            continue  # a flag that was recorded by an older trainer and is free now
        if only is not None and name not in only:
            continue
        if old_flags.get(name) != new_flags.get(name):
            out.append("{} {} → {}".format(name, *_shown(old_flags.get(name), new_flags.get(name))))
    if only is not None:
        return out
    old_files, new_files = old.get("data", {}).get("files", {}), new.get("data", {}).get("files", {})
    if old.get("data", {}).get("identity") != new.get("data", {}).get("identity"):
        differing = [f for f in sorted(set(old_files) | set(new_files)) if old_files.get(f) != new_files.get(f)]
        out.append(f"data {old.get('data', {}).get('identity')} → {new.get('data', {}).get('identity')}"
                   + (f" ({', '.join(differing[:3])} changed)" if differing else ""))
    return out


def changes_text(found: list[str]) -> str:
    return "; ".join(found[:SHOWN_CHANGES]) + (f"; and {len(found) - SHOWN_CHANGES} more" if len(found) > SHOWN_CHANGES
                                              else "")


SHAPE = stored.fields({
    "format": stored.where(lambda v: v == FORMAT, f"format {FORMAT} (this trainer's)", stored.is_a(int, "an integer")),
    "flags": stored.mapping(stored.TEXT, stored.ANY),
    "data": stored.fields({"dataset": stored.TEXT, "files": stored.mapping(stored.TEXT, stored.TEXT),
                           "identity": stored.TEXT}),
}, {"continued_from": stored.fields({"checkpoint": stored.TEXT, "step": stored.COUNT,
                                     "changes": stored.each(stored.TEXT)})})


def read(run) -> dict[str, Any] | None:
    """The definition a run recorded at its start (None: none recorded); stored.Unusable when it is torn or not
    what the trainer writes."""
    raw = run.read_bytes(DEFINITION_FILE)
    return stored.parse(raw, DEFINITION_FILE, SHAPE) if raw is not None else None


def write(run, value: dict[str, Any]) -> None:
    run.write_bytes(DEFINITION_FILE, json.dumps(value, indent=1, sort_keys=True).encode())
