"""Values at the edges: numbers given as strings, nulls on structural keys, the dashboard port, and
runtime-env text that reaches KubeRay's submitter shell (issue #10, failures 5 and 6)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, CI_VALUES_DIR, VALUES_DIR, Render, helm_bin
from submitter_replay import replayed_runtime_env
from worker_env import workers_runtime_env

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())
HELMS = ("HELM", "HELM3")
# Closed objects whose keys may be dropped with null: trainer flags (null drops a default flag) and
# Kubernetes resource requirements (no limits is a valid choice).
NULLABLE_KEYS_IN = {"training", "resources", "submitterResources"}


def entry_flags(render: Render) -> dict[str, str]:
    words = shlex.split(render.one("RayJob")["spec"]["entrypoint"])
    return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)


def helm_sets(*args: str, helm: str = "HELM", files: tuple[Path, ...] = (CI_DEFAULT,)) -> Render:
    """`helm template` with raw --set/--set-string arguments, exactly as a user types them."""
    import subprocess

    from helm_render import NAMESPACE, RELEASE, load_docs

    cmd = [helm_bin(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for f in files:
        cmd += ["-f", str(f)]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, check=False)
    return Render(proc.returncode, proc.stdout, proc.stderr, load_docs(proc.stdout) if proc.returncode == 0 else [])


# ---------------------------------------------------------------- 5: numbers given as strings


@pytest.mark.parametrize("helm", HELMS)
def test_set_passes_float_flags_as_strings_and_they_reach_the_trainer_unchanged(helm: str) -> None:
    """`helm --set` keeps floats as strings (only integers and booleans are typed): the schema
    accepts the text of a number where a flag wants one, and the chart renders it verbatim."""
    r = helm_sets("--set", "training.learning_rate=0.0001", "--set", "training.lora_dropout=1e-2",
                  "--set-string", "training.max_steps=12", helm=helm)
    assert r.returncode == 0, r.stderr
    flags = entry_flags(r)
    assert (flags["learning_rate"], flags["lora_dropout"], flags["max_steps"]) == ("0.0001", "1e-2", "12")


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize(("key", "bad"), [("learning_rate", "fast"), ("max_steps", "1.5"), ("learning_rate", "nan")])
def test_non_numeric_text_for_a_number_flag_is_rejected_naming_it(helm: str, key: str, bad: str) -> None:
    r = helm_sets("--set-string", f"training.{key}={bad}", helm=helm)
    assert r.returncode != 0
    assert f"training.{key}" in r.stderr or f"/training/{key}" in r.stderr, r.stderr


def test_numeric_text_parses_to_the_same_number_in_the_trainer() -> None:
    """What the schema lets through as text is what the trainer's own parser reads as that number."""
    from trainer.job.arguments import parse_args  # the chart's copy: trainer/ links to files/trainer

    args = parse_args(["--storage_path=gs://b/p", "--learning_rate=0.0001", "--max_steps=+12"])
    assert args.learning_rate == 0.0001 and args.max_steps == 12


def test_readme_demo_set_example_renders() -> None:
    """README: `make demo ARGS='--set training.learning_rate=0.01'` renders through the demo's own helm call."""
    from localkit.chart_job import parse_chart_job, render_chart

    rendered = render_chart(helm_bin("HELM"), CHART, VALUES_DIR / "local.yaml",
                            {"training.model_id": "/m", "training.dataset_name": "/d"},
                            {"training.learning_rate": "0.01"})
    assert parse_chart_job(rendered).flags["learning_rate"] == "0.01"


# ---------------------------------------------------------------- 6c: null on a structural key


def _closed_objects(schema: dict[str, Any], defaults: Any, path: str = "") -> Iterator[tuple[str, dict, dict]]:
    if not isinstance(defaults, dict) or schema.get("additionalProperties") is not False:
        return
    name = path.rsplit(".", 1)[-1]
    if name in NULLABLE_KEYS_IN:
        return
    yield path, schema, defaults
    for key, sub in schema.get("properties", {}).items():
        yield from _closed_objects(sub, defaults.get(key), f"{path}.{key}" if path else key)


def structural_keys() -> list[str]:
    """Every key with a non-null default inside an object whose keys the schema closes."""
    return [f"{p}.{k}" if p else k for p, _, d in _closed_objects(SCHEMA, DEFAULTS) for k, v in d.items() if v is not None]


def test_every_structural_key_is_required_by_the_schema() -> None:
    """Helm deletes a key set to null before validating, so only `required` catches it: every key
    the chart declares with a value, in every closed object of the schema, is required there."""
    missing = []
    for path, schema, defaults in _closed_objects(SCHEMA, DEFAULTS):
        want = {k for k, v in defaults.items() if v is not None}
        missing += [f"{path or '(root)'}: {k}" for k in sorted(want - set(schema.get("required", [])))]
    assert not missing, "add to `required` in values.schema.json: " + ", ".join(missing)
    assert len(structural_keys()) > 60


@pytest.mark.parametrize("helm", HELMS)
def test_null_structural_keys_are_rejected_naming_each_key(helm: str, tmp_path: Path) -> None:
    """`--set head.resources=null` (and training, serviceAccount.annotations, extraPip, ...) fail at
    validation with the key named, never as a template crash. One render per nesting depth: every
    key of that depth is null at once, and the error names each."""
    keys = structural_keys()
    assert {"head.resources", "training", "serviceAccount.annotations", "rayJob.runtimeEnv.extraPip"} <= set(keys)
    for depth in sorted({k.count(".") for k in keys}):
        values: dict[str, Any] = {}
        batch = [k for k in keys if k.count(".") == depth]
        for key in batch:
            node = values
            *parents, leaf = key.split(".")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = None
        f = tmp_path / f"nulls-{depth}.yaml"
        f.write_text(yaml.safe_dump(values))
        r = helm_sets(helm=helm, files=(CI_DEFAULT, f))
        assert r.returncode != 0, batch
        assert "template:" not in r.stderr and "nil pointer" not in r.stderr, r.stderr[:2000]
        lines = [ln.strip() for ln in r.stderr.splitlines()]
        for key in batch:
            parent, _, leaf = key.rpartition(".")
            helm4 = f"- at '{'/' + parent.replace('.', '/') if parent else ''}': missing propert"
            helm3 = f"- {parent or '(root)'}: {leaf} is required"
            assert any(ln.startswith(helm4) and f"'{leaf}'" in ln for ln in lines) or helm3 in lines, (key, r.stderr[:3000])


def test_a_training_flag_can_still_be_dropped_with_null(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"training.logging_steps": None})
    assert r.returncode == 0, r.stderr
    assert "logging_steps" not in entry_flags(r)


# ---------------------------------------------------------------- 6a: the dashboard port


def test_dashboard_port_drives_rays_dashboard_port(render: Callable[..., Render]) -> None:
    """KubeRay maps the head container's ports to the head Service as given and leaves `ray start`'s
    ports to rayStartParams ("It's user's responsibility to maintain rayStartParam ports and container
    ports mapping": ray-operator/controllers/ray/common/service.go, getPortsFromCluster); the job
    submitter's address is the Service port named "dashboard" (rayjob_controller.go, Reconcile →
    utils.FetchHeadServiceURL(..., DashboardPortName)) and the head probes read
    rayStartParams["dashboard-port"] (common/pod.go, initLivenessAndReadinessProbe). So one value must
    set all of them."""
    r = render(CI_DEFAULT, sets={"service.dashboardPort": 9000})
    assert r.returncode == 0, r.stderr
    head = r.one("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-port"] == "9000"
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["dashboard"] == 9000
    svc = {p["name"]: p["port"] for p in r.one("Service")["spec"]["ports"]}
    assert svc["dashboard"] == 9000
    default = render(CI_DEFAULT)
    assert default.one("RayJob")["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["dashboard-port"] == "8265"


def test_persistent_cluster_gets_the_same_dashboard_port(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"service.dashboardPort": 9000, "mode": "persistent"})
    assert r.one("RayCluster")["spec"]["headGroupSpec"]["rayStartParams"]["dashboard-port"] == "9000"


@pytest.mark.parametrize("helm", HELMS)
def test_dashboard_port_in_ray_start_params_is_rejected(helm: str) -> None:
    r = helm_sets("--set-string", "head.rayStartParams.dashboard-port=9000", helm=helm)
    assert r.returncode != 0
    assert "head.rayStartParams.dashboard-port" in r.stderr and "service.dashboardPort" in r.stderr, r.stderr


# ---------------------------------------------------------------- 6b: runtime env text in the submitter's bash


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize(("key", "value"), [
    ("rayJob.runtimeEnv.envVars.GREETING", "$(echo pwned)"),
    ("rayJob.runtimeEnv.envVars.GREETING", "`echo pwned`"),
    ("rayJob.runtimeEnv.envVars.GREETING", "${HOME}"),
    ("rayJob.runtimeEnv.extraPip[0]", "wandb==0.19.0$(touch /tmp/x)"),
])
def test_shell_expansions_in_the_runtime_env_are_rejected_naming_the_key(helm: str, key: str, value: str) -> None:
    r = helm_sets("--set-string", f"{key}={value}", helm=helm)
    assert r.returncode != 0, "rendered a runtime env that KubeRay's submitter shell would expand"
    assert key in r.stderr and "$ or `" in r.stderr, r.stderr
    assert "pwned" not in r.stderr and "touch" not in r.stderr, "the value (maybe a secret) was echoed"


def test_runtime_env_text_reaches_ray_job_submit_unchanged(render: Callable[..., Render], tmp_path: Path) -> None:
    """A replay of the submitter command KubeRay builds, in real bash: quotes, spaces, backslashes,
    ; & | < > and non-ASCII in env values arrive byte for byte; pip lines with quotes, ; & | < > and
    spaces reach the workers' runtime env unchanged through the entry point's two shells."""
    tricky = {"A": 'say "hi"; echo a&b | c > d', "B": "back\\slash 'single' tab\tend", "C": "naïve ✓"}
    pip_lines = ["pkg>=1; python_version>'3.8'", 'other[x]<2,>=1; sys_platform == "linux"', "a&b|c"]
    values = tmp_path / "env.yaml"
    values.write_text(yaml.safe_dump({"rayJob": {"runtimeEnv": {"envVars": tricky, "extraPip": pip_lines}}}))
    r = render(CI_DEFAULT, values)
    assert r.returncode == 0, r.stderr
    rendered = yaml.safe_load(r.one("RayJob")["spec"]["runtimeEnvYAML"])
    replayed = replayed_runtime_env(r.one("RayJob"))
    assert replayed == rendered
    for k, v in tricky.items():
        assert replayed["env_vars"][k] == v
    assert workers_runtime_env(r, tmp_path)["uv"]["packages"][-len(pip_lines):] == pip_lines


def test_the_replay_does_expand_what_the_chart_rejects(render: Callable[..., Render]) -> None:
    """The replay is faithful: a runtime env with $(...) injected after rendering is executed by bash."""
    job = render(CI_DEFAULT).one("RayJob")
    env = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    env.setdefault("env_vars", {})["GREETING"] = "$(echo pwned)"
    job = {**job, "spec": {**job["spec"], "runtimeEnvYAML": yaml.safe_dump(env)}}
    assert replayed_runtime_env(job)["env_vars"]["GREETING"] == "pwned"
