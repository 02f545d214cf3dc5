"""How the trainer's packages arrive: the training image (nothing installed at start) or the Ray Train
workers' runtime env (the workers install them; the head, and the job's runtime env, install nothing)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import yaml
from helm_render import CHART, CI_VALUES_DIR, Render, helm_template
from worker_env import job_argv, workers_runtime_env

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
CI_IMAGE = CI_VALUES_DIR / "training-image-values.yaml"
TRAINING_IMAGE = "us-docker.pkg.dev/example-project/gemma3-ray/gemma3-ray-trainer:0123456789ab"
# Runtime env fields that install or replace Python packages when a job or worker starts.
INSTALLING_FIELDS = {"pip", "uv", "conda", "container", "image_uri", "py_executable"}


def runtime_env(r: Render) -> dict:
    return yaml.safe_load(r.one("RayJob")["spec"]["runtimeEnvYAML"])


def pins() -> list[str]:
    lines = [ln.split("#", 1)[0].strip() for ln in (CHART / "files/trainer/requirements.txt").read_text().splitlines()]
    return [ln for ln in lines if ln and not re.match(r"^ray(\[|==)", ln)]


def containers(template: dict) -> list[dict]:
    return template["spec"]["containers"]


def images(r: Render) -> dict[str, str]:
    spec = r.one("RayJob")["spec"]
    cluster = spec["rayClusterSpec"]
    return {
        "head": containers(cluster["headGroupSpec"]["template"])[0]["image"],
        "worker": containers(cluster["workerGroupSpecs"][0]["template"])[0]["image"],
        "submitter": spec["submitterPodTemplate"]["spec"]["containers"][0]["image"],
    }


def installer_flags(r: Render) -> dict[str, str]:
    words = dict(w[2:].split("=", 1) for w in job_argv(r))
    return {k: v for k, v in words.items() if k in ("installer", "extra_pip")}


def test_image_dependencies_install_nothing_at_start(renders: dict[str, Render], tmp_path: Path) -> None:
    r = renders[CI_IMAGE.name]
    env = runtime_env(r)
    assert not INSTALLING_FIELDS & set(env), env
    assert env["config"] == {"setup_timeout_seconds": 1800}
    assert installer_flags(r) == {"installer": "none"}
    assert workers_runtime_env(r, tmp_path) == {}  # the workers install nothing either


def test_image_dependencies_run_the_training_image_on_the_workers_only(renders: dict[str, Render]) -> None:
    got = images(renders[CI_IMAGE.name])
    assert got["worker"] == TRAINING_IMAGE
    # The head runs the driver and Ray Train's controller, which need only Ray: the stock image.
    assert got["head"] == got["submitter"]
    assert got["head"].startswith("rayproject/ray:") and got["head"].endswith("-py311")


def test_head_image_override_with_image_dependencies(render: Callable[..., Render]) -> None:
    r = render(CI_IMAGE, sets={"head.image.repository": "us-docker.pkg.dev/p/r/ray"})
    got = images(r)
    assert got["worker"] == TRAINING_IMAGE
    assert got["head"] == got["submitter"] and got["head"].startswith("us-docker.pkg.dev/p/r/ray:")


def test_runtime_env_dependencies_go_to_the_workers_only(render: Callable[..., Render], tmp_path: Path) -> None:
    """dependencies=runtimeEnv: the job's runtime env (every process of the job, the head's driver and
    Ray Train's controller included) installs nothing; the driver gives the pins, with the chosen
    installer, to the Ray Train workers' runtime env only."""
    r = render(CI_DEFAULT)  # uv: measured 2.2x faster than pip (bench/RESULTS.md)
    assert not INSTALLING_FIELDS & set(runtime_env(r)), runtime_env(r)
    assert installer_flags(r) == {"installer": "uv"}
    assert workers_runtime_env(r, tmp_path / "uv") == {"uv": {"packages": pins(), "uv_check": False}}
    r = render(CI_DEFAULT, sets={"rayJob.runtimeEnv.installer": "pip", "rayJob.runtimeEnv.setupTimeoutSeconds": 900,
                                 "rayJob.runtimeEnv.extraPip[0]": "wandb==0.19.0"})
    job_env = runtime_env(r)
    assert not INSTALLING_FIELDS & set(job_env), job_env
    assert job_env["config"] == {"setup_timeout_seconds": 900}  # the workers inherit it (Ray merges per field)
    assert installer_flags(r) == {"installer": "pip", "extra_pip": '[ "wandb==0.19.0" ]'}
    assert workers_runtime_env(r, tmp_path / "pip") == {"pip": {"packages": [*pins(), "wandb==0.19.0"],
                                                                 "pip_check": False}}


def test_the_runtime_envs_are_ones_ray_accepts(tmp_path: Path) -> None:
    """Ray's own validation of the rendered job runtime env (both modes, both installers) and of what the
    workers get: the driver's worker env merged over it as Ray merges a child's (per field). Its
    working_dir is a path in the submitter pod (the trainer ConfigMap's mount), which Ray checks
    exists: a local directory stands in for it."""
    from ray.runtime_env import RuntimeEnv

    for i, (files, sets) in enumerate([([CI_DEFAULT], {}), ([CI_DEFAULT], {"rayJob.runtimeEnv.installer": "pip"}),
                                       ([CI_IMAGE], {})]):
        r = helm_template(files, sets)
        assert r.returncode == 0, r.stderr
        env = runtime_env(r)
        assert env["working_dir"] == "/home/ray/trainer"
        RuntimeEnv(**{**env, "working_dir": str(tmp_path)})
        RuntimeEnv(**{**env, **workers_runtime_env(r, tmp_path / str(i)), "working_dir": str(tmp_path)})


def notes(values: Path, *sets: str) -> str:
    import os
    import subprocess

    from helm_render import NAMESPACE, RELEASE, helm_bin

    cmd = [helm_bin("HELM"), "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), "--dry-run=client"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env={**os.environ, "KUBECONFIG": os.devnull})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\nNOTES:\n", 1)[1]


def test_notes_say_how_dependencies_arrive_and_what_it_costs() -> None:
    image = notes(CI_IMAGE)
    assert TRAINING_IMAGE in image and "installs nothing at start" in image
    assert "the head (driver and Ray Train's controller: Ray only) runs rayproject/ray:" in " ".join(image.split())
    runtime = " ".join(notes(CI_DEFAULT, "rayJob.runtimeEnv.installer=pip").split())
    assert "installed with pip" in runtime and "GiB per worker node per start" in runtime
    assert "The head installs nothing" in runtime
    assert "dependencies=image" in runtime  # how to avoid the cost


def test_the_demo_checks_what_the_workers_would_install_and_installs_nothing(tmp_path: Path) -> None:
    """`make demo` verifies the workers' packages (pip's or uv's list alike) against the local Python and
    submits the entry point with --installer=none."""
    import json

    from localkit.chart_job import (
        local_entrypoint,
        local_runtime_env,
        parse_chart_job,
        write_files,
    )
    from localkit.errors import LocalKitError

    for installer in ("pip", "uv"):
        job = parse_chart_job(helm_template([CI_DEFAULT], {"rayJob.runtimeEnv.installer": installer}).stdout)
        code = tmp_path / installer
        write_files(job, code)
        env, checks = local_runtime_env(job, code, {})
        assert not INSTALLING_FIELDS & set(env) and env["config"]["setup_timeout_seconds"] == 1800
        assert [c.requirement for c in checks] == pins()
        words = local_entrypoint(job).split()
        assert f"--installer={installer}" in job.entrypoint and "--installer=none" in words
        job.flags["extra_pip"] = json.dumps(["no-such-package-here==1.0"])
        try:
            local_runtime_env(job, code, {})
        except LocalKitError as e:
            assert "no-such-package-here==1.0" in str(e)
        else:
            raise AssertionError(f"{installer}: an unsatisfied pin was not reported")
