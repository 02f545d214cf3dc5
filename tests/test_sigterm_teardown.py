"""A test run stopped by SIGTERM (CI's deadline, `timeout`, a killed job) still tears down every fixture: the Ray
clusters, emulators and API servers the suite starts are stopped, never left running (seen: a `timeout`-killed
run left a local Ray head, its raylet and a fake-gcs-server behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = '''
import os, pathlib, subprocess, time
import pytest

@pytest.fixture
def server():
    p = subprocess.Popen(["sleep", "300"])
    pathlib.Path(os.environ["PIDFILE"]).write_text(str(p.pid))
    yield p
    p.terminate()
    p.wait()

def test_runs_until_stopped(server):
    pathlib.Path(os.environ["READY"]).write_text("1")
    time.sleep(120)
'''


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_sigterm_runs_the_fixtures_teardown(tmp_path: Path) -> None:
    (tmp_path / "test_child.py").write_text(CHILD)
    env = {**os.environ, "PIDFILE": str(tmp_path / "pid"), "READY": str(tmp_path / "ready")}
    child = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "tests.sigterm", "-p", "no:cacheprovider",
                              "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_child.py")],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stdout.read() if child.stdout else ""
            time.sleep(0.1)
        pid = int((tmp_path / "pid").read_text())
        assert _alive(pid)
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=30)
        assert child.returncode != 0, out  # stopped, not passed
        assert not _alive(pid), f"SIGTERM left the fixture's process {pid} running:\n{out}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if (tmp_path / "pid").exists() and _alive(int((tmp_path / "pid").read_text())):
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
