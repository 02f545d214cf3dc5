"""The rollback stage's "nothing re-trained" (#42 item 5): read from what a restart cannot rewrite, the objects'
Cloud Storage generations under the run's checkpoints/, final/ and merged/ (before: a count of `train` records in
metrics.jsonl, which the trainer writes again on every start, so the check could not fail). The comparison is a
function; the generations come from a real fake-gcs-server process (standing in for Cloud Storage: no Google
here) through both storage modes, the in-cluster emulator's JSON API and the bucket's google-cloud-storage client."""

from __future__ import annotations

from pathlib import Path

from e2e.stages.day_two import retrained_problem
from e2e.support.storage import bucket as st
from e2e.support.storage.emulator import EMULATOR_BUCKET, EmulatorStorage
from tests.e2e.test_e2e_real_bucket import BUCKET, _client, gcs  # noqa: F401 - the fixture

RUN = "gs://b/e2e/runs/run-1"
BEFORE = {"e2e/runs/run-1/checkpoints/checkpoint-4/adapter.safetensors": "11",
          "e2e/runs/run-1/final/adapter_model.safetensors": "12", "e2e/runs/run-1/summary.json": "13",
          "e2e/runs/run-1/metrics.jsonl": "14"}


def test_a_finished_run_started_again_that_trains_nothing_passes() -> None:
    # the driver may write summary.json and metrics.jsonl again on any start: not evidence of training
    after = {**BEFORE, "e2e/runs/run-1/summary.json": "21", "e2e/runs/run-1/metrics.jsonl": "22"}
    assert retrained_problem(BEFORE, after, RUN) == ""


def test_an_adapter_written_again_or_a_new_checkpoint_is_training_again() -> None:
    again = {**BEFORE, "e2e/runs/run-1/final/adapter_model.safetensors": "31"}
    assert "written again: final/adapter_model.safetensors" in retrained_problem(BEFORE, again, RUN)
    # the same bytes written again (a re-train to the same weights) is still a new generation: caught
    more = {**BEFORE, "e2e/runs/run-1/checkpoints/checkpoint-2/adapter.safetensors": "32"}
    assert "new: checkpoints/checkpoint-2/adapter.safetensors" in retrained_problem(BEFORE, more, RUN)
    # a sibling run's objects (run-10 shares the prefix run-1) are not this run's
    sibling = {**BEFORE, "e2e/runs/run-10/final/adapter_model.safetensors": "33"}
    assert retrained_problem(BEFORE, sibling, RUN) == ""


def test_nothing_to_compare_or_no_generations_is_a_failure_not_a_pass() -> None:
    assert "nothing to compare" in retrained_problem({}, {}, RUN)
    blank = {n: "" for n in BEFORE}
    assert "without a generation" in retrained_problem(blank, blank, RUN)


def test_both_storage_modes_give_a_new_generation_for_every_write(gcs: str, tmp_path: Path) -> None:  # noqa: F811
    em = EmulatorStorage(None, "ns", "unused", "IfNotPresent", tmp_path / "m1", tmp_path / "log")  # type: ignore[arg-type]
    em.local_port = int(gcs.rsplit(":", 1)[1])
    em.ensure()
    f = tmp_path / "w.bin"
    f.write_bytes(b"same bytes")
    em.upload_tree(f, f"gs://{EMULATOR_BUCKET}/runs/r/final")
    first = em.generations(f"gs://{EMULATOR_BUCKET}/runs/r/")
    em.upload_tree(f, f"gs://{EMULATOR_BUCKET}/runs/r/final")
    second = em.generations(f"gs://{EMULATOR_BUCKET}/runs/r/")
    assert list(first) == list(second) == ["runs/r/final/w.bin"] and all(first.values())
    assert first != second, "the same bytes written again must get a new generation"
    assert em.list(f"gs://{EMULATOR_BUCKET}/runs/r/") == ["runs/r/final/w.bin"]

    bs = st.BucketStorage(BUCKET, "team/e2e", "r9", tmp_path / "m2", client=_client(gcs))
    bs.upload_tree(f, bs.uri("runs/r/final"))
    one = bs.generations(bs.root + "/")
    bs.upload_tree(f, bs.uri("runs/r/final"))
    two = bs.generations(bs.root + "/")
    assert list(one) == list(two) and all(one.values()) and one != two
