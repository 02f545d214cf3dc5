"""Time Ray's `pip` and `uv` runtime envs installing the trainer's packages (CPU, a private local Ray).

Each case starts its own Ray head (so no runtime env is cached), submits a job that only prints the
time its driver starts, and records: submission -> driver start (the runtime env's set-up), a second
job with the same runtime env on the same head (Ray reuses the env), and the installed size.

  python3 -m bench.cpu.runtime_env_install --installer uv --cache fresh
  python3 -m bench.cpu.runtime_env_install --installer pip --cache warm --cache-dir /tmp/pip-cache

The packages are trainer/requirements.txt without ray (the Ray image has it, as in the chart) and
with torch replaced by the local CPU build (``--torch``): this machine has no GPU and installs only
that torch from local disk; the GPU build is 4.35 GiB and is not what runs here.
``--cache fresh``: Ray's own options (pip --no-cache-dir, uv --no-cache). ``--cache warm``: the
installer's download/wheel cache in ``--cache-dir``, filled by an earlier run with the same flag.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from localkit.local_cluster import remove_temp_dir, start_ray_head  # noqa: E402

TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
DRIVER = "import time; print('DRIVER_START', repr(time.time()))"
SETUP_TIMEOUT_S = 3600
LOCAL_WHEELS = "/opt/wheels"


def packages(torch: str) -> list[str]:
    out = []
    for raw in (ROOT / "trainer" / "requirements.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or re.match(r"^ray(\[|=)", line):
            continue
        out.append(torch if line.startswith("torch==") else line)
    return out


def runtime_env(installer: str, pkgs: list[str], cache: str, cache_dir: str | None) -> dict:
    env: dict = {"config": {"setup_timeout_seconds": SETUP_TIMEOUT_S}}
    if installer == "pip":
        spec: dict = {"packages": pkgs, "pip_check": False}
        if cache == "warm":
            spec["pip_install_options"] = ["--disable-pip-version-check", "--cache-dir", cache_dir]
    else:
        spec = {"packages": pkgs, "uv_check": False}
        if cache == "warm":
            spec["uv_pip_install_options"] = ["--cache-dir", cache_dir]
        # uv reads no pip.conf: give it the same local wheel directory pip's config names (the CPU torch).
        env["env_vars"] = {"UV_FIND_LINKS": LOCAL_WHEELS}
    env[installer] = spec
    return env


def du_bytes(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        if p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def run_once(client, env: dict) -> dict:
    t0 = time.time()
    sid = client.submit_job(entrypoint=f'python -c "{DRIVER}"', runtime_env=env)
    while str(client.get_job_status(sid)) not in TERMINAL:
        time.sleep(0.5)
    info = client.get_job_info(sid)
    logs = client.get_job_logs(sid)
    m = re.search(r"DRIVER_START ([0-9.]+)", logs)
    if str(info.status) != "SUCCEEDED" or not m:
        raise SystemExit(f"job {sid} {info.status}: {info.message}\n{logs[-3000:]}")
    submitted = info.start_time / 1000.0
    return {"submitted_to_driver_s": float(m.group(1)) - submitted, "client_wall_s": time.time() - t0}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--installer", choices=["pip", "uv"], required=True)
    p.add_argument("--cache", choices=["fresh", "warm"], default="fresh")
    p.add_argument("--cache-dir", default=None, help="with --cache warm: the installer's cache directory")
    p.add_argument("--torch", default="torch==2.13.0+cpu", help="torch requirement used instead of the GPU pin")
    p.add_argument("--work", type=Path, default=Path("/tmp/gemma3-runtime-env-bench"))
    p.add_argument("--out", type=Path, default=None, help="append the result as a JSON line here")
    a = p.parse_args(argv)
    if a.cache == "warm" and not a.cache_dir:
        p.error("--cache warm needs --cache-dir")
    a.work.mkdir(parents=True, exist_ok=True)
    pkgs = packages(a.torch)
    env = runtime_env(a.installer, pkgs, a.cache, a.cache_dir)
    head = start_ray_head(1, a.work / f"head-{a.installer}-{a.cache}.log")
    try:
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(head.dashboard_url, headers=head.headers)
        first = run_once(client, env)
        again = run_once(client, env)
        envs = head.temp_dir.glob(f"session_*/runtime_resources/{a.installer}/*/virtualenv")
        size = max((du_bytes(v) for v in envs), default=0)
    finally:
        head.stop()
        remove_temp_dir(head.temp_dir)
    result = {
        "installer": a.installer, "cache": a.cache, "packages": pkgs,
        "setup_s": round(first["submitted_to_driver_s"], 1),
        "reuse_s": round(again["submitted_to_driver_s"], 1),
        "installed_gib": round(size / 1024**3, 2),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(result), flush=True)
    if a.out:
        with open(a.out, "a") as fh:
            fh.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
