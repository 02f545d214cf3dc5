"""The first release on the real cluster: install, SUCCEEDED through the real operator, helm test, NOTES, outputs, plugin.

The first release keeps its cluster alive after the job ends (rayJob.ttlSecondsAfterFinished=KEEP_ALIVE_S),
so `helm test` and the NOTES commands that need a live head run on every first run, after SUCCEEDED,
whatever state a poll happened to see while the job ran.
"""

from __future__ import annotations

import os
import re
import selectors
import shlex
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

from e2e.support import notes_check as nc
from e2e.support.deadline import DEADLINE
from e2e.support.errors import StageError
from e2e.support.harness import CHART, Harness, Run
from e2e.support.kube import stop_command
from e2e.support.session import run_name

NAMESPACE = run_name("g3r-e2e")  # unique per run (e2e/support/session.py)
RELEASE = "e2e"
FINALIZER_RELEASE = "e2e-fin"
KEEP_ALIVE_S = 1800  # the first release's cluster outlives its job by this much (uninstall ends it sooner)
# Stands in for KubeRay's own finalizer when no operator runs: it holds the RayJob terminating, as the
# NOTES line's case says, without stopping the real operator (it is shared with every other stage).
STAND_IN_FINALIZER = "e2e.gemma3-ray/stands-in-for-a-stopped-operator"
NO_SUCH_QUEUE = "e2e-no-such-queue"  # a queue label nobody admits: the RayJob stays suspended, no pod runs


def _stream(h: Harness, argv: list[str], done, seconds: float) -> tuple[str, int | None]:
    """Run a command that may not end by itself (-w, -f) until done(output) or `seconds`; output and exit code
    (None: still running when stopped)."""
    limit = DEADLINE.cap(seconds, shlex.join(argv[:4]))
    proc = subprocess.Popen(argv, env=h.kube.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    got = ""
    rc: int | None = None
    try:
        deadline = time.monotonic() + limit
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and not done(got):
            if sel.select(timeout=1):
                chunk = os.read(proc.stdout.fileno(), 65536)  # unbuffered: a row after the header is seen
                if not chunk:
                    proc.wait(timeout=10)
                    break
                got += chunk.decode(errors="replace")
    finally:
        rc = stop_command(proc)
    h.kube._log(f"$ {shlex.join(argv)}\n{got[-2000:]}\n# exit {rc if rc is not None else '(stopped)'}")
    cut = DEADLINE.expired(shlex.join(argv[:4]), limit, seconds)
    if rc is None and cut and not done(got):  # E2E_DEADLINE stopped it, not its own limit
        raise cut
    return got, rc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_forward(h: Harness, argv: list[str], want_ray: str) -> str:
    """`kubectl port-forward …` as printed but on a free local port; the dashboard answering is that cluster's."""
    port = free_port()
    argv = nc.with_local_port(argv, port)
    proc = subprocess.Popen(argv, env=h.kube.environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=3) as r:
                    body = r.read().decode(errors="replace")
                problem = nc.dashboard_problem(body, want_ray)
                if problem:
                    raise StageError(f"NOTES command `{shlex.join(argv)}`: {problem}")
                return f"port {port}: Ray {want_ray}"
            except OSError:
                time.sleep(1)
                if proc.poll() is not None:
                    break
        raise StageError(f"NOTES command `{shlex.join(argv)}`: http://127.0.0.1:{port} did not answer "
                         f"({(proc.stdout.read() if proc.poll() is not None else '')[-300:]!r})")
    finally:
        stop_command(proc)


def _gcloud(h: Harness, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """gcloud as printed, against the run's storage: the emulator (its endpoint, no credentials, a config of its
    own), or E2E_BUCKET's bucket with this machine's own gcloud configuration and login."""
    with tempfile.TemporaryDirectory(prefix="gemma3-ray-e2e-gcloud-") as cfg:
        env = h.storage.gcloud_env(cfg)
        old = dict(h.kube.env)
        h.kube.env.update(env)
        try:
            return h.kube.run(argv, what=f"NOTES command (gcloud against {h.storage.describe()})", timeout=180)
        finally:
            h.kube.env.clear()
            h.kube.env.update(old)


def run_notes_line(h: Harness, line: nc.NotesLine, run: Run, want_ray: str) -> str:
    """Run one NOTES line of kind watch, follow, port-forward or run; what it showed (StageError when wrong)."""
    argv = line.argv
    if line.kind == nc.PORT_FORWARD:
        return _port_forward(h, argv, want_ray)
    if line.kind == nc.WATCH:
        out, rc = _stream(h, argv, lambda got: not nc.watch_problem(got, None, run.rayjob), 30)
        problem = nc.watch_problem(out, rc, run.rayjob)
    elif line.kind == nc.FOLLOW:
        out, rc = _stream(h, argv, lambda got: nc.trainer_said(got, run.run_name), 120)
        problem = nc.follow_problem(out, rc, run.run_name)
    elif argv[0] == "gcloud":
        if not _which("gcloud"):
            raise _NotRun("gcloud is not installed on this machine")
        out = _gcloud(h, argv).stdout
        problem = "" if f"{run.run_uri}/summary.json" in out else f"did not list {run.run_uri}/summary.json: {out[-300:]!r}"
    else:
        out = h.kube.run(argv, what="NOTES command", timeout=120).stdout
        problem = ""
    if problem:
        raise StageError(f"NOTES command `{line.command}` {problem}")
    return line.kind


class _NotRun(Exception):
    """This machine cannot run a NOTES line; the message says why."""


def _which(tool: str) -> bool:
    from shutil import which

    return which(tool) is not None


def notes_commands(h: Harness) -> str:
    """Every NOTES command of the first release: run here, run as printed by the stage named, or not run with why."""
    run = h.runs["first"]
    notes = h.kube.h("get", "notes", run.release, "-n", run.namespace, timeout=60).stdout
    h.notes[run.release] = notes
    want_ray = nc.ray_version(notes)
    ledger: list[dict[str, str]] = []
    for line in nc.plan(notes):
        entry = {"command": line.command, "kind": line.kind}
        if line.kind == nc.NOT_RUN:
            entry.update(result="not run", why=line.why)
        elif line.kind == nc.BY_STAGE:
            entry.update(result=f"run by stage {line.by!r}", stage=line.by)
        else:
            try:
                run_notes_line(h, line, run, want_ray)
                entry.update(result="ran")
            except _NotRun as e:
                entry.update(result="not run", why=str(e))
        ledger.append(entry)
    if not any(e["result"] == "ran" for e in ledger):
        raise StageError(f"NOTES of {run.release} printed no command this stage could run:\n{notes[:500]}")
    h.record.facts["notes_commands"] = ledger
    ran = [e for e in ledger if e["result"] == "ran"]
    by = sorted({e["stage"] for e in ledger if "stage" in e})
    not_run = [e for e in ledger if e["result"] == "not run"]
    return (f"{len(ran)} run as printed; {sum('stage' in e for e in ledger)} left to the stages {', '.join(by)}; "
            f"{len(not_run)} not run ({'; '.join(e['why'] for e in not_run) or 'none'})")


def notes_line(h: Harness, release: str, kind_by: str) -> str:
    """The NOTES line of `release` that the stage `kind_by` runs as printed (StageError when NOTES lack it)."""
    notes = h.notes.get(release) or h.kube.h("get", "notes", release, "-n", NAMESPACE, timeout=60).stdout
    h.notes[release] = notes
    found = [ln.command for ln in nc.plan(notes) if ln.kind == nc.BY_STAGE and ln.by == kind_by]
    if not found:
        raise StageError(f"NOTES of {release} print no line for the stage {kind_by!r}:\n{notes[-800:]}")
    return found[0]


def as_printed(command: str, **fill: str) -> list[str]:
    """A NOTES line's argv with its placeholders filled (<chart> -> the chart folder, <revision>, <its-name>)."""
    fill = {"chart": str(CHART), **{k.replace("_", "-"): v for k, v in fill.items()}}
    for key, value in fill.items():
        command = command.replace(f"<{key}>", shlex.quote(value))
    left = re.findall(r"<[^>]+>", command)
    if left:
        raise StageError(f"NOTES line `{command}`: nothing to fill {left[0]} with")
    return shlex.split(command)


# ---------------------------------------------------------------------------------------------- stages
def install(h: Harness) -> str:
    h.namespace(NAMESPACE)
    run = h.helm_install(RELEASE, NAMESPACE, sets={"rayJob.ttlSecondsAfterFinished": KEEP_ALIVE_S})
    h.runs["first"] = run
    h.record.facts["first_run"] = {"rayjob": run.rayjob, "run": run.run_name}
    return f"RayJob {run.rayjob}, run {run.run_name}"


def succeeded(h: Harness) -> str:
    run = h.runs["first"]
    t0 = time.monotonic()
    h.wait_run(run)
    return f"RayJob {run.rayjob} SUCCEEDED in {time.monotonic() - t0:.0f} s"


def _head_ready(h: Harness, run: Run) -> str:
    """The name of the Ready head pod of the run's cluster (kept alive after the job: KEEP_ALIVE_S)."""
    def ready() -> str:
        job = h.kube.get("rayjob", run.rayjob, run.namespace) or {}
        cluster = (job.get("status") or {}).get("rayClusterName", "")
        for pod in h.kube.items("pods", run.namespace, f"ray.io/cluster={cluster},ray.io/node-type=head") if cluster else []:
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions", [])):
                return pod["metadata"]["name"]
        return ""
    return h.kube.wait_for(f"{run.rayjob}: its cluster's head pod Ready", ready, 300, run.namespace)


def helm_test(h: Harness) -> str:
    run = h.runs["first"]
    head = _head_ready(h, run)
    notes = h.kube.h("get", "notes", run.release, "-n", run.namespace, timeout=60).stdout
    h.notes[run.release] = notes
    printed = [ln.command for ln in nc.plan(notes) if ln.by == "helm test"]
    argv = as_printed(printed[0]) if printed else ["helm", "test", run.release, "-n", run.namespace]
    h.kube.run([*argv, "--timeout", "300s"], timeout=330, what="helm test")
    if printed:
        h.record.notes_line_ran("helm test")
    return f"{shlex.join(argv)} passed against {head}" + ("" if printed else " (NOTES print no helm test line)")


def finalizer_line(h: Harness) -> str:
    """The NOTES finalizer line, on a release made for it: frees its RayJob held terminating by a finalizer."""
    run = h.helm_install(FINALIZER_RELEASE, NAMESPACE, sets={"kueue.queueName": NO_SUCH_QUEUE})
    notes = h.kube.h("get", "notes", FINALIZER_RELEASE, "-n", NAMESPACE, timeout=60).stdout
    line = [ln.command for ln in nc.plan(notes) if ln.by == nc.FINALIZER_STAGE]
    if not line:
        raise StageError(f"NOTES of {FINALIZER_RELEASE} print no line that removes the RayJob's finalizer")
    argv = as_printed(line[0])
    if run.rayjob not in argv:
        raise StageError(f"the NOTES finalizer line `{line[0]}` is not for the release's RayJob {run.rayjob}")

    def finalizers() -> list[str]:
        job = h.kube.get("rayjob", run.rayjob, NAMESPACE) or {}
        return (job.get("metadata") or {}).get("finalizers") or []

    h.kube.wait_for(f"KubeRay's finalizer on {run.rayjob}", lambda: any(f.startswith("ray.io/") for f in finalizers()),
                    120, NAMESPACE)
    h.kube.k("-n", NAMESPACE, "patch", "rayjob", run.rayjob, "--type=json",
             "-p", f'[{{"op": "add", "path": "/metadata/finalizers/-", "value": "{STAND_IN_FINALIZER}"}}]')
    try:
        return _free_held(h, run, argv, finalizers)
    finally:  # never leave the stand-in behind (the namespace could not be deleted)
        job = h.kube.get("rayjob", run.rayjob, NAMESPACE)
        if job and STAND_IN_FINALIZER in (job["metadata"].get("finalizers") or []):
            h.kube.k("-n", NAMESPACE, "patch", "rayjob", run.rayjob, "--type=merge",
                     "-p", '{"metadata":{"finalizers":null}}', check=False)


def _free_held(h: Harness, run: Run, argv: list[str], finalizers) -> str:
    h.kube.h("uninstall", FINALIZER_RELEASE, "-n", NAMESPACE, timeout=120, what=f"helm uninstall {FINALIZER_RELEASE}")
    if (NAMESPACE, FINALIZER_RELEASE) in h.installed:
        h.installed.remove((NAMESPACE, FINALIZER_RELEASE))

    def terminating() -> dict[str, Any] | None:
        job = h.kube.get("rayjob", run.rayjob, NAMESPACE)
        return job if job and job["metadata"].get("deletionTimestamp") else None

    stuck = h.kube.wait_for(f"{run.rayjob} terminating after helm uninstall", terminating, 60, NAMESPACE)
    time.sleep(5)  # the operator's turn: it removes its own finalizer; the stand-in stays
    held = finalizers()
    if STAND_IN_FINALIZER not in held:
        raise StageError(f"{run.rayjob} is no longer held ({held}): the stage cannot show the line's case")
    h.kube.run(argv, what="the NOTES finalizer line", timeout=60)
    h.record.notes_line_ran(nc.FINALIZER_STAGE)
    h.kube.wait_for(f"{run.rayjob} gone after the NOTES finalizer line",
                    lambda: h.kube.get("rayjob", run.rayjob, NAMESPACE) is None, 60, NAMESPACE)
    return (f"{run.rayjob} terminating since {stuck['metadata']['deletionTimestamp']}, held by {held}; "
            f"`{shlex.join(argv)}` -> gone")


def check_outputs(h: Harness) -> str:
    """The run's results in the bucket: final adapter, metrics.jsonl, summary.json, report.html."""
    run = h.runs["first"]
    summary = h.summary(run)
    need = ["final/adapter_config.json", "final/adapter_model.safetensors", "metrics.jsonl", "summary.json", "report.html"]
    missing = [n for n in need if not h.storage.path(f"{run.run_uri}/{n}").is_file()]
    if missing:
        raise StageError(f"{run.run_uri}: missing {missing} (have: {h.listing(run)})")
    want_steps = int(run.flags["max_steps"])
    if not summary.get("completed") or summary.get("global_step") != want_steps:
        raise StageError(f"{run.run_uri}/summary.json: completed={summary.get('completed')}, "
                         f"global_step={summary.get('global_step')} (want {want_steps})")
    return f"{run.run_uri}: {len(h.listing(run))} objects, {want_steps} steps, final loss {summary.get('final_train_loss')}"


def plugin_shows(h: Harness) -> str:
    """`gemma3-ray status` and `gemma3-ray logs` against the cluster name the run."""
    run = h.runs["first"]
    base = ["gemma3-ray"]
    common = ["-n", run.namespace, "--release", run.release, "--project", "gemma3-ray-e2e", "--region", "us-central1"]
    status = h.kube.run([*base, "status", *common], what="gemma3-ray status", timeout=120).stdout
    if run.rayjob not in status or "SUCCEEDED" not in status:
        raise StageError(f"gemma3-ray status does not show {run.rayjob} SUCCEEDED:\n{status[-600:]}")
    logs = h.kube.run([*base, "logs", *common], what="gemma3-ray logs", timeout=120).stdout
    if not nc.trainer_said(logs, run.run_name):
        raise StageError(f"gemma3-ray logs does not show the trainer's summary of run {run.run_name} (its "
                         f"{nc.TRAINER_BANNER!r} block):\n{logs[-600:]}")
    return f"status: {len(status.splitlines())} lines, logs: {len(logs.splitlines())} lines"
