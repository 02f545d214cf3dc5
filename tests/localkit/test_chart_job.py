"""What the chart would run, read from a real ``helm template`` of values/local.yaml: the trainer files,
entry point and runtime env a local run takes (localkit/chart_job.py), and the renders it refuses."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from localkit.chart_job import (
    local_entrypoint,
    parse_chart_job,
    render_chart,
    worker_packages,
    write_files,
)
from localkit.errors import LocalKitError

ROOT = Path(__file__).resolve().parents[2]
HELM = os.environ.get("HELM") or str(ROOT / ".tools" / "bin" / "helm")
CHART = ROOT / "charts" / "gemma3-ray"
LOCAL_VALUES = ROOT / "values" / "local.yaml"


def test_rendered_local_values_give_a_local_run_what_it_needs(tmp_path: Path) -> None:
    job = parse_chart_job(render_chart(HELM, CHART, LOCAL_VALUES, {"training.model_id": "/m", "training.dataset_name": "/d"}))
    assert set(job.files) >= {"vision_train.py", "requirements.txt", "job.flags.py"}
    assert job.items["job.flags.py"] == "trainer/job/flags.py" and job.items["vision_train.py"] == "trainer/vision_train.py"
    assert job.entrypoint.startswith("python -m trainer.vision_train ")
    assert job.runtime_env["working_dir"] == job.mount_path == "/home/ray/trainer"
    assert job.storage_path.startswith("gs://")
    assert job.flags["use_gpu"] == "false" and job.num_workers == 2
    assert job.flags["installer"] == "uv"  # rayJob.runtimeEnv.installer: uv (the default), for the workers only
    write_files(job, tmp_path / "trainer")
    pins = worker_packages(job, tmp_path / "trainer")
    assert any(p.startswith("transformers==") for p in pins)
    assert "--installer=none" in local_entrypoint(job).split()  # the local workers install nothing


def test_bad_values_fail_with_helms_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**yaml.safe_load(LOCAL_VALUES.read_text()), "mode": "sometimes"}))
    with pytest.raises(LocalKitError, match="helm template` failed"):
        render_chart(HELM, CHART, bad)


def test_a_job_that_does_not_carry_its_code_is_refused() -> None:
    """A local run runs the ConfigMap as the job's working_dir only if the chart's RayJob does too."""
    rendered = render_chart(HELM, CHART, LOCAL_VALUES, {"training.model_id": "/m", "training.dataset_name": "/d"})
    docs = list(yaml.safe_load_all(rendered))
    (job,) = [d for d in docs if d and d["kind"] == "RayJob"]
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    env["working_dir"] = "/elsewhere"
    job["spec"]["runtimeEnvYAML"] = yaml.safe_dump(env)
    with pytest.raises(LocalKitError, match="working_dir"):
        parse_chart_job(yaml.safe_dump_all(docs))


def test_a_module_at_any_depth_lands_in_its_folder(tmp_path: Path) -> None:
    """The kit writes the ConfigMap back as the kubelet does: a module three folders deep lands at its path."""
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart)
    deep = chart / "files" / "trainer" / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "c.py").write_text("DEPTH = 3\n")
    job = parse_chart_job(render_chart(HELM, chart, LOCAL_VALUES, {"training.model_id": "/m", "training.dataset_name": "/d"}))
    assert job.items["a.b.c.py"] == "trainer/a/b/c.py"
    written = write_files(job, tmp_path / "mount")
    assert tmp_path / "mount" / "trainer" / "a" / "b" / "c.py" in written
    assert (tmp_path / "mount" / "trainer" / "a" / "b" / "c.py").read_text() == "DEPTH = 3\n"
    assert (tmp_path / "mount" / "trainer" / "job" / "flags.py").read_bytes() == (CHART / "files/trainer/job/flags.py").read_bytes()
