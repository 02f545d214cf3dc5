"""Errors of a streamed run that no retry fixes stop it at once with one sentence (trainer/job/shard_manifest.py,
trainer/data/stream_rows.py `stream_stop`): a dataset prefix the job cannot read, a shard deleted or replaced after
the driver checked the manifest (its size and md5 checked against the manifest again when the stream fails)."""

from __future__ import annotations

import errno

import pytest

from tests.trainer.data.test_stream_webdataset import COMMON, webdataset_shards
from trainer.data import stream_plan, stream_rows
from trainer.job import shard_manifest
from trainer.job.arguments import parse_args
from trainer.job.flag_values import column_mapping
from trainer.job.flags import UsageError
from trainer.job.storage import Storage


class Forbidden:
    """A stand-in for a gs:// prefix the service account may not list or read: pyarrow's GcsFileSystem raises
    PermissionError (EACCES) for GCS's 403 PERMISSION_DENIED; fake-gcs-server has no IAM and root reads every local
    file, so no real part here can refuse. Every call the manifest's read makes refuses as GCS would."""

    def __getattr__(self, name):
        def refuse(*args, **kwargs):
            raise PermissionError(errno.EACCES, "google::cloud::Status(PERMISSION_DENIED: 403 caller does not have "
                                                "storage.objects.get access)")
        return refuse


def test_a_prefix_the_job_cannot_read_is_one_sentence(monkeypatch) -> None:
    from trainer.job import storage

    monkeypatch.setattr(storage, "filesystem", lambda uri, host=None: (Forbidden(), uri[5:]))
    args = parse_args([*COMMON, "--dataset_name=gs://their-bucket/data", "--streaming=true"])
    with pytest.raises(UsageError) as err:
        shard_manifest.check_for_run(args)
    said = str(err.value)
    assert said.startswith("dataset gs://their-bucket/data: the job may not read it (PERMISSION_DENIED") and \
        "roles/storage.objectViewer" in said and "\n" not in said


def test_a_shard_replaced_after_the_check_is_named(tmp_path) -> None:
    shards_dir = webdataset_shards(tmp_path)
    args = parse_args([*COMMON, f"--dataset_name={shards_dir}", "--streaming=true"])
    shards = shard_manifest.to_config(shard_manifest.check_for_run(args))
    assert shard_manifest.changed_shard(shards) is None
    (shards_dir / "shard-00001.tar").write_bytes(b"another shard")
    said = stream_rows.stream_stop(RuntimeError("a Ray Data read error"), 1, shards)
    assert said is not None and said.startswith(f"dataset {shards_dir}: shard shard-00001.tar has 13 bytes") \
        and said.endswith("it changed while the run read it, so the run stops (every retry would fail the same way)")


def test_a_shard_deleted_mid_run_stops_the_stream_with_one_sentence(processor, ray_cluster, tmp_path) -> None:
    """The shard goes after the driver's check: its read (trainer/job/shard_read.py, a Ray Data task) fails, and the
    stream's stop names the shard instead of a retry (every retry would fail the same way)."""
    shards_dir = webdataset_shards(tmp_path)
    args = parse_args([*COMMON, f"--dataset_name={shards_dir}", "--streaming=true", "--eval_fraction=0"])
    checked = shard_manifest.check_for_run(args)
    (shards_dir / "shard-00002.tar").unlink()
    stream_rows.configure_data_context(None)
    with pytest.raises(Exception) as err:  # Ray Data lists the paths as the dataset is built (rank 0, each epoch)
        stream_rows.epoch_dataset(stream_plan.plan_stream(args, checked), 0, processor, args, column_mapping(args),
                                  Storage(root=str(tmp_path / "run")), set(), 1).take_all()
    said = stream_rows.stream_stop(err.value, 1, shard_manifest.to_config(checked))
    assert said == (f"dataset {shards_dir}: shard shard-00002.tar is missing (manifest.json lists it); write it again: "
                    f"delete it and manifest.json, then run `gemma3-ray data shard SOURCE --to {shards_dir} --apply` "
                    "with the same source and flags; the run stops (every retry would fail the same way)"), said


@pytest.mark.parametrize("cpus, held, decoders, said", [
    # RAY_ADDRESS=local on a 2-core machine: one CPU training worker, the default two decoders
    ({"n1": 2.0}, {"n1": 1.0}, 2, "the streaming CPU stage's 2 decoder(s) need 1 CPU each on the training workers' "
     "nodes beyond the training workers' 1 CPU(s), and those nodes have 2 CPU(s): room for 1 decoder(s); use "
     "--streaming_decoders=1 (chart: training.streaming_decoders), or give the workers' nodes more CPUs"),
    ({"n1": 1.0}, {"n1": 1.0}, 1, "the streaming CPU stage's 1 decoder(s) need 1 CPU each on the training workers' "
     "nodes beyond the training workers' 1 CPU(s), and those nodes have 1 CPU(s): room for none; give the workers' "
     "nodes more CPUs, or use fewer training workers per node"),
    # half a CPU free on each of two nodes: one CPU in all, but no whole CPU for a decoder on any node
    ({"n1": 9.0, "n2": 9.0}, {"n1": 8.5, "n2": 8.5}, 2, "the streaming CPU stage's 2 decoder(s) need 1 CPU each on "
     "the training workers' nodes beyond the training workers' 17 CPU(s), and those nodes have 18 CPU(s): room for "
     "none; give the workers' nodes more CPUs, or use fewer training workers per node"),
])
def test_decoders_that_cannot_be_placed_are_one_sentence_before_the_first_step(cpus, held, decoders, said) -> None:
    assert stream_rows.placement_problem(decoders, cpus, held) == said
    assert stream_rows.placement_problem(decoders, cpus, {n: 0.0 for n in cpus}) is None


def test_the_cpus_of_the_training_workers_nodes_come_from_ray(ray_cluster) -> None:
    import ray

    from tests.trainer.conftest import RAY_CPUS

    here = ray.get_runtime_context().get_node_id()
    assert stream_rows.node_cpus([here]) == {here: float(RAY_CPUS)}


@pytest.mark.parametrize("raw, why", [(None, "it has none"), (b'{"format": 1, "epoch": 0, "ro', "it is torn or not one")])
def test_a_checkpoint_without_a_usable_stream_state_is_one_sentence_not_a_restart_at_epoch_0(raw, why) -> None:
    with pytest.raises(UsageError) as err:
        stream_plan.resume_state(raw, "gs://b/runs/r/checkpoint_000002")
    said = str(err.value)
    assert said.startswith("checkpoint gs://b/runs/r/checkpoint_000002 cannot resume the stream: "
                           f"{stream_plan.STATE_FILE} ({why}) ") and "\n" not in said and "--run_name" in said
    state = stream_plan.StreamState(1, 4, {3, 5})
    assert stream_plan.resume_state(state.to_json({3, 5}, 8, 6), "x").rows == {3, 5}
