"""A second `make e2e` against this run's cluster, for the `shared` drills (issue #42): another checkout's run, as a
second team or CI runner would start it — through KUBECONFIG, with a cache, an output folder and a run id of its own
— so it takes its own lock and Lease and knows nothing of this run.

It runs `python -m e2e --only …` in a session of its own (a SIGKILL of its group is the drill's "killed hard"), its
output to `<its output>/child.log`. It is stopped on every exit path of this run: `stop()` (SIGTERM, its clean-up
waited for) in the stage's `finally`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.support.errors import StageError
from e2e.support.harness import ROOT

CHILD_CLEANUP_S = 300


@dataclass
class Child:
    name: str
    run_id: str
    out: Path
    proc: subprocess.Popen

    @property
    def log(self) -> Path:
        return self.out / "child.log"

    def tail(self, lines: int = 12) -> str:
        text = self.log.read_text(errors="replace") if self.log.is_file() else ""
        return "\n".join(text.splitlines()[-lines:])

    def summary(self) -> dict[str, Any]:
        path = self.out / "summary.json"
        if not path.is_file():
            return {}
        try:
            return json.loads(path.read_text())
        except ValueError:
            return {}

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StageError(f"the second run {self.name} did not end in {timeout:.0f} s:\n{self.tail()}") from None

    def kill(self) -> None:
        """SIGKILL to its whole process group: no clean-up, no Lease renewal (a run killed hard)."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        """On this run's exit paths: SIGTERM to a child still running, and its clean-up waited for."""
        if self.proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=CHILD_CLEANUP_S)
        except subprocess.TimeoutExpired:
            self.kill()


def child_env(kubeconfig: Path, work: Path, run_id: str, images: dict[str, str], node: str = "") -> dict[str, str]:
    """The environment of a second run: this cluster through KUBECONFIG, its own cache/output/run id, the images
    this run imported into the node (pulled never), and the node it may change (E2E_NODE), if any."""
    values = work / "images.yaml"
    values.write_text(json.dumps({"image": {"pullPolicy": "Never"}}) + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_") or k == "E2E_DEADLINE"}
    env.update({"KUBECONFIG": str(kubeconfig), "GEMMA3_RAY_CACHE": str(work / "cache"), "E2E_OUTPUT": str(work / "out"),
                "E2E_RUN_ID": run_id, "E2E_VALUES": str(values), "E2E_HEAD_IMAGE": images["head"],
                "E2E_WORKER_IMAGE": images["worker"], "E2E_STORAGE_IMAGE": images["storage"],
                "PATH": f"{ROOT / '.tools' / 'bin'}:{env.get('PATH', '')}"})
    if node:
        env["E2E_NODE"] = node
    return env


def start(name: str, only: str, work: Path, env: dict[str, str]) -> Child:
    out = Path(env["E2E_OUTPUT"])
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "child.log", "w", encoding="utf-8")  # noqa: SIM115 - the child holds it
    try:
        proc = subprocess.Popen([sys.executable, "-m", "e2e", "--only", only], cwd=ROOT, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()
    return Child(name, env["E2E_RUN_ID"], out, proc)


def wait_until(child: Child, what: str, ready, timeout: float) -> None:
    """Until ready() is true; the child ending first, or the time running out, is an error naming its log."""
    end = time.monotonic() + timeout
    while not ready():
        if child.proc.poll() is not None:
            raise StageError(f"the second run {child.name} ended (exit {child.proc.returncode}) before {what}:\n"
                             f"{child.tail()}")
        if time.monotonic() > end:
            raise StageError(f"the second run {child.name}: no {what} in {timeout:.0f} s:\n{child.tail()}")
        time.sleep(2)
