"""Test data with the rows issue #13 names: a truncated JPEG, a decompression bomb, and an image marker in
a product name, next to good rows (a jsonl with image files, so one can also vanish mid-run)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

# A 200-megapixel 1-bit PNG: ~25 KB on disk, 2.2x PIL's decompression-bomb limit.
BOMB_SIZE = (20_000, 10_000)
MARKER = "<start_of_image>"
BAD_REASONS = {"corrupt_image": 1, "image_too_large": 1, "image_token_in_text": 1}


def truncated_jpeg(png: bytes) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(out, format="JPEG", quality=95)
    data = out.getvalue()
    return data[: len(data) // 2]


def bomb_png() -> bytes:
    out = io.BytesIO()
    Image.new("1", BOMB_SIZE).save(out, format="PNG", optimize=True)
    return out.getvalue()


def write_messy_jsonl(sample_parquet: Path, out_dir: Path, n_good: int) -> tuple[Path, dict[str, int]]:
    """rows.jsonl with n_good good rows, then the three bad ones; returns (path, {reason: row index})."""
    rows = pq.read_table(sample_parquet).to_pylist()
    images = out_dir / "images"
    images.mkdir(parents=True, exist_ok=True)
    good, template = rows[:n_good], rows[0]
    bad = {
        "corrupt_image": ({**template}, truncated_jpeg(template["image"]["bytes"]), "jpg"),
        "image_too_large": ({**template}, bomb_png(), "png"),
        "image_token_in_text": ({**template, "Product Name": f"Lamp {MARKER} deluxe"}, template["image"]["bytes"], "png"),
    }
    where: dict[str, int] = {}
    with open(out_dir / "rows.jsonl", "w") as fh:
        entries = [(r, r["image"]["bytes"], "png") for r in good]
        for reason, entry in bad.items():
            where[reason] = len(entries)
            entries.append(entry)
        for i, (row, data, ext) in enumerate(entries):
            (images / f"{i}.{ext}").write_bytes(data)
            fh.write(json.dumps({**row, "image": f"images/{i}.{ext}"}) + "\n")
    return out_dir / "rows.jsonl", where
