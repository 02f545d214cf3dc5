"""A shard as the stream reads it (trainer/job/shard_read.py): its bytes checked against the manifest's sha256 on
gs:// as on a local disk, whether or not the object has an md5; the eval split's read errors (a shard gone, a prefix
the job may not read) are one sentence, never a traceback. Shards written by the plugin's `data shard` into
fake-gcs-server (a real GCS emulator process)."""

from __future__ import annotations

import json

import pytest

from tests.trainer.conftest import GCS_BUCKET
from tests.trainer.data.test_stream_stops import Forbidden
from tests.trainer.data.test_streaming import COMMON, shard
from trainer.data import stream_plan, stream_rows, streaming
from trainer.data.encoding import SampleEncoder
from trainer.job import shard_manifest, shard_read
from trainer.job.arguments import parse_args
from trainer.job.flag_values import column_mapping
from trainer.job.flags import UsageError
from trainer.job.storage import Storage, filesystem


@pytest.fixture
def prefix(request) -> str:
    return f"gs://{GCS_BUCKET}/stream-read/{request.node.name}"


def _sharded(tmp_path, fake_gcs, prefix, monkeypatch, *flags):
    from localkit.sample_data import build_sample_dataset

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs)
    shard(build_sample_dataset(tmp_path / "d", n_rows=8, seed=5), prefix, fake_gcs)
    args = parse_args([*COMMON, "--max_steps=1", f"--dataset_name={prefix}", "--streaming=true", *flags])
    return args, shard_manifest.check_for_run(args)


def _rewrite_manifest(prefix, fake_gcs, change) -> None:
    fs, path = filesystem(f"{prefix}/manifest.json", fake_gcs)
    with fs.open_input_stream(path) as src:
        manifest = json.loads(src.read())
    change(manifest)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(manifest).encode())


def test_a_gs_shard_whose_bytes_are_not_the_manifests_sha256_stops_the_read_with_one_sentence(
        tmp_path, fake_gcs, prefix, monkeypatch) -> None:
    """The manifest's sha256 of shard 1 is not its bytes' (the md5 still is: the driver's metadata check passes);
    the read of that shard, on gs://, names it."""
    args, _ = _sharded(tmp_path, fake_gcs, prefix, monkeypatch)
    _rewrite_manifest(prefix, fake_gcs, lambda m: m["shards"][1].update(sha256="0" * 64))
    checked = shard_manifest.check_for_run(args)  # size and md5 (metadata): as written
    good, bad = checked.shards[0], checked.shards[1]
    assert shard_read.shard_bytes(good, checked.root, fake_gcs)  # the other shards read
    with pytest.raises(shard_manifest.ManifestError) as err:
        shard_read.shard_bytes(bad, checked.root, fake_gcs)
    assert str(err.value).startswith(f"dataset {prefix}: shard {bad.name} has another sha256 than manifest.json "
                                     "records (it changed after it was written)") and "\n" not in str(err.value)


class NoMd5:
    """A stand-in for a composite object (GCS gives no md5Hash for one: `gcloud storage cp`'s parallel composite
    uploads make them); fake-gcs-server gives every object an md5, so the metadata is taken off here. Everything
    else is the real pyarrow filesystem on fake-gcs-server."""

    def __init__(self, fs) -> None:
        self.fs = fs

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def open_input_file(self, path):
        real = self.fs.open_input_file(path)

        class File:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                real.close()

            def metadata(self):
                return {k: v for k, v in dict(real.metadata()).items() if k not in ("md5Hash", b"md5Hash")}

        return File()


def test_a_gs_shard_without_an_md5_is_not_skipped_its_sha256_is_checked_when_read(
        tmp_path, fake_gcs, prefix, monkeypatch) -> None:
    """The stated rule (trainer/job/shard_manifest.py): an object without an md5 passes the driver's metadata check on
    its size, and its bytes are checked against the manifest's sha256 when the stream reads it."""
    args, checked = _sharded(tmp_path, fake_gcs, prefix, monkeypatch)
    fs, base = filesystem(checked.root, fake_gcs)
    target = checked.shards[0]
    same_size = bytes(b ^ 0xFF for b in shard_read.shard_bytes(target, checked.root, fake_gcs))
    with fs.open_output_stream(f"{base}/{target.name}") as out:
        out.write(same_size)
    with pytest.raises(shard_manifest.ManifestError):  # with its md5: the driver refuses it
        shard_manifest.check_shards(checked, fs, base, is_gcs=True)
    shard_manifest.check_shards(checked, NoMd5(fs), base, is_gcs=True)  # without: the size is all the driver has
    with pytest.raises(shard_manifest.ManifestError) as err:
        shard_read.shard_bytes(target, checked.root, fake_gcs)
    assert f"shard {target.name} has another sha256" in str(err.value)
    assert "sha256" in shard_manifest.NO_MD5_RULE


def test_a_sha256_stop_inside_ray_data_is_the_runs_one_sentence(tmp_path, fake_gcs, prefix, monkeypatch) -> None:
    """The train read (`ShardRead`, as a Ray Data task runs it) carries the sentence through Ray Data's error."""
    args, _ = _sharded(tmp_path, fake_gcs, prefix, monkeypatch)
    _rewrite_manifest(prefix, fake_gcs, lambda m: m["shards"][0].update(sha256="1" * 64))
    checked = shard_manifest.check_for_run(args)
    read = shard_read.ShardRead(checked.root, checked.shard_format, sorted({*column_mapping(args).values(), "_row"}),
                                 fake_gcs)
    first = checked.shards[0]
    assert read({"uri": [checked.shards[1].uri], "name": [checked.shards[1].name],
                 "sha256": [checked.shards[1].sha256]}).num_rows == checked.shards[1].rows
    with pytest.raises(ValueError) as err:
        read({"uri": [first.uri], "name": [first.name], "sha256": [first.sha256]})
    said = stream_rows.stream_stop(RuntimeError(f"a Ray Data task failed: {err.value}"), 1)
    assert said is not None and said.startswith(f"dataset {prefix}: shard {first.name} has another sha256")


def _eval_rows(args, checked, tmp_path, processor, fake_gcs):
    plan = stream_plan.plan_stream(args, checked)
    return streaming.read_eval_rows(plan, column_mapping(args), Storage(root=str(tmp_path / "run"),
                                                                        emulator_host=fake_gcs),
                                    SampleEncoder(processor, args), args.max_seq_length)


def test_the_eval_splits_missing_shard_is_one_sentence(processor, tmp_path, fake_gcs, prefix, monkeypatch) -> None:
    args, checked = _sharded(tmp_path, fake_gcs, prefix, monkeypatch, "--eval_fraction=0.5")
    good, _ = _eval_rows(args, checked, tmp_path, processor, fake_gcs)
    assert [r["_row"] for r in good] == [4, 5, 6, 7]
    last = checked.shards[-1]
    fs, base = filesystem(checked.root, fake_gcs)
    fs.delete_file(f"{base}/{last.name}")
    with pytest.raises(UsageError) as err:
        _eval_rows(args, checked, tmp_path, processor, fake_gcs)
    said = str(err.value)
    assert said.startswith(f"the eval split: dataset {prefix}: shard {last.name} is missing (manifest.json lists it)") and \
        "\n" not in said


def test_the_eval_splits_forbidden_read_is_one_sentence(processor, tmp_path, fake_gcs, prefix, monkeypatch) -> None:
    args, checked = _sharded(tmp_path, fake_gcs, prefix, monkeypatch, "--eval_fraction=0.5")
    monkeypatch.setattr(shard_read, "filesystem", lambda uri, host=None: (Forbidden(), uri[5:]))
    with pytest.raises(UsageError) as err:
        _eval_rows(args, checked, tmp_path, processor, fake_gcs)
    said = str(err.value)
    assert said.startswith(f"the eval split: dataset {prefix}: the job may not read it (PERMISSION_DENIED") and \
        "roles/storage.objectViewer" in said and "\n" not in said


def test_the_eval_split_is_a_bounded_sample_read_no_further_than_it_needs(
        processor, tmp_path, fake_gcs, fake_gcs_downloads, prefix, monkeypatch) -> None:
    """Each worker holds at most EVAL_SAMPLE_ROWS eval rows (the first good ones of the held-out split) and reads no
    shard past the one that fills them; the summary's eval_rule states the bound."""
    args, checked = _sharded(tmp_path, fake_gcs, prefix, monkeypatch, "--eval_fraction=0.5")
    monkeypatch.setattr(streaming, "EVAL_SAMPLE_ROWS", 2)
    plan = stream_plan.plan_stream(args, checked)
    holding = [s for s in plan.eval_shards() if s.first_row <= 5 < s.first_row + s.rows][0]
    later = [s.uri for s in plan.eval_shards() if s.first_row > holding.first_row]
    assert later, "the sample must end before the last eval shard"
    before = fake_gcs_downloads()
    good, _ = _eval_rows(args, checked, tmp_path, processor, fake_gcs)
    assert [r["_row"] for r in good] == [4, 5]
    read = fake_gcs_downloads() - before
    assert read[holding.uri] == 1 and not any(read[u] for u in later)
    rule = streaming.eval_rule(plan, args, len(good))
    assert "4 rows" in rule and "at most 2" in rule and "2 here" in rule
