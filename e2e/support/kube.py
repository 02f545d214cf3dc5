"""kubectl and helm against the e2e cluster: commands, waits on real status, and the diagnostics a failure prints."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from e2e.support.deadline import DEADLINE
from e2e.support.errors import StageError

# RayJob states (KubeRay v1.5 `status.jobStatus`, `status.jobDeploymentStatus`): KubeRay's own terminal
# deployment states (IsJobDeploymentTerminal) and ValidationFailed, after which it never reconciles again.
JOB_DONE = {"SUCCEEDED", "FAILED", "STOPPED"}
DEPLOYMENT_DONE = {"Complete", "Failed", "ValidationFailed"}


def ended(status: dict[str, Any] | None) -> bool:
    """The RayJob will not change on its own any more: a terminal deployment state, or a terminal job status in a
    suspended deployment. A FAILED attempt that KubeRay retries (Retrying, then New) has not ended."""
    st = status or {}
    deployment = st.get("jobDeploymentStatus")
    return deployment in DEPLOYMENT_DONE or (st.get("jobStatus") in JOB_DONE and deployment == "Suspended")


def manifest_refs(manifest: str) -> list[str]:
    """Every object a release's manifest (`helm get manifest`) names, as kubectl names them: `kind.version.group/name`
    (`configmap.v1./x` for the core group is written `configmap/x`)."""
    import yaml

    refs: list[str] = []
    for doc in yaml.safe_load_all(manifest):
        if not isinstance(doc, dict) or not doc.get("kind") or not (doc.get("metadata") or {}).get("name"):
            continue
        group, _, version = str(doc.get("apiVersion", "v1")).rpartition("/")
        kind = doc["kind"].lower()
        refs.append(f"{kind}.{version}.{group}/{doc['metadata']['name']}" if group else f"{kind}/{doc['metadata']['name']}")
    return refs


def stop_command(proc: subprocess.Popen) -> int | None:
    """Stop a kubectl command that does not end by itself (port-forward, logs -f, get -w): its own exit code if it
    had ended before, else None."""
    rc = proc.poll()
    if rc is not None:
        return rc
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return None


@dataclass
class Kube:
    """The cluster the e2e runs on: its kubeconfig, the tools, and a log of every command run."""

    kubeconfig: Path
    log_path: Path
    helm: str = "helm"
    kubectl: str = "kubectl"
    env: dict[str, str] = field(default_factory=dict)

    def environ(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), **self.env}

    def _log(self, text: str) -> None:
        with open(self.log_path, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 300, input_text: str | None = None,
            what: str = "") -> subprocess.CompletedProcess[str]:
        """Run a command (its timeout capped to E2E_DEADLINE); on failure (check) raise StageError with its own last
        lines."""
        limit = DEADLINE.cap(timeout, what or argv[0])
        self._log(f"$ {shlex.join(argv)}")
        try:
            proc = subprocess.run(argv, env=self.environ(), capture_output=True, text=True, timeout=limit,
                                  input=input_text)
        except subprocess.TimeoutExpired as e:
            cut = DEADLINE.expired(f"{what or argv[0]}: `{shlex.join(argv[:6])} …`", limit, timeout)
            raise cut or StageError(f"{what or argv[0]}: `{shlex.join(argv[:6])} …` did not finish in "
                                    f"{timeout:.0f} s") from e
        except FileNotFoundError as e:  # the tool itself (checked at the start; gone since, or a stage's own)
            raise StageError(f"{what or argv[0]}: {argv[0]} not found (is it installed and on PATH?)") from e
        self._log(proc.stdout + proc.stderr)
        if check and proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            raise StageError(f"{what or argv[0]}: `{shlex.join(argv[:8])}` exited {proc.returncode}:\n{tail}")
        return proc

    def k(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.kubectl, *args], **kw)

    def h(self, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
        return self.run([self.helm, *args], **kw)

    def get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        proc = self.k("-n", ns, "get", kind, name, "-o", "json", check=False, timeout=60)
        if proc.returncode != 0:
            if "NotFound" in proc.stderr or "not found" in proc.stderr:
                return None
            raise StageError(f"kubectl get {kind} {name} -n {ns}: {proc.stderr.strip()[-400:]}")
        return json.loads(proc.stdout)

    def items(self, kind: str, ns: str | None, selector: str = "") -> list[dict[str, Any]]:
        args = ["get", kind, "-o", "json"] + (["-n", ns] if ns else ["-A"]) + (["-l", selector] if selector else [])
        return json.loads(self.k(*args, timeout=60).stdout).get("items", [])

    # ------------------------------------------------------------------ diagnostics
    def diagnose(self, ns: str, limit: int = 12) -> str:
        """What the cluster itself says about a namespace: warning events, pods that are not fine."""
        lines: list[str] = []
        try:
            events = self.items("events", ns)
        except StageError as e:
            return f"(events unreadable: {e})"
        for ev in sorted(events, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")[-40:]:
            if ev.get("type") == "Warning" or ev.get("reason") in {"Failed", "FailedScheduling", "BackOff"}:
                obj = ev.get("involvedObject", {})
                lines.append(f"  event {obj.get('kind')}/{obj.get('name')}: {ev.get('reason')}: {ev.get('message', '').strip()[:300]}")
        for pod in self.items("pods", ns):
            st = pod.get("status", {})
            for cs in st.get("containerStatuses", []) + st.get("initContainerStatuses", []):
                waiting = cs.get("state", {}).get("waiting") or {}
                term = cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated") or {}
                if waiting.get("reason") or (term and term.get("exitCode", 0) != 0):
                    why = waiting.get("reason") or f"exit {term.get('exitCode')} ({term.get('reason')})"
                    msg = waiting.get("message") or term.get("message") or ""
                    lines.append(f"  pod {pod['metadata']['name']} container {cs['name']}: {why} {msg.strip()[:300]}")
            if st.get("phase") == "Pending":
                for c in st.get("conditions", []):
                    if c.get("status") == "False" and c.get("message"):
                        lines.append(f"  pod {pod['metadata']['name']}: {c['type']}: {c['message'][:300]}")
        return "\n".join(lines[-limit:]) or "  (no warning events, no failing pods)"

    def pod_log_tail(self, ns: str, selector: str, lines: int = 25) -> str:
        proc = self.k("-n", ns, "logs", "-l", selector, "--all-containers", f"--tail={lines}", "--prefix",
                      check=False, timeout=60)
        return (proc.stdout or proc.stderr).strip()

    # ------------------------------------------------------------------ waits
    def wait_for(self, what: str, probe: Callable[[], Any], timeout: float, ns: str | None = None,
                 interval: float = 2.0) -> Any:
        """Poll probe() until it returns a truthy value (at most `timeout` s, capped to E2E_DEADLINE); on timeout
        raise with the namespace's diagnostics."""
        limit = DEADLINE.cap(timeout, what)
        deadline = time.monotonic() + limit
        while True:
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                cut = DEADLINE.expired(what, limit, timeout)
                if cut:
                    raise cut
                extra = f"\n{self.diagnose(ns)}" if ns else ""
                raise StageError(f"{what}: not reached in {timeout:.0f} s{extra}")
            time.sleep(interval)

    def wait_rayjob(self, ns: str, name: str, timeout: float, *, want: str = "SUCCEEDED") -> dict[str, Any]:
        """Follow a RayJob through the real operator until it ends; return its final object.

        No check hangs on a state a poll may miss (a short RUNNING): a stage that needs the live cluster
        waits for its pods, which outlive the job by rayJob.ttlSecondsAfterFinished.
        """
        limit = DEADLINE.cap(timeout, f"RayJob {ns}/{name}: {want}")
        deadline = time.monotonic() + limit
        last = ""
        while True:
            job = self.get("rayjob", name, ns)
            if job is None:
                raise StageError(f"RayJob {ns}/{name} is gone while waiting for {want}")
            st = job.get("status", {}) or {}
            state = f"{st.get('jobDeploymentStatus', '-')}/{st.get('jobStatus', '-')}"
            if state != last:
                self._log(f"# RayJob {ns}/{name}: {state} {st.get('reason', '')} {st.get('message', '')}")
                last = state
            if ended(st):
                if st.get("jobStatus") == want:
                    return job
                raise StageError(
                    f"RayJob {ns}/{name} ended {state} (want {want}): reason {st.get('reason', '-')!r}, "
                    f"message {st.get('message', '-')!r}\n{self.diagnose(ns)}\n"
                    f"submitter log tail:\n{self.pod_log_tail(ns, f'job-name={name}')}")
            if time.monotonic() > deadline:
                cut = DEADLINE.expired(f"RayJob {ns}/{name} still {state} (want {want})", limit, timeout)
                if cut:
                    raise cut
                raise StageError(f"RayJob {ns}/{name} still {state} after {timeout:.0f} s (want {want})\n"
                                 f"{self.diagnose(ns)}")
            time.sleep(2)

    def present(self, ns: str, refs: list[str]) -> list[str]:
        """Which of these objects (`resource.version.group/name`, as manifest_refs gives them) still exist; a listing
        the cluster refuses is a StageError, never "gone"."""
        if not refs:
            return []
        proc = self.k("-n", ns, "get", *refs, "--ignore-not-found", "-o", "name", check=False, timeout=60)
        if proc.returncode != 0:
            raise StageError(f"kubectl -n {ns} get {' '.join(refs[:4])} …: {proc.stderr.strip()[-400:]} (exit "
                             f"{proc.returncode}): what is left cannot be known")
        return [line for line in proc.stdout.split() if line]

    def gone(self, ns: str, selector: str, kinds: list[str]) -> list[str]:
        """Objects of these kinds matching the selector that still exist (names as kind/name); a listing the cluster
        refuses (Forbidden, a 5xx) is a StageError, never "nothing"."""
        left: list[str] = []
        for kind in kinds:
            proc = self.k("-n", ns, "get", kind, "-l", selector, "-o", "name", check=False, timeout=60)
            if proc.returncode != 0:
                raise StageError(f"kubectl -n {ns} get {kind} -l {selector}: {proc.stderr.strip()[-400:]} (exit "
                                 f"{proc.returncode}): what is left cannot be known")
            left += [line for line in proc.stdout.split() if line]
        return left


def epoch(stamp: str) -> float:
    """Seconds since the epoch of a Kubernetes Time (`2026-12-04T10:00:00Z`) or MicroTime (`…:00.123456Z`)."""
    text = stamp if "." in stamp else stamp.replace("Z", ".0Z")
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()
