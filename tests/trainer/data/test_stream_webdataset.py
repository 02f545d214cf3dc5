"""WebDataset shards through the streaming path's one row contract (trainer/data/stream_rows.py): `.tar` shards
written by the plugin's own `gemma3-ray data shard --format webdataset`, with PNG and JPEG members and rows that
have none, read by the stream's reader as a Ray Data task (trainer/job/shard_read.py: each member extension its
column, null where a sample lacks it; Ray Data's own `read_webdataset` puts NaN there, which the row contract also
takes). Every good row comes through; a row without an image is `missing_image`, never
`corrupt_image`; the eval split (read from the tars without Ray Data) follows the same rule.

The same shards hold too few usable rows: a streamed epoch whose good rows do not fill one global batch stops the
run with the file path's sentence (trainer/job/epochs.py), and a run of max_steps trains them all.
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


def webdataset_shards(tmp_path: Path, n_rows: int = 12, no_image: set[int] = NO_IMAGE) -> Path:
    """The plugin's `data shard --format webdataset` of a jsonl whose rows have a PNG, a JPEG or no image."""
    from gemma3_ray import cli

    from localkit.sample_data import build_sample_dataset

    rows = pq.read_table(build_sample_dataset(tmp_path / "sample", n_rows=n_rows, seed=4)).to_pylist()
    src = tmp_path / "src"
    (src / "images").mkdir(parents=True)
    with open(src / "rows.jsonl", "w") as fh:
        for i, row in enumerate(rows):
            image = None
            if i not in no_image:
                ext, data = ("jpg", jpeg(row["image"]["bytes"])) if i in JPEG else ("png", row["image"]["bytes"])
                image = f"images/{i}.{ext}"
                (src / image).write_bytes(data)
            fh.write(json.dumps({**row, "image": image}) + "\n")
    out = tmp_path / "shards"
    assert cli.main(["data", "shard", str(src / "rows.jsonl"), "--to", str(out), "--format", "webdataset",
                     "--shard-size", "4KB", "--apply"]) == 0
    return out


def test_every_good_row_of_mixed_webdataset_shards_comes_through_the_streams_reader(
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


def stream_steps(args, processor, shards_dir: Path, tmp_path: Path, limit: int) -> int:
    """The optimizer steps one worker's stream yields, up to `limit` (the Trainer stops at max_steps)."""
    import itertools

    setup = streaming.StreamSetup(shards=shard_manifest.to_config(shard_manifest.check_for_run(args)),
                                  storage=Storage(root=str(tmp_path / "run")))
    accumulation = args.global_batch_size // 2
    batches, *_ = streaming.prepare_stream(args, processor, setup, 2, accumulation)
    return sum(1 for _ in itertools.islice(batches, limit * accumulation)) // accumulation


@pytest.mark.parametrize("no_image, said", [
    (set(range(12)), "no usable rows in {data} (skipped: {{'missing_image': 12}})"),
    (set(range(9)), "global_batch_size=4 is more than the 3 training rows (of 12 rows, 9 skipped as they streamed, "
                    "0 held out for eval): use --global_batch_size=3 (the most that 3 rows fill and 1 worker split "
                    "exactly), or add rows"),
], ids=["no-good-row", "fewer-than-a-batch"])
def test_a_stream_that_trains_nothing_stops_with_the_file_paths_sentence(
        processor, ray_cluster, tmp_path, no_image, said) -> None:
    from trainer.job.flags import UsageError

    shards_dir = webdataset_shards(tmp_path, no_image=no_image)
    args = parse_args([*COMMON, "--global_batch_size=4", f"--dataset_name={shards_dir}",
                       "--streaming=true", "--eval_fraction=0", "--max_steps=-1", "--num_train_epochs=1"])
    with pytest.raises(UsageError) as err:
        stream_steps(args, processor, shards_dir, tmp_path, 10)
    assert str(err.value) == said.format(data=shards_dir)
    assert stream_rows.stream_stop(err.value, 1) == str(err.value)  # the worker's one sentence, no retry


def test_a_stream_of_max_steps_trains_max_steps_however_many_rows_turn_out_bad(processor, ray_cluster, tmp_path) -> None:
    """The manifest's 12 rows plan 3 steps of 4 per epoch; 4 are good: one step per epoch, so max_steps=4 takes four
    epochs of the stream (as the file path's epochs of its good rows), not the plan's."""
    shards_dir = webdataset_shards(tmp_path, no_image=set(range(4, 12)))
    args = parse_args([*COMMON, "--global_batch_size=4", f"--dataset_name={shards_dir}", "--streaming=true",
                       "--eval_fraction=0", "--max_steps=4"])
    assert stream_steps(args, processor, shards_dir, tmp_path, 4) == 4
