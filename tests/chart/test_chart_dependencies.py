"""How the trainer's packages arrive: the training image (nothing installed at start) or the runtime env."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import yaml
from helm_render import CHART, CI_VALUES_DIR, Render, helm_template

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


def test_image_dependencies_install_nothing_at_start(renders: dict[str, Render]) -> None:
    env = runtime_env(renders[CI_IMAGE.name])
    assert not INSTALLING_FIELDS & set(env), env
    assert env["config"] == {"setup_timeout_seconds": 1800}


def test_image_dependencies_run_the_training_image(renders: dict[str, Render]) -> None:
    got = images(renders[CI_IMAGE.name])
    # The head runs the driver and Ray Train's controller (which unpickles TorchConfig: torch).
    assert got["head"] == got["worker"] == TRAINING_IMAGE
    assert got["submitter"].startswith("rayproject/ray:") and got["submitter"].endswith("-py311")


def test_head_image_override_wins_with_image_dependencies(render: Callable[..., Render]) -> None:
    r = render(CI_IMAGE, sets={"head.image.repository": "rayproject/ray"})
    got = images(r)
    assert got["worker"] == TRAINING_IMAGE
    assert got["head"] == got["submitter"] and got["head"].startswith("rayproject/ray:")


def test_runtime_env_dependencies_install_the_pins_with_the_chosen_installer(render: Callable[..., Render]) -> None:
    default = runtime_env(render(CI_DEFAULT))  # uv: measured 2.2x faster than pip (bench/RESULTS.md)
    assert default["uv"] == {"packages": pins(), "uv_check": False}
    assert "pip" not in default
    pip = runtime_env(render(CI_DEFAULT, sets={"rayJob.runtimeEnv.installer": "pip", "rayJob.runtimeEnv.setupTimeoutSeconds": 900}))
    assert pip["pip"] == {"packages": pins(), "pip_check": False}
    assert "uv" not in pip
    assert pip["config"] == {"setup_timeout_seconds": 900}


def test_the_runtime_env_is_one_ray_accepts(tmp_path: Path) -> None:
    """Ray's own validation of the rendered runtime env (both modes, both installers). Its working_dir
    is a path in the submitter pod (the trainer ConfigMap's mount), which Ray checks exists: a local
    directory stands in for it."""
    from ray.runtime_env import RuntimeEnv

    for files, sets in [([CI_DEFAULT], {}), ([CI_DEFAULT], {"rayJob.runtimeEnv.installer": "pip"}), ([CI_IMAGE], {})]:
        r = helm_template(files, sets)
        assert r.returncode == 0, r.stderr
        env = runtime_env(r)
        assert env["working_dir"] == "/home/ray/trainer"
        RuntimeEnv(**{**env, "working_dir": str(tmp_path)})


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
    runtime = notes(CI_DEFAULT, "rayJob.runtimeEnv.installer=pip")
    assert "installed with pip" in runtime and "GiB per node per start" in runtime
    assert "dependencies=image" in runtime  # how to avoid the cost


def test_the_demo_checks_and_drops_either_installers_list(tmp_path: Path) -> None:
    """`make demo` submits the chart's runtime env without installing: pip's or uv's list alike."""
    from demo.chart_job import DemoError, local_runtime_env, parse_chart_job

    for installer in ("pip", "uv"):
        job = parse_chart_job(helm_template([CI_DEFAULT], {"rayJob.runtimeEnv.installer": installer}).stdout)
        env, checks = local_runtime_env(job, tmp_path, {})
        assert not INSTALLING_FIELDS & set(env) and env["config"]["setup_timeout_seconds"] == 1800
        assert [c.requirement for c in checks] == pins()
        job.runtime_env[installer]["packages"].append("no-such-package-here==1.0")
        try:
            local_runtime_env(job, tmp_path, {})
        except DemoError as e:
            assert "no-such-package-here==1.0" in str(e)
        else:
            raise AssertionError(f"{installer}: an unsatisfied pin was not reported")
