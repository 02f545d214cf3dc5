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

import pytest

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


def child_run(tmp_path: Path, text: str, env: dict[str, str], *flags: str, session: bool = False) -> subprocess.Popen:
    """A pytest run of `text` (as test_child.py) in a process of its own, with this plugin."""
    (tmp_path / "test_child.py").write_text(text)
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", *flags, "-p", "tests.sigterm", "-p", "no:cacheprovider",
                             "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_child.py")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=session)


def wait_until(ready, child: subprocess.Popen, timeout_s: float) -> None:
    """Until ready() holds, the child still running."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert child.poll() is None and time.monotonic() < deadline, child.stdout.read() if child.stdout else ""
        time.sleep(0.1)


def test_sigterm_runs_the_fixtures_teardown(tmp_path: Path) -> None:
    env = {**os.environ, "PIDFILE": str(tmp_path / "pid"), "READY": str(tmp_path / "ready")}
    child = child_run(tmp_path, CHILD, env)
    try:
        wait_until((tmp_path / "ready").exists, child, 60)
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


XDIST_CHILD = '''
import os, pathlib, subprocess, time
import pytest

@pytest.fixture(scope="session")
def server(worker_id):
    p = subprocess.Popen(["sleep", "300"])
    out = pathlib.Path(os.environ["OUT"])
    (out / f"pid-{worker_id}").write_text(str(p.pid))
    yield p
    time.sleep(float(os.environ["TEARDOWN_S"]))  # a slow teardown (a Ray cluster's): longer than xdist's 10 s
    p.terminate()
    p.wait()
    (out / f"torn-down-{worker_id}").write_text("1")

@pytest.mark.parametrize("n", range(4))
def test_runs_until_stopped(server, worker_id, n):
    pathlib.Path(os.environ["OUT"], f"ready-{worker_id}").write_text("1")
    time.sleep(120)
'''


@pytest.mark.parametrize("sig,to_group", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM to the controller", "Ctrl-C to the process group"])
def test_a_stop_under_xdist_tears_down_every_workers_fixtures(tmp_path: Path, sig: int, to_group: bool) -> None:
    """`make test` runs on xdist workers: a SIGTERM sent to the controller alone (a CI runner's kill) reaches the
    workers, and a terminal's Ctrl-C (every process of the group) stops them once; their teardowns finish even
    when slower than xdist's 10 s before it kills a worker."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "TEARDOWN_S": "12"}
    child = child_run(tmp_path, XDIST_CHILD, env, "-n", "2", session=True)
    pids: list[int] = []
    try:
        wait_until(lambda: len(list(out.glob("ready-*"))) >= 2, child, 90)
        pids = [int(p.read_text()) for p in out.glob("pid-*")]
        assert len(pids) == 2 and all(map(_alive, pids))
        if to_group:
            os.killpg(child.pid, sig)
        else:
            child.send_signal(sig)
        text, _ = child.communicate(timeout=90)
        assert child.returncode == 2, text  # interrupted, not passed
        assert sorted(p.name for p in out.glob("torn-down-*")) == ["torn-down-gw0", "torn-down-gw1"], text
        assert not [p for p in pids if _alive(p)], text
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


OWNER = """
import os, pathlib, signal, subprocess, sys, time
server = subprocess.Popen(["sleep", "300"])
pathlib.Path(os.environ["OUT"], "server").write_text(str(server.pid))

def stop(signum, frame):
    time.sleep(2)  # a clean-up that takes a while (stopping a Ray head: seconds)
    server.terminate()
    server.wait()
    sys.exit(130)

signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
pathlib.Path(os.environ["OUT"], "ready").write_text("1")
time.sleep(300)
"""
OWNER_CHILD = '''
import os, sys
from e2e.support.proc import run_child as run

def test_runs_a_program_that_owns_a_server():
    run([sys.executable, "-c", os.environ["OWNER"]], timeout=600)
'''


def test_a_stop_reaches_a_program_the_test_runs_and_waits_for_its_clean_up(tmp_path: Path) -> None:
    """A test that runs a program owning processes through e2e.support.proc.run_child (as test_demo and test_elastic run
    the demo and the drill): SIGTERM to the test run reaches the program and its clean-up finishes (through
    subprocess.run: SIGKILL 0.25 s later, its server left)."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "OWNER": OWNER}
    child = child_run(tmp_path, OWNER_CHILD, env)
    pid = None
    try:
        wait_until((out / "ready").exists, child, 60)
        pid = int((out / "server").read_text())
        child.send_signal(signal.SIGTERM)
        text, _ = child.communicate(timeout=60)
        assert child.returncode != 0, text
        assert not _alive(pid), f"the program's server {pid} was left running:\n{text}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)


RAY_CHILD = '''
import os, pathlib, shutil, tempfile, time
import pytest

@pytest.fixture(scope="session")
def cluster():
    import ray  # ray.init puts its own SIGTERM handler in place (sys.exit: a failed test, and the run goes on)
    temp = tempfile.mkdtemp(prefix="g3r-sig-", dir="/tmp")
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", _temp_dir=temp,
             log_to_driver=False)
    yield
    ray.shutdown()
    shutil.rmtree(temp, ignore_errors=True)
    pathlib.Path(os.environ["OUT"], "torn-down").write_text("1")

@pytest.mark.parametrize("n", range(2))
def test_runs_until_stopped(cluster, n):
    pathlib.Path(os.environ["OUT"], f"ran-{n}").write_text("1")
    time.sleep(120)
'''


def test_a_stop_after_ray_init_still_interrupts_the_run(tmp_path: Path) -> None:
    """ray.init replaces the SIGTERM handler with its own (sys.exit): a stop then failed one test and the run went
    on (seen: an interrupted `make test` whose workers ran on, then died unreported, leaving a fake-gcs-server).
    The plugin's handler stays in force: the run is interrupted (exit 2), no further test starts, teardown runs."""
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}
    child = child_run(tmp_path, RAY_CHILD, env, session=True)
    try:
        wait_until((out / "ran-0").exists, child, 120)
        child.send_signal(signal.SIGTERM)
        text, _ = child.communicate(timeout=90)
        assert child.returncode == 2, text  # interrupted (1: a failed test, the run went on)
        assert not (out / "ran-1").exists(), text
        assert (out / "torn-down").exists(), text
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
