"""Token-shaped values are refused and never printed; variable names are never refused (#19 items 1, 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients, Kube
from gemma3_ray.utils import tokens

from tests.plugin.conftest import PROJECT, REGION
from tests.plugin.kube_fakes import FakeCore

TOKEN = "hf_QwErTy1234567890AbCdEfGhIjKlMnOpQr"  # noqa: S105 - a made-up token
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]


@pytest.mark.parametrize("var", ["HF_TOKEN", "HF_API_TOKEN", "hf_token", "HUGGING_FACE_HUB_TOKEN_2024"])
def test_a_variable_name_is_never_refused(var: str, gcloud_home, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(var, "x")
    clients = Clients(project=PROJECT, kube=Kube(core=FakeCore()))
    assert cli.main(["prereqs", "--dry-run", *BASE, "--hf-token-from-env", var], clients) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "Secret ml/hf-secret with the Hugging Face token" in out


def test_the_refusal_never_suggests_the_flag_just_used(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["prereqs", *BASE, "--hf-token-from-env", TOKEN], Clients(project=PROJECT)) == 2
    err = capsys.readouterr().err
    assert TOKEN not in err
    fix = err.split(":", 2)[-1]
    assert "--hf-token-from-env HF_TOKEN" not in fix and "pass --hf-token-from-env" not in fix
    assert "--hf-token-file -" in fix


@pytest.mark.parametrize("value", ["HF_TOKEN", "HF_API_TOKEN", "MY_HF_TOKEN", "hf_home", "A" * 40])
def test_names_do_not_look_like_tokens(value: str) -> None:
    assert not tokens.looks_like_token(value)


@pytest.mark.parametrize("value", [TOKEN, "QwErTy1234567890AbCdEfGhIjKl", f"/tmp/{TOKEN}", f"./x/{TOKEN}.txt"])
def test_tokens_look_like_tokens_anywhere_in_a_value(value: str) -> None:
    assert tokens.looks_like_token(value)
    assert TOKEN not in tokens.scrub(f"cannot read {value}: no such file")


@pytest.mark.parametrize("argv", [
    ["prereqs", "--hf-token-file", TOKEN],
    ["prereqs", "--hf-token-file", f"/tmp/{TOKEN}"],
    ["doctor", "--values", TOKEN],
    ["up", "--cluster", "c", "--chart", TOKEN],
    ["up", "--cluster", "c", "-f", TOKEN],
    ["image", "build", "--context", TOKEN],
    ["image", "build", "--dockerfile", TOKEN],
])
def test_no_message_quotes_a_token_typed_as_a_value(argv: list[str], gcloud_home, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    rc = cli.main([*argv, *BASE], Clients(project=PROJECT, kube=Kube(core=FakeCore())))
    captured = capsys.readouterr()
    assert rc != 0
    assert TOKEN not in captured.out + captured.err and TOKEN[3:15] not in captured.out + captured.err
    assert "not shown" in captured.err
