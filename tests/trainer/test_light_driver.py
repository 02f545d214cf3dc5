"""The driver is light (issue #11): the entry module and everything the head imports to parse, validate
and plan a run use only the standard library and Ray. Checked in a subprocess in which torch,
transformers, trl, peft, datasets, PIL (and the other worker packages) cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.trainer.import_blocker import WORKER_FOLDERS, WORKER_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
ENTRY = "trainer.vision_train"  # run as `python -m trainer.vision_train` from ROOT, which holds the package
# Runs the entry point as `python -m trainer.vision_train ARGS` does, with a meta-path finder that refuses the
# worker packages; then says which modules got imported.
BLOCK = """
import json, runpy, sys
BLOCKED = set(json.loads(sys.argv[1]))
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"{name} is not importable in this test", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""
RUNNER = BLOCK + """
module, sys.argv = sys.argv[2], [sys.argv[2], *sys.argv[3:]]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    print("IMPORTED", json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def run_entry(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, json.dumps(WORKER_PACKAGES), ENTRY, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    """The top-level packages the process imported, and the trainer's worker-side folders among its modules."""
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("IMPORTED "))
    modules = json.loads(line.removeprefix("IMPORTED "))
    assert "trainer.job.flags" in modules, "the trainer was not imported: the check would see nothing"
    return {m.partition(".")[0] for m in modules} | {m for m in modules if m.startswith(WORKER_FOLDERS)}


def test_help_needs_no_worker_package() -> None:
    proc = run_entry("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: vision_train.py")
    for name in ("--model_id", "--run_name", "--resume_from", "--recipe", "--bad_rows"):
        assert name in proc.stdout, name
    assert not imported(proc) & {*WORKER_PACKAGES, *WORKER_FOLDERS}


def test_flag_validation_needs_no_worker_package() -> None:
    proc = run_entry("--use_gpu=false", "--quantization=4bit", "--lora_r=0", "--lora_rank=4")
    assert proc.returncode == 2, proc.stderr
    assert "--lora_rank (did you mean --lora_r?)" in proc.stderr
    proc = run_entry("--use_gpu=false", "--quantization=4bit", "--lora_r=0")
    assert proc.returncode == 2, proc.stderr
    assert "quantization=4bit needs GPUs" in proc.stderr and "lora_r must be >= 1" in proc.stderr
    assert not imported(proc) & {*WORKER_PACKAGES, *WORKER_FOLDERS}


def test_the_run_plan_needs_no_worker_package(tmp_path: Path) -> None:
    """The driver decides about the run (here: it already finished) with the worker packages unimportable."""
    run = tmp_path / "runs" / "done"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"run_name": "done", "completed": True, "global_step": 7}))
    proc = run_entry("--use_gpu=false", "--quantization=none", f"--storage_path={tmp_path}", "--run_name=done")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "run done already finished at step 7; nothing to train"
    assert not imported(proc) & {*WORKER_PACKAGES, *WORKER_FOLDERS}


CHECK_DATA = BLOCK + """
from trainer.job.arguments import parse_args
from trainer.job.dataset_check import check_dataset_before_download
args = parse_args(["--use_gpu=false", "--quantization=none", f"--dataset_name={sys.argv[2]}",
                   f"--cache_dir={sys.argv[3]}"])
print("ROWS", json.dumps(check_dataset_before_download(args, sys.argv[4] or None, "v1")))
print("IMPORTED", json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def check_data_on_head(dataset: str, cache: Path, emulator: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHECK_DATA, json.dumps(WORKER_PACKAGES), dataset, str(cache), emulator],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_driver_checks_gs_data_with_ray_only(fake_gcs: str, tmp_path: Path) -> None:
    """The driver's up-front data check (columns, row count) of gs:// data runs on a Ray-only head (the stock
    Ray image: no datasets, no torch). Seen on the real cluster of `make e2e`: `import datasets` failed the job."""
    from tests.trainer.conftest import GCS_BUCKET, upload_rows
    from trainer.job.storage import Storage

    uri = upload_rows(Storage(root=f"gs://{GCS_BUCKET}/light-driver", emulator_host=fake_gcs), 6, tmp_path / "w")
    proc = check_data_on_head(uri, tmp_path / "cache", fake_gcs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ROWS 6" in proc.stdout
    assert not imported(proc) & {*WORKER_PACKAGES, *WORKER_FOLDERS}


def test_the_driver_leaves_a_hub_dataset_to_the_workers(tmp_path: Path) -> None:
    """A Hub dataset cannot be read without `datasets`: the head says nothing is known yet (None) and goes on."""
    proc = check_data_on_head("philschmid/amazon-product-descriptions-vlm", tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "ROWS null" in proc.stdout
