"""Every CLI path ends in one sentence with the fix, never a traceback: an unreachable kube API (a closed
port), helm missing from PATH, a Google call whose retries gave up, and a programming error (a bug:
said so, with the traceback in a log file). Run through the real entry point in a subprocess (#19 item 3)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.utils import errors
from google.api_core import exceptions as gexc

from tests.plugin.conftest import PROJECT, REGION, ROOT

BASE = ["--project", PROJECT, "--region", REGION, "--cluster", "c1", "-n", "ml"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kubeconfig(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "users: [{name: c, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: c}}]\n")
    return path


def _run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"), "NO_GCE_CHECK": "true",
            "GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "no-adc.json"), "XDG_STATE_HOME": str(tmp_path / "state"),
            **env}
    full.pop("HELM_BIN", None)
    return subprocess.run([sys.executable, "-m", "gemma3_ray", *argv], cwd=ROOT / "plugin", env=full,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [["down"], ["down", "--dry-run"], ["logs"], ["doctor"], ["status"]])
def test_an_unreachable_kube_api_is_one_sentence(argv: list[str], tmp_path: Path) -> None:
    port = _closed_port()
    out = _run([*argv, *BASE, "--kubeconfig", str(_kubeconfig(tmp_path, port))], tmp_path)
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "MaxRetryError" not in text, text[-3000:]
    assert f"Cannot reach the Kubernetes API server at 127.0.0.1:{port}" in text, text[-3000:]
    assert "kube context" in text
    if argv[0] != "status":  # status reports each part on its own and exits 0
        assert out.returncode != 0


def test_up_without_helm_says_how_to_get_it_before_any_change(tmp_path: Path) -> None:
    out = _run(["up", *BASE, "--no-kube-context"], tmp_path, PATH=str(tmp_path / "empty"), HELM="")
    assert out.returncode != 0
    assert "Traceback" not in out.stderr and "AssertionError" not in out.stderr, out.stderr[-3000:]
    assert "helm is not on PATH" in out.stderr and "https://helm.sh/docs/intro/install/" in out.stderr
    assert "Applying" not in out.stdout and "Values:" not in out.stdout


def test_a_retried_429_says_what_was_retried() -> None:
    exc = gexc.RetryError("Timeout of 120.0s exceeded", gexc.TooManyRequests("Quota exceeded for reads"))
    text = str(errors.translate(exc, "read", "gs://b"))
    assert "429" in text and "retried" in text and "Quota exceeded for reads" in text
    assert "check your network" not in text
    text = str(errors.translate(gexc.InternalServerError("backend error"), "read", "gs://b"))
    assert "500" in text and "check your network" not in text


def test_a_programming_error_is_called_a_bug_with_its_traceback_in_a_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    clients = Clients(project=PROJECT, storage=object())  # has no list_blobs: an AttributeError inside the plugin
    rc = cli.main(["report", *BASE, "--no-kube-context"], clients)
    err = capsys.readouterr().err
    assert rc == errors.EXIT_BUG
    assert "this is a bug, please report it" in err and "check your network" not in err
    logs = list((tmp_path / "state" / "gemma3-ray").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err
    assert "Traceback" in logs[0].read_text() and "AttributeError" in logs[0].read_text()


def test_a_missing_credential_plugin_is_named(tmp_path: Path) -> None:
    """The kubernetes client only logs a missing exec plugin (gke-gcloud-auth-plugin) and goes on without
    credentials; the plugin names it, with the install command, and prints no log line."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{_closed_port()}'}}}}]\n"
        "users: [{name: c, user: {exec: {apiVersion: client.authentication.k8s.io/v1beta1, "
        "command: gke-gcloud-auth-plugin-not-here}}}]\ncontexts: [{name: c, context: {cluster: c, user: c}}]\n")
    out = _run(["logs", *BASE, "--kubeconfig", str(path)], tmp_path)
    assert out.returncode != 0
    assert "credential plugin gke-gcloud-auth-plugin-not-here is not on PATH" in out.stderr, out.stderr
    assert "gcloud components install gke-gcloud-auth-plugin" in out.stderr
    assert "ERROR:root" not in out.stderr and "Traceback" not in out.stderr
