"""The first release on the real cluster: install, SUCCEEDED through the real operator, helm test, NOTES, outputs, plugin."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
import urllib.request
from typing import Any

from e2e.harness import Harness, Run
from e2e.kube import StageError
from e2e.session import run_name

NAMESPACE = run_name("g3r-e2e")  # unique per run (e2e/session.py)
RELEASE = "e2e"


def notes_commands(notes: str) -> list[str]:
    """The commands NOTES prints for the user to copy (indented lines that start with a tool's name)."""
    return [m.group(1).strip() for m in re.finditer(r"^\s{3,}((?:kubectl|helm|gemma3-ray|gcloud) .+)$", notes, re.M)]


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def _stream_until(h: Harness, argv: list[str], want: str, seconds: float) -> str:
    """Run a command that does not end by itself (-w, -f); pass when `want` shows up in its output."""
    proc = subprocess.Popen(argv, env=h.kube.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    got = ""
    try:
        deadline = time.monotonic() + seconds
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and not (got and want in got):
            if sel.select(timeout=1):
                chunk = os.read(proc.stdout.fileno(), 65536)  # unbuffered: a row after the header is seen
                if not chunk:
                    break
                got += chunk.decode(errors="replace")
    finally:
        _stop(proc)
    if want not in got:
        raise StageError(f"NOTES command `{shlex.join(argv)}` did not show {want!r} in {seconds:.0f} s: {got[-300:]!r}")
    return got


def _port_forward(h: Harness, argv: list[str]) -> str:
    """`kubectl port-forward …` as printed, then the dashboard it promises answers on localhost."""
    port = argv[-1].split(":")[0]
    proc = subprocess.Popen(argv, env=h.kube.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/api/version", timeout=3) as r:
                    return r.read().decode()[:120]
            except OSError:
                time.sleep(1)
                if proc.poll() is not None:
                    break
        raise StageError(f"NOTES command `{shlex.join(argv)}`: http://localhost:{port} did not answer "
                         f"({(proc.stdout.read() if proc.poll() is not None else '')[-300:]!r})")
    finally:
        _stop(proc)


def check_notes(h: Harness, run: Run) -> str:
    """Run every kubectl command NOTES prints, as printed; the others are named and said where they are proved."""
    notes = h.kube.h("get", "notes", run.release, "-n", run.namespace).stdout
    ran, elsewhere = [], []
    for cmd in notes_commands(notes):
        argv = shlex.split(cmd)
        if argv[0] != "kubectl" or "<" in cmd:
            elsewhere.append(argv[0] + " " + argv[1])
            continue
        if "port-forward" in argv:
            _port_forward(h, argv)
        elif "-w" in argv:
            _stream_until(h, argv, run.rayjob, 20)
        elif "logs" in argv and "-f" in argv:
            _stream_until(h, argv, "", 5)
        else:
            h.kube.run(argv, what="NOTES command", timeout=60)
        ran.append(" ".join(argv[:4]))
    if not ran:
        raise StageError(f"NOTES of {run.release} printed no kubectl command to check:\n{notes[:500]}")
    return f"{len(ran)} kubectl commands as printed; {', '.join(sorted(set(elsewhere)))} proved by other stages"


def check_outputs(h: Harness, run: Run, summary: dict[str, Any]) -> str:
    """The run's results in the bucket: final adapter, metrics.jsonl, summary.json, report.html."""
    need = ["final/adapter_config.json", "final/adapter_model.safetensors", "metrics.jsonl", "summary.json", "report.html"]
    missing = [n for n in need if not h.storage.path(f"{run.run_uri}/{n}").is_file()]
    if missing:
        raise StageError(f"{run.run_uri}: missing {missing} (have: {h.listing(run)})")
    want_steps = int(run.flags["max_steps"])
    if not summary.get("completed") or summary.get("global_step") != want_steps:
        raise StageError(f"{run.run_uri}/summary.json: completed={summary.get('completed')}, "
                         f"global_step={summary.get('global_step')} (want {want_steps})")
    return f"{run.run_uri}: {len(h.listing(run))} objects, {want_steps} steps, final loss {summary.get('final_train_loss')}"


def plugin_shows(h: Harness, run: Run) -> str:
    """`gemma3-ray status` and `gemma3-ray logs` against the cluster name the run."""
    base = ["gemma3-ray"]
    common = ["-n", run.namespace, "--release", run.release, "--project", "gemma3-ray-e2e", "--region", "us-central1"]
    status = h.kube.run([*base, "status", *common], what="gemma3-ray status", timeout=120).stdout
    if run.rayjob not in status or "SUCCEEDED" not in status:
        raise StageError(f"gemma3-ray status does not show {run.rayjob} SUCCEEDED:\n{status[-600:]}")
    logs = h.kube.run([*base, "logs", *common], what="gemma3-ray logs", timeout=120).stdout
    if run.run_name not in logs:
        raise StageError(f"gemma3-ray logs does not show the run {run.run_name}:\n{logs[-600:]}")
    return f"status: {len(status.splitlines())} lines, logs: {len(logs.splitlines())} lines"


def first_release(h: Harness) -> Run:
    rec = h.record
    with rec.stage("install", "helm install with values/e2e.yaml"):
        h.namespace(NAMESPACE)
        run = h.helm_install(RELEASE, NAMESPACE)
        rec.facts["first_run"] = {"rayjob": run.rayjob, "run": run.run_name}

    def while_running(job: dict[str, Any]) -> None:
        with rec.stage("helm test", "the chart's test pod reaches the live head"):
            h.kube.h("test", RELEASE, "-n", NAMESPACE, "--timeout", "300s", timeout=330, what="helm test")
        with rec.stage("NOTES commands") as st:
            st.detail = check_notes(h, run)

    with rec.stage("RayJob SUCCEEDED", f"RayJob {run.rayjob} through the real KubeRay operator") as st:
        t0 = time.monotonic()
        h.wait_run(run, on_running=while_running)
        st.detail = f"RayJob {run.rayjob} SUCCEEDED in {time.monotonic() - t0:.0f} s"
    with rec.stage("outputs in the bucket") as st:
        st.detail = check_outputs(h, run, h.summary(run))
    with rec.stage("gemma3-ray status/logs") as st:
        st.detail = plugin_shows(h, run)
    return run
