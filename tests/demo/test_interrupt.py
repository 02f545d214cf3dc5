"""An interrupt while the demo's local Ray head is starting stops the whole local cluster, for real.

``python -m demo`` runs as ``make demo`` does; once its ``ray start --head --block`` has started the GCS
(the dashboard, the raylet and their agents follow; the Jobs API is not up yet), the test sends SIGINT (Ctrl-C) or SIGTERM to the demo alone.
Afterwards no process of that Ray session may be left: not one the test saw under the demo, not one in
the session ``ray start`` leads (the daemons inherit it), not one naming the session's temp dir; the temp
dir is gone, and the demo says only what it did. The test stops (by pid) whatever it finds left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.demo.test_demo import _demo_env

ROOT = Path(__file__).resolve().parents[2]
WAIT_FOR_DAEMONS_S = 300  # the tiny model and data are built first (cached after the first build)
EXIT_WAIT_S = 120


def _cmd(p: psutil.Process) -> list[str]:
    with contextlib.suppress(psutil.Error):
        return p.cmdline()
    return []


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _session_of(ray_start: psutil.Process, temp_dir: str, seen: dict[int, psutil.Process]) -> list[psutil.Process]:
    """Live processes of the demo's Ray: seen under the demo, in ``ray start``'s session, or naming its temp dir."""
    found = {pid: p for pid, p in seen.items() if _alive(p)}
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            ours = os.getsid(p.pid) == ray_start.pid or any(temp_dir in w for w in _cmd(p))
            if ours and p.create_time() >= ray_start.create_time() - 1 and _alive(p):
                found[p.pid] = p
    return list(found.values())


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupt_while_ray_starts_leaves_nothing(tmp_path: Path, sig: signal.Signals) -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "demo", f"--output-dir={tmp_path}", "--rows=8", "--min-free-gib=0"],
        cwd=ROOT, env=_demo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a signal to the test's process group never reaches it: only ours does
    )
    seen: dict[int, psutil.Process] = {}
    ray_start = None
    temp_dir = "\0"
    left: list[psutil.Process] = []
    try:
        parent = psutil.Process(demo.pid)
        deadline = time.monotonic() + WAIT_FOR_DAEMONS_S
        while time.monotonic() < deadline and demo.poll() is None:
            with contextlib.suppress(psutil.Error):
                seen.update({p.pid: p for p in parent.children(recursive=True)})
            names = {p.pid: (p.name() if _alive(p) else "") for p in seen.values()}
            ray_start = next((p for p in seen.values() if "--head" in _cmd(p) and "start" in _cmd(p)), None)
            if ray_start and any(n.startswith("gcs_server") for n in names.values()):
                break
            time.sleep(0.1)
        assert ray_start is not None and demo.poll() is None, f"the demo never started its Ray head: {demo.poll()}"
        temp_dir = next(w.split("=", 1)[1] for w in _cmd(ray_start) if w.startswith("--temp-dir="))
        demo.send_signal(sig)
        out, err = demo.communicate(timeout=EXIT_WAIT_S)
        time.sleep(1)  # a process that outlived its parent by a moment counts as left behind
        left = _session_of(ray_start, temp_dir, seen)

        assert "3/4 local Ray head" not in out, "the signal came after the head had started; this test is about its start"
        assert [f"{p.pid} {p.name()}" for p in left] == [], f"the demo left its local Ray running\n{out}\n{err}"
        assert not Path(temp_dir).exists(), f"the Ray head's temp dir {temp_dir} is left behind"
        assert demo.returncode == 130
        assert "interrupted" in err
        assert "Traceback" not in err
        # What it says it stopped, it stopped; and it names the head it stopped.
        assert f"stopped the local Ray head by process id: pid {ray_start.pid}" in out + err
        assert f"removed {temp_dir}" in out + err
        assert "stopped the local storage server by process id" in out
        print(out[out.index("[demo]     storage"):], err, sep="\n")  # what a user sees (pytest -s)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
        if ray_start is not None:
            left = left or _session_of(ray_start, temp_dir, seen)
        for p in left:  # the test's own processes, by pid
            with contextlib.suppress(psutil.Error):
                p.kill()
        if temp_dir.startswith("/tmp/g3r-local-"):
            shutil.rmtree(temp_dir, ignore_errors=True)
