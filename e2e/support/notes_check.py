"""The commands the chart's NOTES print, sorted by who runs them, and the checks of what each one showed.

Pure functions (no cluster): tests/e2e holds them to what the stages rely on. A NOTES line is either run
here by the stage `NOTES commands`, run as printed by the stage named in `by` (the day-two stages run
the upgrade, rollback and uninstall lines; the stage `NOTES: finalizer line` runs the finalizer line on
a release made for it), or listed as not run with the reason.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

TOOLS = ("kubectl", "helm", "gemma3-ray", "gcloud")
# a line to copy: indented 5 (prose is indented 3: "   helm replaces and deletes it itself, …")
_INDENTED = re.compile(r"^\s{5,}((?:kubectl|helm|gemma3-ray|gcloud) .+?)\s*$", re.M)
# a whole command quoted in the text (`helm test r -n ns`): a tool, its verb and a namespace
_QUOTED = re.compile(r"`((?:kubectl|helm|gemma3-ray|gcloud) [^`]* -n [^`]+)`")
_ASIDE = re.compile(r"\s{2,}\(.*$")  # "helm uninstall r -n ns     (`gemma3-ray down` also …)": the remark
_PLACEHOLDER = re.compile(r"<[^>]+>")
_RAY_VERSION = re.compile(r"\(Ray (\d+\.\d+\.\d+)\)")

# kinds of NOTES line
WATCH, FOLLOW, PORT_FORWARD, RUN, BY_STAGE, NOT_RUN = "watch", "follow", "port-forward", "run", "by stage", "not run"
FINALIZER_STAGE = "NOTES: finalizer line"
QUICK_ROLLBACK_STAGE = "upgrade + rollback at once"


@dataclass(frozen=True)
class NotesLine:
    command: str  # as printed
    kind: str  # watch | follow | port-forward | run | by stage | not run
    by: str = ""  # the stage that runs it (kind "by stage")
    why: str = ""  # why it is not run (kind "not run")

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.command)


def commands(notes: str) -> list[str]:
    """Every command NOTES print for a user to copy: indented lines, and whole commands quoted in the text."""
    found = [_ASIDE.sub("", m.group(1)).strip() for m in _INDENTED.finditer(notes)]
    found += [m.group(1).strip() for m in _QUOTED.finditer(notes)]
    return list(dict.fromkeys(found))  # in order, once each


def ray_version(notes: str) -> str:
    """The Ray version NOTES name on their first line (the chart's head image)."""
    m = _RAY_VERSION.search(notes)
    return m.group(1) if m else ""


def classify(command: str) -> NotesLine:
    """Who runs this NOTES command, or why nobody does."""
    argv = shlex.split(command)
    tool, words = argv[0], set(argv[1:])
    has_placeholder = bool(_PLACEHOLDER.search(command))
    if tool == "kubectl":
        if "patch" in words and "finalizers" in command:
            return NotesLine(command, BY_STAGE, by=FINALIZER_STAGE)
        if "wait" in words and "--for=delete" in words:
            return NotesLine(command, BY_STAGE, by=QUICK_ROLLBACK_STAGE)
        if has_placeholder:
            return NotesLine(command, NOT_RUN, why="a template with a placeholder to fill in, not a command")
        if "port-forward" in words:
            return NotesLine(command, PORT_FORWARD)
        if "-w" in words or "--watch" in words:
            return NotesLine(command, WATCH)
        if "logs" in words and ("-f" in words or "--follow" in words):
            return NotesLine(command, FOLLOW)
        return NotesLine(command, RUN)
    if tool == "helm":
        verb = argv[1] if len(argv) > 1 else ""
        if verb == "test":
            return NotesLine(command, BY_STAGE, by="helm test")
        if verb == "upgrade" and "training.resume_from=" in command:
            return NotesLine(command, NOT_RUN, why="continues a run whose head was lost with rayJob.backoffLimit=0; "
                                                   "the stage 'lost head' runs with backoffLimit=1, where KubeRay "
                                                   "retries by itself")
        if verb == "upgrade":
            return NotesLine(command, BY_STAGE, by="upgrade")
        if verb == "rollback":
            return NotesLine(command, BY_STAGE, by="rollback")
        if verb == "uninstall":
            return NotesLine(command, BY_STAGE, by="uninstall")
        if verb in {"status", "get", "history", "list"} and not has_placeholder:
            return NotesLine(command, RUN)
        return NotesLine(command, NOT_RUN, why=f"changes the release (helm {verb}) and no stage runs it")
    if tool == "gcloud":
        return NotesLine(command, RUN)  # against the storage emulator (the stage sets gcloud's endpoint)
    if tool == "gemma3-ray" and not has_placeholder:
        return NotesLine(command, RUN)
    return NotesLine(command, NOT_RUN, why="a template with a placeholder to fill in, not a command")


def plan(notes: str) -> list[NotesLine]:
    return [classify(c) for c in commands(notes)]


def with_local_port(argv: list[str], port: int) -> list[str]:
    """`kubectl port-forward svc/x 8265:8265` with the local side moved to `port` (a port known to be free)."""
    spec = next((i for i, a in reversed(list(enumerate(argv))) if re.fullmatch(r"\d+(:\d+)?", a)), None)
    if spec is None:
        raise ValueError(f"no PORT or LOCAL:REMOTE in {shlex.join(argv)}")
    remote = argv[spec].split(":")[-1]
    return [*argv[:spec], f"{port}:{remote}", *argv[spec + 1:]]


def watch_problem(output: str, returncode: int | None, rayjob: str) -> str:
    """What is wrong with `kubectl get rayjob X -w` (stopped by us: returncode None), '' when it showed the RayJob.

    It must still be watching when stopped (or have ended 0) and show a row whose first column is the
    RayJob's name: an error naming it ('rayjobs.ray.io "X" not found') is not a row.
    """
    if returncode not in (None, 0):
        return f"exited {returncode} on its own: {output.strip()[-300:]!r}"
    rows = [line.split() for line in output.splitlines() if line.strip()]
    if not any(r and r[0] == rayjob for r in rows):
        return f"printed no row for RayJob {rayjob}: {output.strip()[-300:]!r}"
    return ""


# The trainer's own closing block (trainer/vision_train.py print_summary): its banner, then `  run_name  <name>`.
# Ray's echo of the entrypoint carries the run name too (`--run_name=<name>`), so the name alone proves nothing.
TRAINER_BANNER = "gemma3-ray training summary"


def trainer_said(output: str, run_name: str) -> bool:
    """Whether output holds the trainer's own summary of run_name: the banner and its `run_name <name>` row."""
    row = re.compile(rf"(?:^|\s)run_name\s+{re.escape(run_name)}\s*$", re.M)
    return bool(run_name) and TRAINER_BANNER in output and row.search(output) is not None


def follow_problem(output: str, returncode: int | None, run_name: str) -> str:
    """What is wrong with `kubectl logs -f job/X`, '' when it showed the trainer's own summary of the run and did
    not fail."""
    if returncode not in (None, 0):
        return f"exited {returncode}: {output.strip()[-300:]!r}"
    if not trainer_said(output, run_name):
        return (f"did not show the trainer's summary of run {run_name!r} (its {TRAINER_BANNER!r} block): "
                f"{output.strip()[-300:]!r}")
    return ""


def dashboard_problem(body: str, want_ray: str) -> str:
    """What is wrong with the answer of http://localhost:PORT/api/version, '' when it is a Ray dashboard of want_ray."""
    try:
        info = json.loads(body)
    except ValueError:
        return f"answered, but not with the Ray dashboard's JSON: {body[:200]!r}"
    got = info.get("ray_version") if isinstance(info, dict) else None
    if not want_ray:
        return "NOTES name no Ray version to compare the dashboard's with"
    if got != want_ray:
        return f"the dashboard reports Ray {got!r}, the release's head runs Ray {want_ray}"
    return ""
