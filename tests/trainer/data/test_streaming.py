"""The streaming path (trainer/data/streaming.py) on real parts: shards written by the plugin's `data shard` into
fake-gcs-server, read by Ray Data on a local Ray cluster, trained by the real SFTTrainer on the tiny Gemma 3.

- on the same rows in the same order, every step's loss is the file path's, exactly (one worker, no shuffle);
- bad rows are skipped as they stream with the scan's reasons and row ids; bad_rows=fail names the first;
- a resumed epoch trains the rows its checkpoint had not: every row once, none twice;
- the driver refuses a damaged shard or a missing column in one sentence, before any worker.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.trainer.conftest import GCS_BUCKET
from tests.trainer.messy import write_messy_jsonl
from trainer.data import stream_plan, stream_rows, streaming
from trainer.data.encoding import SampleEncoder
from trainer.data.sampler import WholeBatchSampler
from trainer.job import shard_manifest
from trainer.job.arguments import parse_args
from trainer.job.flag_values import column_mapping
from trainer.job.storage import Storage, filesystem

COMMON = ["--use_gpu=false", "--num_workers=1", "--global_batch_size=4", "--per_device_train_batch_size=2",
          "--logging_steps=1", "--eval_fraction=0", "--learning_rate=5e-3", "--gradient_checkpointing=false",
          "--save_strategy=no", "--sample_rows=0"]


def shard(source: Path, to: str, fake_gcs: str, size: str = "3KB") -> None:
    """The plugin's own `gemma3-ray data shard SOURCE --to TO --apply`, against fake-gcs-server."""
    from gemma3_ray import cli
    from gemma3_ray.config.clients import Clients
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="p", credentials=AnonymousCredentials(), client_options={"api_endpoint": fake_gcs})
    assert cli.main(["data", "shard", str(source), "--to", to, "--shard-size", size, "--apply"],
                    Clients(project="p", storage=client)) == 0


@pytest.fixture
def prefix(request) -> str:
    return f"gs://{GCS_BUCKET}/stream/{request.node.name}"


@pytest.mark.slow
def test_streamed_loss_equals_the_file_paths_on_the_same_rows_in_the_same_order(
        tiny_model, ray_cluster, fake_gcs, tmp_path, prefix, monkeypatch):
    import torch

    from localkit.sample_data import build_sample_dataset
    from trainer.worker.model import build_trainer

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    torch.set_flush_denormal(True)
    data = build_sample_dataset(tmp_path / "data", n_rows=24, seed=0)
    # lora_dropout 0: dropout draws from torch's RNG, which a DataLoader also draws from; the data path is compared
    common = [*COMMON, "--max_steps=4", f"--model_id={tiny_model}", "--lora_dropout=0"]
    args = parse_args([*common, f"--dataset_name={data}"])
    trainer, _, _ = build_trainer(args, tiny_model, tmp_path / "file", torch.device("cpu"), None)
    trainer.train()
    file_losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]

    # The same rows in the order the file path trained them (its epoch-0 permutation), sharded into the bucket.
    order = list(WholeBatchSampler(24, 4, args.seed))
    rows = pq.read_table(data).to_pylist()
    pq.write_table(pa.Table.from_pylist([rows[i] for i in order]), tmp_path / "ordered.parquet")
    shard(tmp_path / "ordered.parquet", prefix, fake_gcs)
    sargs = parse_args([*common, f"--dataset_name={prefix}", "--streaming=true", "--streaming_shuffle_window=0"])
    setup = streaming.StreamSetup(shards=shard_manifest.to_config(shard_manifest.check_for_run(sargs)),
                                  storage=Storage(root=f"gs://{GCS_BUCKET}/stream-runs/equal", emulator_host=fake_gcs))
    streamed, _, _ = build_trainer(sargs, tiny_model, tmp_path / "stream", torch.device("cpu"), fake_gcs, stream=setup)
    streamed.train()
    stream_losses = [h["loss"] for h in streamed.state.log_history if "loss" in h]
    assert len(file_losses) == 4
    assert [float(x) for x in stream_losses] == [float(x) for x in file_losses]  # fp64 values, no tolerance
    batches, plan = streamed.stream
    assert len(batches.waits) == 4 and plan.shuffle_rule().startswith("none")


def _messy_shards(tmp_path: Path, fake_gcs: str, prefix: str):
    from localkit.sample_data import build_sample_dataset

    sample = build_sample_dataset(tmp_path / "sample", n_rows=12, seed=1)
    jsonl, where = write_messy_jsonl(sample, tmp_path / "messy", n_good=9)
    lines = jsonl.read_text().splitlines()
    empty = json.loads(lines[2])
    empty["description"] = "  "
    lines[2] = json.dumps(empty)
    gone = json.loads(lines[4])
    (jsonl.parent / gone["image"]).unlink()  # a row whose image file is missing when it is sharded
    jsonl.write_text("\n".join(lines) + "\n")
    shard(jsonl, prefix, fake_gcs, size="40KB")
    return jsonl, {**where, "empty_answer": 2, "missing_image": 4}


def test_bad_rows_are_skipped_as_they_stream_with_the_scans_reasons_and_row_ids(
        processor, fake_gcs, tmp_path, prefix, monkeypatch):
    """The CPU stage's verdicts (run here as Ray Data runs it: on the shards' batches) equal the file path's scan
    of the same source, row for row; bad_rows=fail names the first bad row in one sentence."""
    from trainer.data.dataset import canonical_rows, clean_rows, load_rows

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    jsonl, expected = _messy_shards(tmp_path, fake_gcs, prefix)
    args = parse_args([*COMMON, "--max_steps=1", f"--dataset_name={prefix}", "--streaming=true",
                       f"--cache_dir={tmp_path / 'cache'}"])
    shards = shard_manifest.check_for_run(args)
    storage = Storage(root=f"gs://{GCS_BUCKET}/stream-runs/{tmp_path.name}", emulator_host=fake_gcs)
    mapping = column_mapping(args)
    stage = stream_rows.RowStage(processor, asdict(args), mapping, shards.shard_format, shards.image_column,
                               asdict(storage), 0, shards.rows, None)
    kept = []
    for s in shards.shards:
        fs, path = filesystem(s.uri, fake_gcs)
        kept += stage(pq.read_table(fs.open_input_file(path))).column("_row").to_pylist()
    streamed = stream_rows.skipped_rows(storage)

    file_args = parse_args([*COMMON, "--max_steps=1", f"--dataset_name={jsonl}"])
    raw, base = load_rows(file_args)
    _, scanned, _ = clean_rows(canonical_rows(raw, mapping), SampleEncoder(processor, file_args), file_args, base, None)
    assert streamed == scanned == {reason: [row] for reason, row in sorted(expected.items())}
    assert sorted(kept) == sorted(set(range(shards.rows)) - set(expected.values()))

    fail = stream_rows.RowStage(processor, {**asdict(args), "bad_rows": "fail"}, mapping, shards.shard_format,
                              shards.image_column, asdict(storage), 0, shards.rows, None)
    fs, path = filesystem(shards.shards[0].uri, fake_gcs)
    with pytest.raises(ValueError) as err:
        fail(pq.read_table(fs.open_input_file(path)))
    first = min(expected.values())
    assert stream_rows.bad_row_stop(err.value) == (f"row {first}: {next(r for r, i in expected.items() if i == first)}; "
                                                 "--bad_rows=skip would skip such rows")


@pytest.mark.slow
def test_a_resumed_epoch_trains_the_rows_its_checkpoint_had_not(processor, ray_cluster, fake_gcs, tmp_path, prefix,
                                                               monkeypatch):
    """Two steps, a checkpoint's stream state, then a new stream (another Ray Data execution, as after a restart)
    that goes on from it: the epoch's rows once each, none twice; the state survives its file."""
    from localkit.sample_data import build_sample_dataset

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    shard(build_sample_dataset(tmp_path / "d", n_rows=20, seed=2), prefix, fake_gcs)
    args = parse_args([*COMMON, "--num_train_epochs=1", f"--dataset_name={prefix}", "--streaming=true",
                       "--streaming_shuffle_window=6"])
    setup = streaming.StreamSetup(shards=shard_manifest.to_config(shard_manifest.check_for_run(args)),
                                  storage=Storage(root=f"gs://{GCS_BUCKET}/stream-runs/resume", emulator_host=fake_gcs))

    def stream(state):
        batches, *_ = streaming.prepare_stream(args, processor, dataclasses.replace(setup, state=state), 2, 2)
        return batches

    first = stream(None)
    it = iter(first)
    for _ in range(2 * 2):  # two optimizer steps of 2 micro-batches
        next(it)
    before = set(first.tally()[0])  # every rank's rows of the epoch, as on_save keeps them
    assert len(before) == 8
    saved = stream_plan.StreamState.from_json(first.state.to_json(before, 20, 2))
    assert saved.rows == before and saved.epoch == 0

    del it, first
    second = stream(saved)
    steps = sum(1 for _ in second) // 2
    (epoch0,) = second.epochs
    assert steps == 3  # 12 rows yielded, 12 new ones: none of the 8 again
    assert {k: epoch0[k] for k in ("epoch", "rows_trained", "rows_trained_twice", "steps", "resumed_with_rows",
                                   "resumed_with_steps", "rows_left_out")} == \
        {"epoch": 0, "rows_trained": 20, "rows_trained_twice": 0, "steps": 5, "resumed_with_rows": 8,
         "resumed_with_steps": 2, "rows_left_out": 0}
    assert epoch0["ranks"] == [{"rank": 0, "steps": 3, "rows": 12}]


def test_the_driver_refuses_a_damaged_shard_or_a_missing_column_before_any_worker(
        fake_gcs, tmp_path, prefix, monkeypatch, capsys):
    from localkit.sample_data import build_sample_dataset
    from trainer import vision_train

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    shard(build_sample_dataset(tmp_path / "d", n_rows=8, seed=3), prefix, fake_gcs)
    argv = [*COMMON, "--max_steps=1", f"--dataset_name={prefix}", "--streaming=true", "--model_id=/nonexistent",
            f"--storage_path=gs://{GCS_BUCKET}/stream-runs/refused", "--run_name=r1"]
    with pytest.raises(SystemExit) as stop:
        vision_train.main([*argv, '--column_mapping={"answer":"caption"}'])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "missing column(s) 'caption' (for answer)" in err and "Traceback" not in err

    fs, path = filesystem(f"{prefix}/shard-00001.parquet", fake_gcs)
    with fs.open_output_stream(path) as out:
        out.write(b"not the shard it was")
    with pytest.raises(SystemExit) as stop:
        vision_train.main(argv)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "shard shard-00001.parquet has" in err and err.count("\n") == 0


def test_the_stream_state_keeps_row_ids_exactly() -> None:
    rows = {0, 7, 8, 63, 64, 999}
    state = stream_plan.StreamState.from_json(stream_plan.StreamState(3, 40, set()).to_json(rows, 1000, 52))
    assert (state.epoch, state.epoch_start_step, state.rows, state.resumed_rows) == (3, 40, rows, 6)
    assert state.resumed_steps == 12 and not state.twice
    assert stream_plan.StreamState.from_json(b"{torn") is None


class _Identity:
    def __call__(self, batch):
        return batch


def test_a_cpu_stage_that_finds_no_cpu_stops_with_a_sentence_not_a_hang(ray_cluster, monkeypatch) -> None:
    """Seen on make e2e's streaming stage: the CPU stage's actor, allowed only on the training workers' node,
    waited PENDING for a CPU that node's training workers held, and Ray Data's default waits forever. Here the
    stage asks for a resource no node has (pending as that actor was); the run must end in the timeout with the
    trainer's sentence."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    monkeypatch.setattr(ctx, "wait_for_min_actors_s", ctx.wait_for_min_actors_s)  # restored after the test
    monkeypatch.setattr(ctx, "execution_options", ctx.execution_options)
    monkeypatch.setattr(stream_rows, "STAGE_START_TIMEOUT_S", 5)
    stream_rows.configure_data_context(None)
    assert ctx.wait_for_min_actors_s == 5
    ds = ray.data.range(4).map_batches(_Identity, num_cpus=1, concurrency=1, resources={"no-such-resource": 1})
    with pytest.raises(Exception) as err:
        ds.take_all()
    said = stream_rows.stream_stop(err.value, 1)
    assert said is not None and said.startswith("the streaming CPU stage's 1 actor(s)"), str(err.value)[:600]
    assert "training.streaming_decoders" in said and "\n" not in said
    assert stream_rows.stream_stop(RuntimeError("something else"), 1) is None
