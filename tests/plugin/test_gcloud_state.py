"""The gcloud configuration reader agrees with the real gcloud binary (offline, temporary CLOUDSDK_CONFIG)."""

from __future__ import annotations

import json
import subprocess

import pytest
from gemma3_ray.config.gcloud_state import read_gcloud_state
from gemma3_ray.utils.errors import ConfigError

from tests.plugin.conftest import GcloudHome

PROPS = {"project": ("core", "project"), "account": ("core", "account"), "region": ("compute", "region"),
         "zone": ("compute", "zone"), "cluster": ("container", "cluster")}


def gcloud_list(gcloud_bin: str, home: GcloudHome, *args: str, **env: str) -> dict[str, dict[str, str]]:
    out = subprocess.run([gcloud_bin, "config", "list", "--format=json", *args], env=home.env(**env),
                         capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


def assert_agrees(state, listed: dict[str, dict[str, str]]) -> None:
    for attr, (section, name) in PROPS.items():
        assert getattr(state, attr) == listed.get(section, {}).get(name), attr


def test_named_active_configuration_matches_gcloud(gcloud_home: GcloudHome, gcloud_bin: str) -> None:
    gcloud_home.write("default", {"core": {"project": "other-proj-0"}})
    gcloud_home.write("train", {
        "core": {"project": "train-proj-1", "account": "ml@example.com"},
        "compute": {"region": "europe-west4", "zone": "europe-west4-b"},
        "container": {"cluster": "gpu-pool"},
    }, activate=True)
    state = read_gcloud_state(gcloud_home.env())
    assert state.configuration == "train"
    assert state.project == "train-proj-1" and state.cluster == "gpu-pool"
    assert_agrees(state, gcloud_list(gcloud_bin, gcloud_home))
    # the same with a configuration picked explicitly, as `--configuration` does for gcloud
    other = read_gcloud_state(gcloud_home.env(), configuration="default")
    assert other.project == "other-proj-0" and other.region is None
    assert_agrees(other, gcloud_list(gcloud_bin, gcloud_home, "--configuration=default"))


def test_environment_overrides_like_gcloud(gcloud_home: GcloudHome, gcloud_bin: str) -> None:
    gcloud_home.write("default", {"core": {"project": "file-proj-1"}, "compute": {"region": "us-east1"}})
    gcloud_home.write("second", {"core": {"project": "second-proj"}})
    env = {"CLOUDSDK_ACTIVE_CONFIG_NAME": "second", "CLOUDSDK_COMPUTE_REGION": "asia-east1"}
    state = read_gcloud_state(gcloud_home.env(**env))
    assert (state.configuration, state.project, state.region) == ("second", "second-proj", "asia-east1")
    assert_agrees(state, gcloud_list(gcloud_bin, gcloud_home, **env))


def test_first_run_reads_the_legacy_properties_file_like_gcloud(gcloud_home: GcloudHome, gcloud_bin: str) -> None:
    gcloud_home.write("default", {"core": {"project": "stale-proj-1"}})  # gcloud rewrites it on first run
    (gcloud_home.path / "properties").write_text("[core]\nproject = legacy-proj-2\n")
    state = read_gcloud_state(gcloud_home.env())
    assert state.project == "legacy-proj-2"
    assert_agrees(state, gcloud_list(gcloud_bin, gcloud_home))


def test_single_property_agrees_with_get_value(gcloud_home: GcloudHome, gcloud_bin: str) -> None:
    gcloud_home.write("default", {"core": {"project": "solo-proj-9"}}, activate=True)
    out = subprocess.run([gcloud_bin, "config", "get-value", "project"], env=gcloud_home.env(),
                         capture_output=True, text=True, check=True, timeout=60)
    assert read_gcloud_state(gcloud_home.env()).project == out.stdout.strip() == "solo-proj-9"


def test_no_configuration_at_all_is_empty(gcloud_home: GcloudHome) -> None:
    state = read_gcloud_state(gcloud_home.env())
    assert (state.configuration, state.project, state.account) == ("default", None, None)


def test_active_config_with_newline_is_an_actionable_error(gcloud_home: GcloudHome, gcloud_bin: str) -> None:
    gcloud_home.write("prod", {"core": {"project": "prod-proj-1"}})
    (gcloud_home.path / "active_config").write_text("prod\n")
    # gcloud does not strip the name and silently reads every property as unset ...
    assert gcloud_list(gcloud_bin, gcloud_home).get("core", {}).get("project") is None
    # ... the plugin says so instead
    with pytest.raises(ConfigError, match="gcloud config configurations activate prod"):
        read_gcloud_state(gcloud_home.env())


def test_unknown_named_configuration(gcloud_home: GcloudHome) -> None:
    with pytest.raises(ConfigError, match="no gcloud configuration named 'nope'"):
        read_gcloud_state(gcloud_home.env(), configuration="nope")
