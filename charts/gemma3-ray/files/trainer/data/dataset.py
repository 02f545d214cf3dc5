"""The rows: sources, schema check, lazy images, the bad-row scan, the split and the collator.

Sources are hub ids or local/gs:// parquet/jsonl; images stay encoded until the collator decodes a
micro-batch.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from trainer.data.encoding import LABEL_IGNORE, SampleEncoder
from trainer.data.scan_store import ScanGroup, scan_key, shared_scan
from trainer.job.dataset_check import DATA_SUFFIXES, check_schema, data_files, gcs, is_file_source
from trainer.job.epochs import no_usable_rows, rows_per_epoch
from trainer.job.flag_values import column_mapping
from trainer.job.flags import ANSWER_FIELD, IMAGE_FIELD, TrainArguments, UsageError
from trainer.job.node_cache import copy_data_files, node_lock, read_object
from trainer.job.storage import cache_root, filesystem

SCAN_BATCH_ROWS = 64
# The scan's rules, part of the stored scan's key: a scan made under other rules is not reused.
SCAN_RULES = "full-decode, bomb limit, image markers in text"
# The column that keeps each kept row's index in the dataset (logs and the summary name rows by it).
ROW_ID = "_row"
# How many row ids per reason the log and the summary list.
SHOWN_ROW_IDS = 5


class BadImage(ValueError):
    """An image that cannot be used; `reason` is the bad-row reason it is counted under."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def load_rows(args: TrainArguments, emulator_host: str | None = None, version: str = ""):
    """(raw rows as a memory-mapped `datasets.Dataset` with images not decoded, base of relative image paths).
    `version`: the data's identity; a gs:// dataset's node copy is made again when it changes."""
    import datasets

    cache = cache_root(args)
    ds_cache = str(cache / "datasets") if args.cache_dir else None
    name = args.dataset_name
    if not is_file_source(name):
        with node_lock(cache, f"dataset:{name}"):
            ds = datasets.load_dataset(name, split="train", cache_dir=ds_cache, token=os.environ.get("HF_TOKEN"))
        return ds, "."
    if name.startswith("gs://"):  # the data files only: the images stay in the bucket, fetched per row
        try:
            local = copy_data_files(name, cache, gcs(emulator_host), set(DATA_SUFFIXES), version)
        except FileNotFoundError as e:
            raise UsageError(f"dataset_name: {name} does not exist") from e
    else:
        local = Path(name)
    if not local.exists():
        raise UsageError(f"dataset_name: {name} does not exist")
    files, builder = data_files(name, local)
    with node_lock(cache, f"dataset:{local}"):
        ds = datasets.load_dataset(builder, data_files=[str(p) for p in files], split="train", cache_dir=ds_cache)
    # Relative image paths resolve against the data's directory (the gs:// prefix for gs:// data).
    if name.startswith("gs://"):
        image_base = name.rstrip("/") if local.is_dir() else name.rsplit("/", 1)[0]
    else:
        image_base = str(local.resolve() if local.is_dir() else local.resolve().parent)
    return ds, image_base


def canonical_rows(ds, mapping: dict[str, str]):
    """Only the mapped columns, renamed to the job's fields, images left encoded."""
    import datasets

    ds = ds.select_columns(sorted(set(mapping.values())))
    feature = ds.features[mapping[IMAGE_FIELD]]
    if isinstance(feature, datasets.Image) and feature.decode:
        ds = ds.cast_column(mapping[IMAGE_FIELD], datasets.Image(decode=False))
    by_column: dict[str, list[str]] = {}
    for f, c in mapping.items():
        by_column.setdefault(c, []).append(f)
    for c, fields in by_column.items():  # one column may feed several fields
        for extra in fields[1:]:
            ds = ds.add_column(extra, ds[c])
        if fields[0] != c:
            ds = ds.rename_column(c, fields[0])
    return ds


def image_bytes(value: Any, image_base: str, emulator_host: str | None, cache: Path | None = None) -> bytes | None:
    """The encoded image of a row: {bytes, path} struct, raw bytes, or a local/gs:// path (through the
    node cache `cache` when given: fetched once per node)."""
    if value is None:
        return None
    if isinstance(value, dict):
        if value.get("bytes"):
            return value["bytes"]
        value = value.get("path")
        if not value:
            return None
    if isinstance(value, bytes | bytearray):
        return bytes(value) or None
    path = str(value)
    if not path.startswith("gs://") and not os.path.isabs(path):
        path = f"{image_base}/{path}"
    if path.startswith("gs://") and cache is not None:
        return read_object(path, cache, gcs(emulator_host))
    if path.startswith("gs://"):
        fs, p = filesystem(path, emulator_host)
        try:
            with fs.open_input_stream(p) as src:
                return src.read()
        except (FileNotFoundError, OSError):
            return None
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def to_rgb(im):
    """A PIL image as 8-bit RGB. 16-bit grayscale (I;16, I;16B, …; and 32-bit I, taken as 16-bit) keeps each
    sample's high byte (`v >> 8`), where PIL's own conversion would clip every value over 255 to white;
    16-bit RGB(A) PNGs PIL already opens by their high bytes."""
    from PIL import Image

    if not (im.mode == "I" or im.mode.startswith("I;16")):
        return im.convert("RGB")
    import numpy as np

    samples = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
    return Image.fromarray((samples >> 8).astype(np.uint8)).convert("RGB")  # 2-D uint8: mode L


def decode_image(data: bytes):
    """The image fully decoded, as RGB (`to_rgb`: 16-bit samples scaled to 8 bits). A decompression bomb (over PIL's pixel limit, which PIL itself only
    warns about below twice the limit) raises BadImage("image_too_large"), any decoder error
    BadImage("corrupt_image")."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as im:
                return to_rgb(im)
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise BadImage("image_too_large", str(e)) from e
        except Exception as e:  # noqa: BLE001 - any decoder error makes the row unusable
            raise BadImage("corrupt_image", f"{type(e).__name__}: {e}") from e


class Collator:
    """Decodes the images of a micro-batch (lazily: only here) and encodes it.

    A row that still fails here (its image changed or vanished after the scan) is never fatal: it is
    logged to `skip_log` and replaced by an unlabelled copy of a row that works, so the micro-batch keeps
    its size on every worker and the failed row adds nothing to the loss.
    """

    def __init__(self, encoder: SampleEncoder, image_base: str, emulator_host: str | None, cache: Path | None = None,
                 skip_log: Path | None = None, spare_rows=None):
        self.encoder, self.image_base, self.emulator_host, self.cache = encoder, image_base, emulator_host, cache
        self.skip_log, self.spare_rows = skip_log, spare_rows
        self.fallback: tuple[tuple[list[int], list[int]], Any] | None = None

    def _row(self, row: dict[str, Any]) -> tuple[tuple[list[int], list[int]], Any]:
        data = image_bytes(row[IMAGE_FIELD], self.image_base, self.emulator_host, self.cache)
        if data is None:
            raise BadImage("missing_image", f"image vanished after the scan: {str(row[IMAGE_FIELD])[:80]}")
        return self.encoder.encode(row), decode_image(data)

    def _skip(self, row: dict[str, Any], error: Exception) -> None:
        reason = error.reason if isinstance(error, BadImage) else f"{type(error).__name__}"
        print(f"[data] skipped row {row.get(ROW_ID)} in training ({error})", flush=True)
        if self.skip_log is not None:
            with open(self.skip_log, "a") as fh:
                fh.write(json.dumps({"row": row.get(ROW_ID), "reason": reason}) + "\n")

    def _spare(self) -> tuple[tuple[list[int], list[int]], Any]:
        if self.fallback is None:
            for row in self.spare_rows if self.spare_rows is not None else []:
                with contextlib.suppress(Exception):
                    self.fallback = self._row(row)
                    break
            else:
                raise RuntimeError("no row of the training set decodes any more")
        (ids, labels), image = self.fallback
        return (ids, [LABEL_IGNORE] * len(labels)), image

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        done: list[tuple[tuple[list[int], list[int]], Any] | None] = []
        for row in rows:
            try:
                done.append(self._row(row))
                self.fallback = self.fallback or done[-1]
            except Exception as e:  # noqa: BLE001 - a bad row is skipped and counted, never fatal
                self._skip(row, e)
                done.append(None)
        done = [d if d is not None else self._spare() for d in done]
        return self.encoder.batch([d[0] for d in done], [d[1] for d in done])


def row_problem(row: dict[str, Any], encoder: SampleEncoder, image_base: str, emulator_host: str | None,
                max_seq_length: int, cache: Path | None = None) -> str | None:
    """Why a row cannot be trained on, or None. The image is decoded in full (truncation shows only then)."""
    answer = row.get(ANSWER_FIELD)
    if not isinstance(answer, str) or not answer.strip():
        return "empty_answer"
    for f in encoder.fields:
        if row.get(f) is None or (isinstance(row[f], str) and not row[f].strip()):
            return "empty_prompt_field"
    if encoder.image_marker_in(row):
        return "image_token_in_text"
    data = image_bytes(row.get(IMAGE_FIELD), image_base, emulator_host, cache)
    if data is None:
        return "missing_image"
    try:
        decode_image(data)
    except BadImage as e:
        return e.reason
    if encoder.num_tokens(row) > max_seq_length:
        return "too_long"
    return None


def clean_rows(ds, encoder: SampleEncoder, args: TrainArguments, image_base: str, emulator_host: str | None,
               cache: Path | None = None, group: ScanGroup | None = None, key: str = ""):
    """(rows without the bad ones, with their dataset index in ROW_ID; {reason: [row ids]} of the skipped;
    whether the run's stored scan was reused). bad_rows=fail raises instead, naming the row. With a `group`, the scan is kept with the run (scan_store):
    its workers split it, and a restart reads it back."""

    def scan(block: range) -> dict[int, str]:
        bad: dict[int, str] = {}
        for start in range(block.start, block.stop, SCAN_BATCH_ROWS):
            chunk = ds[start : min(start + SCAN_BATCH_ROWS, block.stop)]
            for i in range(len(next(iter(chunk.values())))):
                row = {k: v[i] for k, v in chunk.items()}
                problem = row_problem(row, encoder, image_base, emulator_host, args.max_seq_length, cache)
                if problem is not None:
                    bad[start + i] = problem
                    if args.bad_rows == "fail":  # this share's first bad row; the group names the first of all
                        return bad
        return bad

    # Every worker scans its share and gets the merged verdict, so bad_rows=fail stops all of them at
    # once (a worker that stopped alone would leave the others waiting for its share).
    result = shared_scan(group or ScanGroup(None), key, len(ds), scan, keep_bad=args.bad_rows != "fail")
    if args.bad_rows == "fail" and result.skipped:
        row = min(result.skipped)
        problem = result.skipped[row]
        hint = " (raise --max_seq_length)" if problem == "too_long" else ""
        raise UsageError(f"row {row}: {problem}{hint}; --bad_rows=skip would skip such rows")
    keep = result.keep()
    if not keep:
        raise no_usable_rows(args.dataset_name, result.counts())
    skipped: dict[str, list[int]] = {}
    for row, reason in sorted(result.skipped.items()):
        skipped.setdefault(reason, []).append(row)
    return ds.select(keep).add_column(ROW_ID, keep), skipped, result.reused


def count_by_reason(skipped: dict[str, list[int]]) -> dict[str, int]:
    """{reason: number of rows} (a row skipped in several epochs counts once)."""
    return {reason: len(set(ids)) for reason, ids in sorted(skipped.items())}


def some_row_ids(skipped: dict[str, list[int]]) -> dict[str, list[int]]:
    """{reason: the first few row ids}."""
    return {reason: sorted(set(ids))[:SHOWN_ROW_IDS] for reason, ids in sorted(skipped.items())}


def skipped_line(counts: dict[str, int], row_ids: dict[str, list[int]], where: str) -> str | None:
    """One log line: the skipped rows by reason, with a few row ids each."""
    if not counts:
        return None
    parts = [f"{reason} {n} (rows {', '.join(map(str, row_ids.get(reason, [])))}{', …' if n > SHOWN_ROW_IDS else ''})"
             for reason, n in sorted(counts.items())]
    return f"[data] skipped {sum(counts.values())} rows {where}: " + "; ".join(parts)


def split_rows(ds, args: TrainArguments):
    """Deterministic (train, eval or None) by eval_fraction and seed."""
    n_eval = math.ceil(len(ds) * args.eval_fraction) if args.eval_fraction > 0 else 0
    if n_eval == 0:
        return ds, None
    if n_eval >= len(ds):
        raise UsageError(f"eval_fraction={args.eval_fraction} leaves no training rows out of {len(ds)}")
    parts = ds.train_test_split(test_size=n_eval, seed=args.seed, shuffle=True)
    return parts["train"], parts["test"]


def prepare_data(args: TrainArguments, processor, emulator_host: str | None, scan_group: ScanGroup | None = None,
                 skip_log: Path | None = None):
    """Everything a worker needs from the data: (train, eval, collator, stats). `scan_group`: the run's
    workers, to scan once per run (see clean_rows); gs:// images go through the node cache. The collator
    logs the rows it has to skip to `skip_log`."""
    mapping = column_mapping(args)
    raw, image_base = load_rows(args, emulator_host, scan_group.data_identity if scan_group else "")
    check_schema(list(raw.column_names), mapping, args.dataset_name)
    rows = canonical_rows(raw, mapping)
    encoder = SampleEncoder(processor, args)
    cache = cache_root(args)
    # What a row's verdict depends on, the same on every node (no local paths or times): the data's identity
    # (its files' content or generations, from the driver), the rules and the settings.
    key = scan_key(dataset=args.dataset_name, data=scan_group.data_identity if scan_group else "", rows=len(raw), columns=raw.column_names, mapping=mapping,
                   prompt=args.prompt_template, system=args.system_message, max_seq_length=args.max_seq_length,
                   bad_rows=args.bad_rows, vocab=len(processor.tokenizer), rules=SCAN_RULES)
    rows, skipped, reused = clean_rows(rows, encoder, args, image_base, emulator_host, cache, scan_group, key)
    train, evaluation = split_rows(rows, args)
    stats = {
        "rows": len(raw),
        "train_rows": len(train),
        "eval_rows": len(evaluation) if evaluation is not None else 0,
        "skipped_rows": count_by_reason(skipped),
        "skipped_row_ids": some_row_ids(skipped),
        "scan_reused": reused,
        **rows_per_epoch(len(train), args.global_batch_size),  # what each epoch trains (job/epochs.py)
    }
    return train, evaluation, Collator(encoder, image_base, emulator_host, cache, skip_log, train), stats
