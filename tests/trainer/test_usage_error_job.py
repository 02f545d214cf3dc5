"""A usage error the workers find ends the job with its one sentence and exit 2 (#27.14): no traceback on the
console (the driver as `ray job submit` runs it: Ray's worker and controller logs reach it), and Ray starts the
worker group once, never again (the README: "without Ray retrying it"). Before, the console showed 7-9
traceback blocks and a second worker group. The driver runs in a process of its own, connected to the test's
Ray cluster, with log_to_driver on. The bad_rows=fail run also holds tests/trainer/test_messy_data.py's claim for
those rows (issue #13): it stops before training, naming the row, and trains no step (one run for both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer.messy import write_messy_jsonl
from tests.trainer.test_ray_job import job_flags

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "trainer.vision_train"  # run as `python -m trainer.vision_train` from ROOT
N_GOOD = 6
RUNNER = """
import runpy, sys
import ray
address, module = sys.argv[1:3]
# log_to_driver: the workers' and controller's logs reach this console. RAY_ADDRESS: this cluster for the State
# API clients in the job's actors (Ray Train's PlacementGroupCleaner), where other local Ray clusters may run.
ray.init(address=address, runtime_env={"env_vars": {"RAY_ADDRESS": address}})
print("JOB", ray.get_runtime_context().get_job_id(), file=sys.stderr, flush=True)
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def messy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """rows.jsonl: 6 good rows and 3 bad ones (row 6: corrupt_image); jsonl, so no row count before the scan.
    Also {reason: row index} of the bad rows."""
    sample = build_sample_dataset(tmp_path_factory.mktemp("sample"), n_rows=N_GOOD, seed=0)
    return write_messy_jsonl(sample, tmp_path_factory.mktemp("messy"), n_good=N_GOOD)


def run_driver(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], int]:
    """(the driver process, how many Ray Train workers its job started)."""
    import ray
    from ray._private import state

    proc = subprocess.run([sys.executable, "-c", RUNNER, ray.get_runtime_context().gcs_address, ENTRY, *argv],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    job = next(line.split()[1] for line in proc.stderr.splitlines() if line.startswith("JOB "))
    actors = state.actors(job_id=ray.JobID.from_hex(job)).values()
    return proc, sum(1 for a in actors if a.get("ActorClassName", "").endswith("RayTrainWorker"))


@pytest.mark.parametrize(("extra", "sentence"), [
    (["--bad_rows=fail"], "row 6: corrupt_image; --bad_rows=skip would skip such rows"),
    (["--bad_rows=skip"], "global_batch_size=8 is more than the 6 training rows (of 9 rows, 3 skipped, 0 held out for "
                          "eval): use --global_batch_size=6 (the most that 6 rows fill and 2 workers split exactly), "
                          "or add rows"),
])
def test_a_usage_error_on_the_workers_is_one_sentence_and_one_worker_group(ray_cluster, tiny_model, cache_dir, messy,
                                                                           tmp_path, extra: list[str],
                                                                           sentence: str) -> None:
    data, where = messy
    if "--bad_rows=fail" in extra:  # the row the sentence names is the corrupt one
        assert sentence.startswith(f"row {where['corrupt_image']}: corrupt_image; ")
    flags = [*job_flags(tiny_model, data, cache_dir, str(tmp_path / "storage"), 3, run_name="refused"),
             "--eval_fraction=0", "--sample_rows=0", *extra]
    proc, workers = run_driver(flags)
    console = proc.stdout + proc.stderr
    assert proc.returncode == 2, console[-6000:]
    assert proc.stderr.splitlines().count(f"error: {sentence}") == 1, console[-6000:]  # Ray's log lines may follow
    assert "Traceback" not in console, console[-8000:]
    assert workers == 2, f"{workers} Ray Train workers started: the group was started again"
    # Stopped before training: no summary, no metrics, no checkpoint (test_messy_data's bad_rows=fail claim).
    run = tmp_path / "storage" / "runs" / "refused"
    assert not (run / "summary.json").exists() and not (run / "metrics.jsonl").exists()
    assert not list(run.rglob("checkpoint-*"))  # no step was trained


def test_a_row_count_known_up_front_is_checked_before_any_worker(ray_cluster, tiny_model, cache_dir,
                                                                  tmp_path) -> None:
    """5 rows of parquet (its metadata counts them) on 2 workers at global batch 8: refused by the driver before any
    worker, model load or scan (before, after ~3 min of both), with a global batch that is itself accepted."""
    data = build_sample_dataset(tmp_path / "data", n_rows=5, seed=0)
    flags = [*job_flags(tiny_model, data, cache_dir, str(tmp_path / "storage"), 3, run_name="few"),
             "--eval_fraction=0", "--sample_rows=0"]
    proc, workers = run_driver(flags)
    assert proc.returncode == 2, (proc.stdout + proc.stderr)[-6000:]
    assert proc.stderr.splitlines().count(
        "error: global_batch_size=8 is more than the 5 training rows (of 5 rows, 0 held out for eval): use "
        "--global_batch_size=4 (the most that 5 rows fill and 2 workers split exactly), or add rows") == 1, proc.stderr
    assert workers == 0
