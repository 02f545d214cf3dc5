"""Elastic on lost capacity: a 2-node local Ray cluster loses its second node mid-epoch and gets no
replacement. With `min_workers=1` the job continues on the surviving worker with the same global batch
(accumulation doubles), sees every sample of every epoch once, and its per-step losses stay within
`LOSS_RTOL` of the uninterrupted 2-worker run. (Without it, the job waits for 2 workers forever.)
When the node comes back, a job running on one worker grows back to two, under the same guarantees."""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from e2e.support.proc import run_child
from tests.trainer.conftest import ROOT

pytestmark = pytest.mark.slow

N_ROWS = 12  # all trained on (no eval split): 3 optimizer steps of 4 samples per epoch
EPOCHS = 2
MICRO_BATCH = 1
GLOBAL_BATCH = 4  # 2 workers x micro-batch 1 x 2 accumulation = 1 worker x 1 x 4
SAVE_STEPS = 2
REMOVE_AFTER_STEP = 3  # the last step of epoch 1; the resize resumes mid-epoch, from the step-2 checkpoint
RESUMED_AT = REMOVE_AFTER_STEP - REMOVE_AFTER_STEP % SAVE_STEPS
STEPS = N_ROWS // GLOBAL_BATCH * EPOCHS
# The same samples per step on 1 or 2 workers; only the reduction order of the gradients differs.
# Measured: 8e-8 relative at most (1 vs 2 workers, 6 steps).
LOSS_RTOL = 1e-5
ID_PATTERN = r"#(\d{4})"
# Generous: the elastic job takes ~1-2 minutes on a loaded 2-core machine (Ray Train notices the dead
# node, re-plans on the surviving one, restarts from the checkpoint).
DEADLINE_S = 420
DRILL_TIMEOUT_S = 2 * DEADLINE_S + 120


def build_rows(out_dir: Path, n_rows: int) -> Path:
    """The demo's product rows, each product name ending in a unique `#NNNN` (the sample id)."""
    from datasets import Dataset, Features, Image, Value

    from localkit.sample_data import rows

    data = rows(n_rows, seed=0)
    for i, row in enumerate(data):
        row["Product Name"] = f"{row['Product Name']} #{i:04d}"
    features = Features({"Product Name": Value("string"), "Category": Value("string"), "image": Image(),
                         "description": Value("string")})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "products.parquet"
    Dataset.from_list(data, features=features).to_parquet(str(path))
    return path


def flags(tiny_model: Path, data: Path, cache_dir: Path, storage: Path, elastic: bool) -> list[str]:
    return [
        f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={cache_dir}",
        f"--storage_path={storage}", "--use_gpu=false", "--quantization=none", "--num_workers=2",
        *(["--min_workers=1"] if elastic else []),
        f"--per_device_train_batch_size={MICRO_BATCH}", f"--global_batch_size={GLOBAL_BATCH}",
        f"--num_train_epochs={EPOCHS}", "--logging_steps=1", "--save_strategy=steps", f"--save_steps={SAVE_STEPS}",
        "--eval_fraction=0", "--learning_rate=5e-3", "--lora_dropout=0", "--gradient_checkpointing=false",
        "--max_failures=3", "--seed=7",
    ]


def run_drill(tmp: Path, jobs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    spec = {"jobs": jobs, "records_dir": str(tmp / "records"), "id_pattern": ID_PATTERN}
    (tmp / "spec.json").write_text(json.dumps(spec))
    out, log = tmp / "result.json", tmp / "drill.log"
    # A stop of the test run reaches the drill, which shuts its Ray cluster down (e2e.support.proc.run_child; subprocess.run
    # would SIGKILL it 0.25 s after the interrupt).
    proc = run_child([sys.executable, "-m", "tests.trainer.elastic_drill", "--spec", str(tmp / "spec.json"),
                         "--out", str(out)], cwd=ROOT, timeout=DRILL_TIMEOUT_S)
    log.write_text(proc.stdout + proc.stderr)
    assert out.exists(), log.read_text()[-4000:]
    return {j["name"]: j for j in json.loads(out.read_text())["jobs"]}


def final_steps(records_dir: Path) -> dict[int, dict[str, Any]]:
    """Step -> the samples of its last computation (a resize recomputes the steps after the checkpoint)."""
    by_attempt: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for path in records_dir.glob("samples-*.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            by_attempt[rec["attempt"]][rec["step"]].append(rec)
    steps: dict[int, dict[str, Any]] = {}
    for attempt in sorted(by_attempt):  # later attempts overwrite the steps they recomputed
        for step, recs in by_attempt[attempt].items():
            steps[step] = {"attempt": attempt, "world": recs[0]["world"], "epoch": recs[0]["epoch"],
                           "ids": sorted(i for r in recs for i in r["ids"])}
    return steps


def train_losses(job: dict[str, Any]) -> dict[int, float]:
    lines = Path(job["summary"]["metrics"]).read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"}


@pytest.fixture(scope="module")
def drill(ray_cluster, tiny_model, cache_dir, tmp_path_factory) -> dict[str, Any]:
    from tests.trainer.drill_callbacks import RecordSamples
    from trainer import vision_train as vt

    tmp = tmp_path_factory.mktemp("elastic")
    data = build_rows(tmp / "data", N_ROWS)
    # The uninterrupted reference loses and gains no node: a plain 2-worker job on the session's cluster, in
    # this process (in the drill it cost one more local cluster of its own). The same flags and records.
    records = tmp / "records" / "uninterrupted"
    reference = {"name": "uninterrupted", "summary": vt.main(flags(tiny_model, data, cache_dir, tmp / "uninterrupted",
                                                                   False),
                                                             callbacks=[RecordSamples(str(records), ID_PATTERN)])}
    jobs = [
        {"name": "elastic", "flags": flags(tiny_model, data, cache_dir, tmp / "elastic", True),
         "deadline_s": DEADLINE_S, "remove_node_after_step": REMOVE_AFTER_STEP},
        # Starts on the head alone; the second node joins after step REMOVE_AFTER_STEP.
        {"name": "regrow", "flags": flags(tiny_model, data, cache_dir, tmp / "regrow", True), "nodes": 1,
         "deadline_s": DEADLINE_S, "add_node_after_step": REMOVE_AFTER_STEP},
    ]
    return {"tmp": tmp, "jobs": {"uninterrupted": reference, **run_drill(tmp, jobs)}}


def test_job_finishes_on_the_surviving_worker(drill) -> None:
    job = drill["jobs"]["elastic"]
    assert "node_removed_after_s" in job, job  # the drill did remove the node
    assert job["finished"], f"still waiting {job['elapsed_s']:.0f} s after start: {job.get('error', '')}"
    assert "error" not in job, job["error"]
    assert job["summary"]["global_step"] == STEPS
    steps = final_steps(drill["tmp"] / "records" / "elastic")
    worlds = [steps[s]["world"] for s in sorted(steps)]
    assert worlds == [2] * RESUMED_AT + [1] * (STEPS - RESUMED_AT), worlds
    assert job["summary"]["resumed_from_step"] == RESUMED_AT


def test_job_grows_back_when_capacity_returns(drill) -> None:
    job = drill["jobs"]["regrow"]
    assert "node_added_after_s" in job, job
    assert job["finished"] and "error" not in job, job.get("error", job)
    assert job["summary"]["global_step"] == STEPS and job["summary"]["num_workers"] == 2
    steps = final_steps(drill["tmp"] / "records" / "regrow")
    worlds = [steps[s]["world"] for s in sorted(steps)]
    assert worlds == [1] * RESUMED_AT + [2] * (STEPS - RESUMED_AT), worlds


def test_each_epoch_sees_each_sample_once(drill) -> None:
    everything = sorted(f"{i:04d}" for i in range(N_ROWS))
    for name in ("uninterrupted", "elastic", "regrow"):
        steps = final_steps(drill["tmp"] / "records" / name)
        assert sorted(steps) == list(range(1, STEPS + 1)), name
        for s, rec in steps.items():
            assert len(rec["ids"]) == GLOBAL_BATCH, (name, s, rec)
        per_epoch = N_ROWS // GLOBAL_BATCH
        for epoch in range(EPOCHS):
            seen = sorted(i for s in range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1) for i in steps[s]["ids"])
            assert seen == everything, (name, epoch, seen)


@pytest.mark.parametrize("name", ["elastic", "regrow"])
def test_loss_trajectory_matches_the_uninterrupted_run(drill, name: str) -> None:
    reference = train_losses(drill["jobs"]["uninterrupted"])
    resized = train_losses(drill["jobs"][name])
    assert sorted(resized) == sorted(reference) == list(range(1, STEPS + 1))
    ref_steps = final_steps(drill["tmp"] / "records" / "uninterrupted")
    got_steps = final_steps(drill["tmp"] / "records" / name)
    for s in range(1, STEPS + 1):
        assert got_steps[s]["ids"] == ref_steps[s]["ids"], s  # the same samples in every step
        assert resized[s] == pytest.approx(reference[s], rel=LOSS_RTOL), s
