"""A Hugging Face token never comes back out: not from argparse errors, not from the flags that take a
variable name, not from a hint (every hint keeps the token out of argv and shell history)."""

from __future__ import annotations

import argparse
import base64
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients, Kube

from tests.plugin.conftest import PROJECT, REGION, ROOT, storage_client
from tests.plugin.container_fakes import FakeResourceManager
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.kube_fakes import FakeCore

TOKEN = "hf_QwErTy1234567890AbCdEfGhIjKlMnOpQr"  # noqa: S105 - a made-up token
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]


def _parsers() -> list[argparse.ArgumentParser]:
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return [parser, *subs.choices.values()]


def test_every_parser_refuses_abbreviations() -> None:
    parsers = _parsers()
    assert len(parsers) > 5
    assert all(p.allow_abbrev is False for p in parsers), [p.prog for p in parsers if p.allow_abbrev]


@pytest.mark.parametrize("argv", [
    ["prereqs", "--hf-token", TOKEN],                 # abbreviation of --hf-token-from-env (was accepted)
    ["prereqs", "--hf-token-from", TOKEN],
    ["prereqs", f"--hf-token={TOKEN}"],
    ["up", "--replicas", TOKEN],                      # invalid int value
    [TOKEN],                                          # invalid command
    ["values", TOKEN],                                # stray positional
])
def test_argparse_errors_never_echo_a_value(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert TOKEN not in captured.err + captured.out
    assert TOKEN[3:12] not in captured.err + captured.out


def test_the_real_command_line_never_echoes_a_token(tmp_path: Path) -> None:
    """Through the console entry point in a subprocess: stderr and stdout hold no part of the token."""
    env = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    out = subprocess.run([sys.executable, "-m", "gemma3_ray", "prereqs", "--dry-run", "--hf-token", TOKEN],
                         cwd=ROOT / "plugin", env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert TOKEN not in out.stdout + out.stderr
    assert "--hf-token-file -" in out.stderr  # says how to pass it instead


@pytest.mark.parametrize("value", [TOKEN, "QwErTy1234567890AbCdEfGhIjKl", "not a name"])
def test_a_token_where_a_variable_name_is_expected_is_refused_unprinted(
    value: str, capsys: pytest.CaptureFixture[str],
) -> None:
    rc = cli.main(["prereqs", "--dry-run", *BASE, "--hf-token-from-env", value],
                  Clients(project=PROJECT))
    assert rc == 2
    err = capsys.readouterr().err
    assert value not in err and "NAME of an environment variable" in err
    assert "read -rs HF_TOKEN && export HF_TOKEN" in err
    assert "HF_TOKEN=" not in err  # no hint puts the token on a command line


def _clients(url: str, core: FakeCore) -> Clients:
    return Clients(project=PROJECT, storage=storage_client(url), iam=FakeIAM(), resource_manager=FakeResourceManager(PROJECT),
                   service_usage=FakeServiceUsage(project_number="123456789012"), kube=Kube(core=core))


def test_token_from_a_file_and_from_stdin(gcs_iam_emulator: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    core = FakeCore()
    path = tmp_path / "hf-token"
    path.write_text(TOKEN + "\n")
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-file", str(path)], _clients(gcs_iam_emulator, core)) == 0
    secret = core.secrets[("ml", "hf-secret")]
    assert base64.b64decode(secret.data["hf_api_token"]).decode() == TOKEN
    out = capsys.readouterr()
    assert TOKEN not in out.out + out.err

    monkeypatch.setattr(sys, "stdin", io.StringIO(TOKEN + "-2\n"))
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-file", "-"], _clients(gcs_iam_emulator, core)) == 0
    assert base64.b64decode(core.secrets[("ml", "hf-secret")].data["hf_api_token"]).decode() == TOKEN + "-2"
    out = capsys.readouterr()
    assert "update Secret ml/hf-secret" in out.out and TOKEN not in out.out + out.err

    path.write_text("\n")
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-file", str(path)], _clients(gcs_iam_emulator, core)) == 2
    assert "holds no token" in capsys.readouterr().err
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-file", str(tmp_path / "missing")],
                    _clients(gcs_iam_emulator, core)) == 2
    assert "cannot read" in capsys.readouterr().err


def test_hints_keep_the_token_out_of_argv_and_history() -> None:
    """No message the plugin can print suggests `HF_TOKEN=... cmd` or a token as a flag value."""
    sources = "".join(p.read_text() for p in (ROOT / "plugin" / "gemma3_ray").rglob("*.py"))
    sources += (ROOT / "plugin" / "README.md").read_text() + (ROOT / "README.md").read_text()
    assert "HF_TOKEN=..." not in sources and "HF_TOKEN=hf_" not in sources
    assert "read -s hf_" not in sources


@pytest.mark.parametrize("argv", [
    ["values", "--kube-context", TOKEN],
    ["values", "--configuration", TOKEN],
    ["values", "--bucket", TOKEN],
    ["values", "--accelerator", TOKEN, "--gpus-per-node", "1"],
])
def test_errors_about_a_flag_value_never_print_a_token(argv: list[str], gcloud_home, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    gcloud_home.write("default", {"core": {"project": "acme-ml-1"}, "compute": {"region": "us-central1"}},
                      activate=True)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: "
                          "{server: 'https://127.0.0.1:1'}}]\nusers: [{name: c, user: {}}]\n"
                          "contexts: [{name: c, context: {cluster: c, user: c}}]\n")
    assert cli.main([*argv, "--project", "acme-ml-1", "--kubeconfig", str(kubeconfig)]) != 0
    captured = capsys.readouterr()
    assert TOKEN not in captured.out + captured.err and "not shown" in captured.err
