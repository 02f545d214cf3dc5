"""One convention (#19 item 7): every command that changes something plans by default and acts with
--apply; --dry-run, where it existed, is an accepted no-op; --delete-bucket is not a misleading alias;
`make prereqs` needs only the venv; `values` without --image drops the image keys an earlier run wrote."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config import render
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.gcp import image_build

from tests.plugin.conftest import PROJECT, REGION, ROOT, Recorder
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.test_prereqs import BASE, _clients

CHANGING = [["prereqs"], ["down"], ["up"], ["cluster", "create"], ["cluster", "delete"], ["image", "build"], ["kueue", "setup"]]
HAD_DRY_RUN = [["prereqs"], ["down"], ["cluster", "delete"]]


def _parser_of(words: list[str]) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = cli.build_parser()
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
        parser = sub.choices[word]
    return parser


@pytest.mark.parametrize("words", CHANGING, ids=" ".join)
def test_every_changing_command_plans_unless_apply(words: list[str]) -> None:
    parser = _parser_of(words)
    assert parser.parse_args([]).apply is False
    assert parser.parse_args(["--apply"]).apply is True
    assert "default: print the plan only" in " ".join(parser.format_help().split())


@pytest.mark.parametrize("words", HAD_DRY_RUN, ids=" ".join)
def test_dry_run_stays_an_accepted_no_op(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser_of(words)
    args = parser.parse_args(["--dry-run"])
    assert args.dry_run is True and args.apply is False
    assert "planning is the default" in " ".join(parser.format_help().split())
    assert cli.main([*words, "--apply", "--dry-run", *BASE]) == 2
    assert "both --apply and --dry-run" in capsys.readouterr().err


def test_prereqs_plans_by_default_and_applies_with_apply(
        gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
        capsys: pytest.CaptureFixture[str]) -> None:
    rec = Recorder()
    assert cli.main(["prereqs", *BASE], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)) == 0
    out = capsys.readouterr().out
    assert "Dry run: nothing changed" in out and "`gemma3-ray prereqs --apply` (same flags)" in out
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert cli.main(["prereqs", "--apply", *BASE], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)) == 0
    assert "Done:" in capsys.readouterr().out and fake_iam.accounts


def test_delete_bucket_is_refused_with_the_right_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["down", "--prereqs", "--delete-bucket", *BASE])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "--delete-bucket is not an option" in err and "--delete-data" in err and "never deletes the bucket" in err


def test_make_prereqs_needs_only_the_venv_and_applies_with_apply() -> None:
    rules = (ROOT / "Makefile").read_text()
    (line,) = [ln for ln in rules.splitlines() if ln.startswith("prereqs:")]
    assert line.split("##")[0].split(":", 1)[1].split() == ["venv"]
    for apply, flag in (("APPLY=1", "--apply"), ("APPLY=", "")):
        out = subprocess.run(["make", "-n", "prereqs", apply], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"gemma3-ray prereqs {flag}".rstrip() in out.stdout
        assert "--dry-run" not in out.stdout
        assert not any(tool in out.stdout for tool in ("checkov", "chromium", "etcd", "apt-get"))


def test_values_without_image_drops_the_image_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    dep = resolve(Overrides(project=PROJECT, region=REGION), None, None)
    built = f"{REGION}-docker.pkg.dev/{PROJECT}/gemma3-ray/trainer:src-0123456789ab"
    monkeypatch.setattr(image_build, "existing_image", lambda *_a, **_k: built)  # the tag lookup (tested elsewhere)
    path = tmp_path / "v.yaml"
    path.write_text("workers:\n  image:\n    pullPolicy: Always  # mine\n")
    path.write_text(render.render(dep, render.load(path), image_build.values(dep, None)))  # type: ignore[arg-type]
    with_image = render.load_plain(path)
    assert with_image["dependencies"] == "image"
    assert with_image["workers"]["image"] == {"pullPolicy": "Always", "repository": built.rsplit(":", 1)[0],
                                              "tag": "src-0123456789ab"}
    path.write_text(render.render(dep, render.load(path)))
    without = render.load_plain(path)
    assert "dependencies" not in without
    assert without["workers"]["image"] == {"pullPolicy": "Always"}  # the user's key stays
    assert "# mine" in path.read_text()


def test_prereqs_lists_missing_permissions_and_refuses_before_any_change(
        gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
        capsys: pytest.CaptureFixture[str]) -> None:
    from gemma3_ray.release import prereqs

    from tests.plugin.container_fakes import FakeResourceManager

    rec = Recorder()
    clients = _clients(gcs_iam_emulator, fake_iam, fake_usage, rec)
    clients.resource_manager = FakeResourceManager(PROJECT, granted=set(prereqs.PERMISSIONS) - {
        "iam.serviceAccounts.create", "storage.buckets.setIamPolicy"})
    assert cli.main(["prereqs", *BASE], clients) == 0
    out = capsys.readouterr().out
    assert "! permissions MISSING on the project: storage.buckets.setIamPolicy (in roles/storage.admin); " \
           "iam.serviceAccounts.create (in roles/iam.serviceAccountAdmin)" in out
    assert cli.main(["prereqs", "--apply", *BASE], clients) == 1
    err = capsys.readouterr().err
    assert "Permission denied before any change: you lack iam.serviceAccounts.create" in err
    assert "storage.buckets.setIamPolicy" not in err  # may be granted on the bucket itself: listed, not refused
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert clients.resource_manager.calls[0][1] == f"projects/{PROJECT}"


def test_doctor_runs_the_permission_preflight(fake_iam: FakeIAM, fake_usage: FakeServiceUsage) -> None:
    from gemma3_ray.config.clients import Clients
    from gemma3_ray.release import doctor, prereqs

    from tests.plugin.container_fakes import FakeResourceManager

    dep = resolve(Overrides(project=PROJECT, region=REGION), None, None)
    clients = Clients(project=PROJECT, resource_manager=FakeResourceManager(
        PROJECT, granted=set(prereqs.PERMISSIONS) - {"serviceusage.services.enable"}))
    check = doctor.check_permissions(dep, clients)
    assert not check.ok and "serviceusage.services.enable" in check.detail and "serviceUsageAdmin" in check.detail
    clients.resource_manager = FakeResourceManager(PROJECT)
    assert doctor.check_permissions(dep, clients).ok


def _kubeconfig(tmp_path: Path, context: str, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        f"apiVersion: v1\nkind: Config\ncurrent-context: {context}\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        f"users: [{{name: c, user: {{token: t}}}}]\ncontexts: [{{name: {context}, context: {{cluster: c, user: c}}}}]\n")
    return path


@pytest.mark.parametrize("context", ["c", f"gke_other-proj-1_{REGION}_trainers"])
def test_up_checks_the_cluster_before_any_google_cloud_change(
        context: str, gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An unreachable API server (a closed port), or a kube context naming another cluster: `up --apply`
    stops with one sentence before it writes the values file or changes anything in Google Cloud."""
    import socket

    helm = ROOT / ".tools" / "bin" / "helm"
    if helm.exists():
        monkeypatch.setenv("HELM", str(helm))
    monkeypatch.delenv("HELM_BIN", raising=False)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    values_file = tmp_path / "v.yaml"
    rec = Recorder()
    rc = cli.main(["up", "--apply", "--project", PROJECT, "--region", REGION, "--cluster", "trainers",
                   "--kubeconfig", str(_kubeconfig(tmp_path, context, port)), "--values-file", str(values_file)],
                  _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err, err
    if context == "c":
        assert f"Cannot reach the Kubernetes API server at 127.0.0.1:{port}" in err, err
    else:
        assert f"is cluster trainers of project other-proj-1, not trainers of {PROJECT}" in err, err
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert not values_file.exists()
