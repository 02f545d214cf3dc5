"""A token typed where any flag's value goes is never printed back, by any command (#27 item 7): a value
that would be written into a resource name (the bucket, the prefix, the Secret's key) is refused at its flag
without being shown; everything else the CLI prints goes through the redaction on its way out."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients, Kube

from tests.plugin.conftest import PROJECT, REGION
from tests.plugin.kube_fakes import FakeCore

TOKEN = "hf_QwErTy1234567890AbCdEfGhIjKlMnOpQr"  # noqa: S105 - a made-up Hugging Face token
WORD = "QwErTy1234567890AbCdEfGhIjKl"  # a long mixed-case word: a pasted secret of another kind
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]
COMMON_ON = ("values", "prereqs")  # the flags every command shares are read once, by cli.common.resolve: two commands show it


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
    if not subs:
        return [(path, parser)]
    return [leaf for name, p in subs[0].choices.items() for leaf in _leaves(p, (*path, name))]


def _value_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each flag that takes a value: its longest option string, by dest."""
    return {a.dest: max(a.option_strings, key=len) for a in parser._actions  # noqa: SLF001
            if a.option_strings and a.nargs != 0 and a.dest not in {"help", "version"}}


def _cases() -> list[tuple[tuple[str, ...], str]]:
    leaves = dict(_leaves(cli.build_parser()))
    common = set(_value_flags(leaves[("values",)])) - {"output"}
    cases = []
    for command, parser in sorted(leaves.items()):
        for dest, flag in sorted(_value_flags(parser).items()):
            if dest not in common or command[0] in COMMON_ON:
                cases.append((command, flag))
    return cases


CASES = _cases()


def _base(command: tuple[str, ...]) -> list[str]:
    if command == ("kueue", "setup"):
        return ["-n", "ml", "--kubeconfig", "/nonexistent/kubeconfig"]
    return [*BASE, "--cluster", "c1"] if command == ("up",) else BASE


def test_the_cases_cover_every_command_and_the_shared_flags() -> None:
    commands = {c for c, _ in CASES}
    assert {("values",), ("prereqs",), ("up",), ("doctor",), ("report",), ("cluster", "create"),
            ("image", "build"), ("kueue", "setup")} <= commands
    assert {"--prefix", "--bucket", "--hf-secret-key", "--kube-context", "--configuration"} <= {
        f for c, f in CASES if c == ("values",)}


@pytest.mark.parametrize("value", [TOKEN, WORD])
@pytest.mark.parametrize(("command", "flag"), CASES, ids=[f"{' '.join(c)} {f}" for c, f in CASES])
def test_no_flag_of_any_command_prints_a_token_back(command: tuple[str, ...], flag: str, value: str, gcloud_home,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-credentials.json"))
    argv = [*command, flag, value, *_base(command)]
    with contextlib.suppress(SystemExit):  # argparse's own refusal (an int, a choice): its message is checked too
        cli.main(argv, Clients(project=PROJECT, kube=Kube(core=FakeCore())))
    printed = "".join(capsys.readouterr())
    assert value[3:15] not in printed and value[-12:] not in printed, printed[-2000:]


@pytest.mark.parametrize("flag", ["--prefix", "--bucket", "--hf-secret-key"])
@pytest.mark.parametrize("command", ["values", "prereqs"])
def test_a_token_where_a_resource_name_goes_is_refused_at_its_flag(command: str, flag: str, gcloud_home,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main([command, *BASE, flag, TOKEN.lower() if flag == "--bucket" else TOKEN], Clients(project=PROJECT))
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"gemma3-ray: error: {flag} ") and "looks like a token" in err and err.count("\n") == 1, err
    assert TOKEN[3:15].lower() not in err.lower()


def test_what_the_cli_prints_is_redacted_on_its_way_out(gcloud_home, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A value no check refuses and a message quotes as given (here the kube context `doctor` names) comes
    out redacted: the redaction is where the CLI writes, not at each message."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: {WORD}\nclusters: [{{name: c, cluster: "
                          "{server: 'https://127.0.0.1:1'}}]\nusers: [{name: c, user: {}}]\n"
                          f"contexts: [{{name: {WORD}, context: {{cluster: c, user: c}}}}]\n")
    cli.main(["doctor", "--project", PROJECT, "--region", REGION, "--kubeconfig", str(kubeconfig)],
             Clients(project=PROJECT))
    printed = "".join(capsys.readouterr())
    assert "kube context" in printed and "not shown" in printed
    assert WORD not in printed
