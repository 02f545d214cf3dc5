"""The demo's job submission outlasts a Jobs API that is not ready yet (Ray's job agent starts after the
dashboard: "No available agent to submit job", 5xx, refused connections), against a real HTTP server
speaking the Jobs API to Ray's own JobSubmissionClient; past its deadline it ends in one sentence."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from demo import job_runner
from demo.errors import DemoError

NO_AGENT = "No available agent to submit job, please try again later."


class JobsApi(ThreadingHTTPServer):
    failures: list[tuple[int, str]]
    posts: int = 0


class _Handler(BaseHTTPRequestHandler):
    server: JobsApi

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: str, kind: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path == "/api/version":
            self._send(200, json.dumps({"version": "4", "ray_version": "2.49.0", "ray_commit": "x"}))
        else:
            self._send(404, "not found", "text/plain")

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.posts += 1
        if self.server.failures:
            code, text = self.server.failures.pop(0)
            self._send(code, text, "text/plain")
        else:
            self._send(200, json.dumps({"submission_id": "raysubmit_ok", "job_id": "raysubmit_ok"}))


@pytest.fixture
def api() -> Iterator[JobsApi]:
    server = JobsApi(("127.0.0.1", 0), _Handler)
    server.failures = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(server: JobsApi):  # noqa: ANN202 - Ray's client
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(f"http://127.0.0.1:{server.server_address[1]}")


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_runner, "SUBMIT_BACKOFF_S", (0.01, 0.02))


def test_no_agent_and_5xx_are_retried_until_accepted(api: JobsApi) -> None:
    api.failures = [(500, NO_AGENT), (503, "Service Unavailable"), (500, NO_AGENT)]
    said: list[str] = []
    got = job_runner.submit(_client(api), say=said.append, entrypoint="echo hi", runtime_env={})
    assert got == "raysubmit_ok"
    assert api.posts == 4
    assert len(said) == 3 and all("retry" in s for s in said)


def test_a_deadline_ends_in_one_sentence(api: JobsApi) -> None:
    api.failures = [(500, NO_AGENT)] * 1000
    with pytest.raises(DemoError) as raised:
        job_runner.submit(_client(api), deadline_s=0.3, say=lambda _: None, head_logs="/run/ray-head-logs/job",
                          entrypoint="echo hi", runtime_env={})
    text = str(raised.value)
    assert text.startswith("the Ray Jobs API did not accept the job within")
    assert "No available agent" in text and "\n" not in text
    # It names where the head's logs are (the demo keeps them there), never Ray's default /tmp/ray.
    assert "is in /run/ray-head-logs/job;" in text and "/tmp/ray" not in text
    assert api.posts > 1


def test_a_refused_connection_is_retried_then_explained() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused

    class Flaky:
        def submit_job(self, **_: object) -> str:
            import requests

            return requests.post(f"http://127.0.0.1:{port}/api/jobs/", timeout=1).text

    with pytest.raises(DemoError, match="did not accept the job"):
        job_runner.submit(Flaky(), deadline_s=0.2, say=lambda _: None, entrypoint="x")


def test_a_permanent_error_is_not_retried(api: JobsApi) -> None:
    api.failures = [(400, "bad runtime env")]
    with pytest.raises(DemoError, match="refused the job: Request failed with status code 400"):
        job_runner.submit(_client(api), say=lambda _: None, entrypoint="echo hi", runtime_env={})
    assert api.posts == 1
