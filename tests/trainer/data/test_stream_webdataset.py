"""WebDataset shards through the streaming path's one row contract (trainer/data/stream_rows.py): `.tar` shards
written by the plugin's own `gemma3-ray data shard --format webdataset`, with PNG and JPEG members and rows that
have none, read by Ray Data's own reader (`ray.data.read_webdataset`, which gives each extension its column and
NaN where a sample lacks it). Every good row comes through; a row without an image is `missing_image`, never
`corrupt_image`; the eval split (read from the tars without Ray Data) follows the same rule.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

from trainer.data import stream_plan, stream_rows, streaming
from trainer.data.encoding import SampleEncoder
from trainer.job import shard_manifest
from trainer.job.arguments import parse_args
from trainer.job.flag_values import column_mapping
from trainer.job.storage import Storage

COMMON = ["--use_gpu=false", "--num_workers=1", "--global_batch_size=2", "--per_device_train_batch_size=2",
          "--max_steps=1", "--sample_rows=0"]
NO_IMAGE = {0, 5, 9}  # row 0: the first row of the first shard (and of its Ray Data block) has no image
JPEG = {2, 3, 6, 10}  # row 2: a JPEG row after a PNG row


def jpeg(png: bytes) -> bytes:
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


def webdataset_shards(tmp_path: Path, n_rows: int = 12) -> Path:
    """The plugin's `data shard --format webdataset` of a jsonl whose rows have a PNG, a JPEG or no image."""
    from gemma3_ray import cli

    from localkit.sample_data import build_sample_dataset

    rows = pq.read_table(build_sample_dataset(tmp_path / "sample", n_rows=n_rows, seed=4)).to_pylist()
    src = tmp_path / "src"
    (src / "images").mkdir(parents=True)
    with open(src / "rows.jsonl", "w") as fh:
        for i, row in enumerate(rows):
            image = None
            if i not in NO_IMAGE:
                ext, data = ("jpg", jpeg(row["image"]["bytes"])) if i in JPEG else ("png", row["image"]["bytes"])
                image = f"images/{i}.{ext}"
                (src / image).write_bytes(data)
            fh.write(json.dumps({**row, "image": image}) + "\n")
    out = tmp_path / "shards"
    assert cli.main(["data", "shard", str(src / "rows.jsonl"), "--to", str(out), "--format", "webdataset",
                     "--shard-size", "4KB", "--apply"]) == 0
    return out


def test_every_good_row_of_mixed_webdataset_shards_comes_through_ray_datas_reader(
        processor, ray_cluster, tmp_path) -> None:
    shards_dir = webdataset_shards(tmp_path)
    args = parse_args([*COMMON, f"--dataset_name={shards_dir}", "--streaming=true", "--streaming_shuffle_window=0",
                       "--eval_fraction=0"])
    shards = shard_manifest.check_for_run(args)
    assert shards.shard_format == "webdataset" and len(shards.shards) > 1 and shards.shards[0].first_row == 0
    plan = stream_plan.plan_stream(args, shards)
    storage = Storage(root=str(tmp_path / "run"))
    stream_rows.configure_data_context(None)
    ds = stream_rows.epoch_dataset(plan, 0, processor, args, column_mapping(args), storage, set(), 1)
    kept = sorted(r[shard_manifest.ROW_ID] for r in ds.take_all())
    assert kept == sorted(set(range(12)) - NO_IMAGE)
    assert stream_rows.skipped_rows(storage) == {"missing_image": sorted(NO_IMAGE)}


def test_the_eval_split_of_webdataset_shards_follows_the_same_rule(processor, tmp_path) -> None:
    shards_dir = webdataset_shards(tmp_path)
    args = parse_args([*COMMON, f"--dataset_name={shards_dir}", "--streaming=true", "--eval_fraction=0.5"])
    plan = stream_plan.plan_stream(args, shard_manifest.check_for_run(args))
    good, bad = streaming.read_eval_rows(plan, column_mapping(args), Storage(root=str(tmp_path / "run")),
                                         SampleEncoder(processor, args), args.max_seq_length)
    assert [r[shard_manifest.ROW_ID] for r in good] == [6, 7, 8, 10, 11] and bad == {9: "missing_image"}


@pytest.mark.parametrize("raw, expected", [
    ({"json": b'{"_row": 1, "description": "a"}', "png": float("nan"), "jpg": b"\xff\xd8jpeg"}, b"\xff\xd8jpeg"),
    ({"json": b'{"_row": 1, "description": "a"}', "png": None, "missing": b""}, None),
    ({"json": b'{"_row": 1, "description": "a"}', "txt": b"not an image", "webp": float("nan")}, None),
])
def test_a_samples_image_is_whichever_image_member_it_has(raw, expected) -> None:
    row = stream_rows.canonical_row(raw, {"image": "image", "answer": "description"}, "webdataset", "image")
    assert row["image"]["bytes"] == expected and row["_row"] == 1
