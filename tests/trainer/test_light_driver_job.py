"""The driver runs a whole job with only Ray installed (issue #11): a real tiny training run on the local
Ray cluster whose driver process, and every process of the job but Ray Train's workers (Ray Train's
controller among them), cannot import torch, transformers, trl, peft, datasets or PIL, as on a CPU head
that installs nothing. The workers import them as usual and the job ends with its summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from localkit.sample_data import build_sample_dataset
from tests.trainer import import_blocker

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "trainer.vision_train"  # run as `python -m trainer.vision_train` from ROOT
BLOCKER = Path(import_blocker.__file__)
MAX_STEPS = 2
# The driver as `python -m trainer.vision_train ARGS` runs it, connected to the test's Ray cluster with the
# blocker in every process of its job (sitecustomize through the job's PYTHONPATH) and in itself.
RUNNER = """
import importlib.util, json, os, runpy, sys
site, address, module = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("import_blocker", os.path.join(site, "sitecustomize.py"))
blocker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(blocker)  # installs it: the log is set
import ray
ray.init(address=address, log_to_driver=False, runtime_env={"env_vars": {
    "PYTHONPATH": os.pathsep.join([site, os.environ["PYTHONPATH"]]), blocker.LOG_ENV: os.environ[blocker.LOG_ENV]}})
sys.argv = [module, *sys.argv[4:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    print("IMPORTED", json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def test_a_job_runs_with_the_worker_packages_only_on_the_workers(ray_cluster, tiny_model, cache_dir,
                                                                 tmp_path: Path) -> None:
    import ray

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.read_text())
    log = tmp_path / "imports.log"
    log.touch()
    data = build_sample_dataset(tmp_path / "data", n_rows=6, seed=0)
    flags = [f"--model_id={tiny_model}", f"--dataset_name={data}", f"--cache_dir={cache_dir}",
             f"--storage_path={tmp_path / 'storage'}", "--run_name=light", "--use_gpu=false", "--quantization=none",
             "--num_workers=2", "--per_device_train_batch_size=1", "--global_batch_size=2",
             f"--max_steps={MAX_STEPS}", "--save_strategy=no", "--eval_fraction=0", "--sample_rows=0",
             "--installer=none"]
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(site), ray.get_runtime_context().gcs_address, ENTRY, *flags], cwd=ROOT,
        capture_output=True, text=True, timeout=600, env={**os.environ, import_blocker.LOG_ENV: str(log)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    assert "gemma3-ray training summary" in proc.stdout
    summary = json.loads((tmp_path / "storage" / "runs" / "light" / "summary.json").read_text())
    assert summary["global_step"] == MAX_STEPS and summary["num_workers"] == 2
    modules = json.loads(next(ln for ln in proc.stderr.splitlines() if ln.startswith("IMPORTED "))[9:])
    assert "trainer.job.flags" in modules
    assert not {m.partition(".")[0] for m in modules} & set(import_blocker.WORKER_PACKAGES), \
        "the driver imported a worker package"
    assert not [m for m in modules if m.startswith(import_blocker.WORKER_FOLDERS)], modules
    attempts = Counter(tuple(line.split()) for line in log.read_text().splitlines())
    allowed = {(who, pkg) for who, pkg, verdict in attempts if verdict == "allowed"}
    assert ("RayTrainWorker", "torch") in allowed, f"the blocker did not reach the job's processes: {attempts}"
    assert {who for who, _ in allowed} == {import_blocker.ALLOWED_ROLE}, attempts
