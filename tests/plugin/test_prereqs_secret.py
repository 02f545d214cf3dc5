"""`prereqs` with the Hugging Face token plans without a kube context, like every other step without
credentials (#27 item 9): the Secret is in the plan, marked "cluster not read" with the reason; `--apply`
still needs the cluster and stops, in one sentence, before any change."""

from __future__ import annotations

from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients

from tests.plugin.conftest import PROJECT, PROJECT_NUMBER, REGION, storage_client
from tests.plugin.container_fakes import FakeResourceManager
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.test_prereqs import _no_credentials

SECRET = "Secret ml/hf-secret with the Hugging Face token under key hf_api_token (value not shown)"
BASE = ["--project", PROJECT, "--region", REGION, "-n", "ml"]


@pytest.fixture(params=["env", "file"])
def token_flags(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    if request.param == "env":
        monkeypatch.setenv("HF_TOKEN", "hf_made_up_for_the_plan")
        return ["--hf-token-from-env", "HF_TOKEN"]
    path = tmp_path / "hf-token"
    path.write_text("hf_made_up_for_the_plan\n")
    return ["--hf-token-file", str(path)]


@pytest.mark.parametrize("kube", [["--no-kube-context"], []], ids=["no-kube-context", "no-kubeconfig"])
def test_the_secret_is_planned_without_credentials_or_a_kube_context(kube: list[str], token_flags: list[str],
                                                                      gcloud_home, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    _no_credentials(tmp_path, monkeypatch)
    assert cli.main(["prereqs", *BASE, *kube, *token_flags]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    secret = [line for line in out.out.splitlines() if SECRET in line]
    assert len(secret) == 1 and secret[0].startswith("  ? ") and "cluster not read" in secret[0], out.out
    assert "No usable kube context" not in out.err


def test_logged_in_the_plan_reads_google_and_says_the_cluster_was_not_read(
    gcs_iam_emulator: str, token_flags: list[str], gcloud_home, capsys: pytest.CaptureFixture[str],
) -> None:
    iam, usage = FakeIAM(), FakeServiceUsage(project_number=PROJECT_NUMBER)
    clients = Clients(project=PROJECT, storage=storage_client(gcs_iam_emulator), iam=iam, service_usage=usage,
                      resource_manager=FakeResourceManager(PROJECT, number=PROJECT_NUMBER))
    assert cli.main(["prereqs", *BASE, *token_flags], clients) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    (secret,) = [line for line in out.splitlines() if SECRET in line]
    assert secret.startswith("  ? ") and "cluster not read: No usable kube context" in secret, out
    assert any(line.startswith("  + create Google service account") for line in out.splitlines()), out
    assert "Dry run: nothing changed" in out

    assert cli.main(["prereqs", "--apply", *BASE, *token_flags], clients) != 0
    err = capsys.readouterr().err
    assert "No usable kube context" in err and err.count("\n") == 1
    assert iam.mutations() == [] and usage.mutations() == []
