"""^C, SIGTERM and SIGHUP sent to a real `make e2e` (python -m e2e --only first on the local cluster) at three
points: during the cluster's start, while the storage emulator starts in the cluster, and while the RayJob
runs. Each run must end 128 + the signal with its clean-up finished: no cluster process, bridge, chain,
mount or lock left. Root, Linux, the parts and images built; opt-in (E2E_SIGNAL_TEST=1: nine cluster
starts, about 20 minutes here), run under `flock /tmp/gemma3-ray-e2e.lock`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POINTS = {"cluster start": 8.0, "storage and inputs": 1.0, "RayJob SUCCEEDED": 10.0}  # seconds after its line

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("E2E_SIGNAL_TEST") or os.geteuid() != 0,
                                 reason="nine real cluster starts: E2E_SIGNAL_TEST=1, as root, parts and images built")]


def _host_left() -> list[str]:
    left = []
    if Path("/run/gemma3-ray-e2e").exists():
        left.append("/run/gemma3-ray-e2e")
    if subprocess.run(["ip", "link", "show", "cni0"], capture_output=True).returncode == 0:
        left.append("bridge cni0")
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "gemma3-ray-e2e-cluster-" in cmd or "/run/gemma3-ray-e2e/containerd" in cmd:
            left.append(f"process {p.name}: {cmd[:80]}")
    mounts = Path("/proc/self/mountinfo").read_text()
    left += [f"mount {line.split()[4]}" for line in mounts.splitlines() if "gemma3-ray-e2e" in line.split()[4]]
    return left


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_during_a_stage_ends_make_e2e_with_nothing_left(tmp_path: Path, sig: int, point: str) -> None:
    assert _host_left() == [], "the host is not clean before the run"
    chains_before = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.count(":KUBE-")
    env = {**os.environ, "E2E_OUTPUT": str(tmp_path)}
    env.pop("KUBECONFIG", None)
    run = subprocess.Popen([sys.executable, "-m", "e2e", "--only", "first"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = ""
    deadline = time.monotonic() + 900
    while f"[e2e] {point} …" not in seen:
        line = run.stdout.readline()
        assert line or run.poll() is None, f"make e2e ended before {point}:\n{seen[-2000:]}"
        assert time.monotonic() < deadline, f"{point} not reached:\n{seen[-2000:]}"
        seen += line
    time.sleep(POINTS[point])
    run.send_signal(sig)
    out, _ = run.communicate(timeout=900)
    seen += out
    assert run.returncode == 128 + sig, seen[-3000:]
    assert _host_left() == [], seen[-3000:]
    assert subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.count(":KUBE-") <= chains_before
    summary = json.loads((tmp_path / "summary.json").read_text())
    row = next(s for s in summary["stages"] if s["name"] == point)
    assert row["result"] in {"fail", "not run", "pass"}, row
    from e2e.support.session import take_lock

    take_lock().close()  # the machine's lock is free again
