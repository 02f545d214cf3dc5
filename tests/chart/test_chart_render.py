"""Render-and-assert tests for the chart's features (real `helm template` output)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import (
    CHART,
    CI_VALUES_DIR,
    NAMESPACE,
    RELEASE,
    VALUES_DIR,
    Render,
    helm_template,
    pod_templates,
    same_but_run_name,
    values_files,
)
from trainer_package import configmap_key, trainer_files

PARALLEL_HELM = 4

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
TUTORIAL = VALUES_DIR / "tutorial.yaml"
MOUNT = "/home/ray/trainer"
ENTRY = ["python", "-m", "trainer.vision_train"]  # the package under the working_dir
REQUIREMENTS = CHART / "files" / "trainer" / "requirements.txt"
DERIVED = ("num_workers", "use_gpu", "storage_path", "run_name", "installer", "extra_pip")


def requirement_lines() -> list[str]:
    lines = [ln.split(" #")[0].strip() for ln in REQUIREMENTS.read_text().splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def ray_pin() -> str:
    (pin,) = [ln for ln in requirement_lines() if re.match(r"^ray(\[|==)", ln)]
    return pin.split("==")[1]


def entrypoint_argv(render: Render) -> list[str]:
    return shlex.split(render.one("RayJob")["spec"]["entrypoint"])


def flags(render: Render) -> dict[str, str]:
    argv = entrypoint_argv(render)
    assert argv[:3] == ENTRY, argv[:3]
    out: dict[str, str] = {}
    for word in argv[3:]:
        assert word.startswith("--") and "=" in word, word
        key, value = word[2:].split("=", 1)
        assert key not in out, f"flag {key} given twice"
        out[key] = value
    return out


def cluster_spec(render: Render) -> dict[str, Any]:
    job = render.one("RayJob")["spec"]
    return job["rayClusterSpec"] if "rayClusterSpec" in job else render.one("RayCluster")["spec"]


def containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    return template["spec"]["containers"]


# ---------------------------------------------------------------- every values file


def test_every_values_file_renders_the_core_objects(renders: dict[str, Render]) -> None:
    assert len(renders) >= 10, sorted(renders)
    for name, r in renders.items():
        kinds = sorted(d["kind"] for d in r.docs)
        assert "RayJob" in kinds and "ConfigMap" in kinds and "Service" in kinds, (name, kinds)
        for doc in r.docs:
            assert doc["metadata"]["namespace"] == NAMESPACE, (name, doc["kind"])


def _walk_nulls(node: Any, path: str) -> list[str]:
    if node is None:
        return [path]
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _walk_nulls(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _walk_nulls(v, f"{path}[{i}]")]
    return []


def test_no_bare_keys_anywhere(renders: dict[str, Render]) -> None:
    """A template must never leave `key:` with nothing under it (it loads as null)."""
    for name, r in renders.items():
        for doc in r.docs:
            assert not _walk_nulls(doc, doc["kind"]), (name, _walk_nulls(doc, doc["kind"]))


def test_helm3_and_helm4_render_identically(renders: dict[str, Render]) -> None:
    files = values_files()
    with ThreadPoolExecutor(PARALLEL_HELM) as pool:
        helm3 = list(pool.map(lambda f: helm_template([f], helm="HELM3"), files))
    for f, h3 in zip(files, helm3, strict=True):
        assert h3.returncode == 0, (f.name, h3.stderr)
        assert same_but_run_name(h3.docs) == same_but_run_name(renders[f.name].docs), f.name


@pytest.mark.parametrize(("kube", "ok"), [("1.29.0", False), ("1.30.0", True), ("1.35.0", True)])
def test_kube_version_constraint(kube: str, ok: bool) -> None:
    for helm in ("HELM", "HELM3"):
        r = helm_template([CI_DEFAULT], helm=helm, extra_args=("--kube-version", kube))
        assert (r.returncode == 0) == ok, (helm, kube, r.stderr)


# ---------------------------------------------------------------- versions: one source of truth


def test_images_and_ray_version_follow_the_requirements_pin(renders: dict[str, Render]) -> None:
    ray = ray_pin()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == ray
    r = renders["tutorial.yaml"]
    spec = cluster_spec(r)
    assert spec["rayVersion"] == ray
    (head,) = containers(spec["headGroupSpec"]["template"])
    (worker,) = containers(spec["workerGroupSpecs"][0]["template"])
    assert head["image"] == f"rayproject/ray:{ray}-py311"
    assert worker["image"] == f"rayproject/ray:{ray}-py311-gpu"
    submitter = r.one("RayJob")["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
    assert submitter["image"] == head["image"]


def test_the_job_runtime_env_installs_nothing_and_names_the_workers_installer(renders: dict[str, Render]) -> None:
    """The pins reach the Ray Train workers only (tests/chart/test_chart_dependencies.py builds their
    runtime env): the job's runtime env, which the head's driver and controller get, has no installer."""
    for name in ("tutorial.yaml", "local.yaml", "token-extras-values.yaml"):
        env = yaml.safe_load(renders[name].one("RayJob")["spec"]["runtimeEnvYAML"])
        assert not {"pip", "uv", "conda", "container", "image_uri"} & set(env), name
        assert flags(renders[name])["installer"] == "uv", name  # rayJob.runtimeEnv.installer: uv (the default)
    assert json.loads(flags(renders["token-extras-values.yaml"])["extra_pip"]) == ["wandb==0.19.0"]
    assert "extra_pip" not in flags(renders["tutorial.yaml"])
    extras = yaml.safe_load(renders["token-extras-values.yaml"].one("RayJob")["spec"]["runtimeEnvYAML"])
    # user envVars merge over the chart's default (which keeps Ray Train from printing every line twice)
    assert extras["env_vars"] == {"NCCL_DEBUG": "WARN", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}
    plain = yaml.safe_load(renders["tutorial.yaml"].one("RayJob")["spec"]["runtimeEnvYAML"])
    assert plain["env_vars"] == {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def test_image_tag_overrides_per_group(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"head.image.tag": "2.60.0-py311-custom", "workers.image.repository": "us-docker.pkg.dev/p/r/ray"})
    spec = cluster_spec(r)
    assert containers(spec["headGroupSpec"]["template"])[0]["image"] == "rayproject/ray:2.60.0-py311-custom"
    assert containers(spec["workerGroupSpecs"][0]["template"])[0]["image"] == f"us-docker.pkg.dev/p/r/ray:{ray_pin()}-py311-gpu"


# ---------------------------------------------------------------- trainer code and flags


def test_trainer_configmap_carries_the_files_and_a_content_hash(renders: dict[str, Render]) -> None:
    r = renders["tutorial.yaml"]
    cm = r.one("ConfigMap")
    files = {configmap_key(p): data.decode() for p, data in trainer_files(CHART / "files" / "trainer").items()}
    assert "job.flags.py" in files and "vision_train.py" in files
    assert cm["data"] == files, "the ConfigMap must hold the trainer package's files byte for byte (key: path, '.' for '/')"
    assert cm["immutable"] is True
    assert re.fullmatch(rf"{RELEASE}-gemma3-ray-trainer-[0-9a-f]{{10}}", cm["metadata"]["name"])


@pytest.mark.parametrize("name", ["tutorial.yaml", "default-values.yaml"])
def test_the_job_carries_its_code_and_no_ray_pod_mounts_it(renders: dict[str, Render], name: str) -> None:
    """Persistent mode ran stale code (issue #10, failure 3): KubeRay does not recreate a RayCluster's
    pods when its pod template changes (ray-operator/controllers/ray/raycluster_controller.go,
    reconcilePods: pods are recreated for a spec change only with spec.upgradeStrategy.type=Recreate,
    shouldRecreatePodsForUpgrade, KubeRay >= 1.6; v1.4.2 has no such path). So no Ray pod mounts the
    trainer: the submitter pod does, and its `ray job submit` uploads that directory as the runtime
    env's working_dir (KubeRay uses the submitterPodTemplate as given and only fills in the command:
    rayjob_controller.go, getSubmitterTemplate → common.GetSubmitterTemplate, configureSubmitterContainer)."""
    r = renders[name]
    cm = r.one("ConfigMap")["metadata"]["name"]
    job = r.one("RayJob")
    for doc in r.kinds("RayCluster") + [job]:
        for role, tpl in pod_templates(doc):
            assert cm not in json.dumps(tpl), (doc["kind"], role)
            assert all(v["name"] != "trainer" for v in tpl["spec"]["volumes"]), (doc["kind"], role)
    sub = job["spec"]["submitterPodTemplate"]["spec"]
    (vol,) = [v for v in sub["volumes"] if v["name"] == "trainer"]
    items = vol["configMap"].pop("items")
    assert vol == {"name": "trainer", "configMap": {"name": cm, "defaultMode": 0o444}}
    assert {i["key"] for i in items} == set(r.one("ConfigMap")["data"])  # every file mounted, in its folder
    assert all(i["path"].startswith("trainer/") for i in items)
    (mount,) = [m for m in containers({"spec": sub})[0]["volumeMounts"] if m["name"] == "trainer"]
    assert mount == {"name": "trainer", "mountPath": MOUNT, "readOnly": True}
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert env["working_dir"] == MOUNT and env["excludes"] == ["..*"]
    assert entrypoint_argv(r)[:3] == ENTRY, "the entry module runs from the job's working directory"


def test_configmap_name_changes_when_a_trainer_file_changes(tmp_path: Path) -> None:
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart)
    before = helm_template([CI_DEFAULT], chart=chart).one("ConfigMap")["metadata"]["name"]
    req = chart / "files" / "trainer" / "requirements.txt"
    req.write_text(req.read_text() + "# a comment changes the hash\n")
    after = helm_template([CI_DEFAULT], chart=chart).one("ConfigMap")["metadata"]["name"]
    assert before != after
    module = chart / "files" / "trainer" / "job" / "flags.py"  # a module in one of the package's folders
    module.write_text(module.read_text() + "# so does a comment here\n")
    assert helm_template([CI_DEFAULT], chart=chart).one("ConfigMap")["metadata"]["name"] not in (before, after)


def test_entrypoint_is_the_training_map_plus_derived_flags(renders: dict[str, Render]) -> None:
    r = renders["tutorial.yaml"]
    f = flags(r)
    values = yaml.safe_load(TUTORIAL.read_text())
    assert f.pop("num_workers") == "16"  # 2 replicas x 8 GPUs
    assert f.pop("use_gpu") == "true"
    assert f.pop("storage_path") == "gs://my-gemma3-ray-bucket/gemma3-vision"
    assert re.fullmatch(r"r1-[0-9]{8}-[0-9]{6}-[a-z0-9]{4}", f.pop("run_name"))
    assert f.pop("installer") == "uv"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())["training"]
    merged = {**defaults, **values["training"]}
    expected = {k: (json.dumps(v) if not isinstance(v, str) else v) for k, v in merged.items()}
    expected = {k: ("true" if v == "true" else "false" if v == "false" else v) for k, v in expected.items()}
    assert f == expected
    assert f["learning_rate"] == "0.0002" and f["lora_r"] == "16" and f["push_to_hub"] == "false"


def test_flags_json_and_shell_quoting_round_trip(renders: dict[str, Render]) -> None:
    f = flags(renders["token-extras-values.yaml"])
    assert json.loads(f["column_mapping"]) == {"image": "img", "answer": "description", "product": "Product Name"}
    assert f["system_message"] == "You are an expert product copywriter. Don't invent facts."
    assert f["prompt_template"] == 'Describe {product} in one paragraph & be concise (no "hype"; no *stars*)'
    assert f["max_steps"] == "1000000", "large integers must not become 1e+06"
    assert f["freeze_vision"] == "true"
    assert f["num_workers"] == "3"  # 3 replicas x 1 GPU


def test_null_drops_a_default_flag(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"training.save_strategy": None})
    assert r.returncode == 0, r.stderr
    assert "save_strategy" not in flags(r)
    assert "model_id" in flags(r)


@pytest.mark.parametrize(
    ("sets", "num_workers", "use_gpu"),
    [
        ({"workers.replicas": 3, "workers.gpusPerNode": 4}, "12", "true"),
        ({"workers.replicas": 1, "workers.gpusPerNode": 1}, "1", "true"),
        ({"workers.autoscaling.enabled": True, "workers.autoscaling.maxReplicas": 5, "workers.gpusPerNode": 2}, "10", "true"),
        ({"workers.replicas": 3, "workers.gpusPerNode": 0, "workers.accelerator": "none"}, "3", "false"),
    ],
)
def test_num_workers_is_derived(render: Callable[..., Render], sets: dict[str, object], num_workers: str, use_gpu: str) -> None:
    r = render(CI_DEFAULT, sets=sets)
    assert r.returncode == 0, r.stderr
    f = flags(r)
    assert (f["num_workers"], f["use_gpu"]) == (num_workers, use_gpu)


def test_storage_prefix_defaults_to_the_release(renders: dict[str, Render]) -> None:
    assert flags(renders["default-values.yaml"])["storage_path"] == f"gs://gemma3-ray-ci/gemma3-ray/{RELEASE}"
    assert flags(renders["spot-autoscaling-values.yaml"])["storage_path"] == "gs://gemma3-ray-ci/runs/autoscaling"


def sh_words(command: str) -> list[str]:
    """The argv a real /bin/sh makes of `command` (the first word replaced by printf)."""
    out = subprocess.run(["/bin/sh", "-c", f"printf '%s\\0' {command}"], capture_output=True, text=True,
                         check=True, env={"HOME": "/home/ray", "PATH": "/usr/bin:/bin"}, cwd="/").stdout
    return out.split("\0")[:-1]


@pytest.mark.parametrize("name", ["token-extras-values.yaml", "tutorial.yaml", "local.yaml"])
def test_entrypoint_survives_both_shells_of_a_ray_job(renders: dict[str, Render], name: str) -> None:
    """KubeRay's submitter runs `ray job submit -- <entrypoint>` in bash; `ray job submit` re-joins
    the words with subprocess.list2cmdline and the job supervisor runs that with /bin/sh."""
    entrypoint = renders[name].one("RayJob")["spec"]["entrypoint"]
    prefix = " ".join(ENTRY) + " "
    assert entrypoint.startswith(prefix)
    expected = entrypoint_argv(renders[name])[3:]
    first = sh_words(entrypoint[len(prefix):])
    assert first == expected
    second = sh_words(subprocess.list2cmdline(first))
    assert second == expected
