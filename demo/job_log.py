"""Which job log lines the demo's terminal shows (job.log keeps every line; its tail is shown on failure).

Left out of the terminal:

- Ray's own logging: its logger's INFO/DEBUG records (``2026-12-01 09:00:00,123\tINFO worker.py:12 -- …``),
  everything Ray's internal processes print (``(TrainController pid=…)``, ``(raylet)``, ``(autoscaler …)``:
  resource requests, worker-group start, transient retries), the job supervisor's ``Running entrypoint``
  echo (the demo prints the entry point itself), and Ray Train's per-worker bookkeeping prints
  (process group set-up, ``Reporting training result``, ``Checkpoint successfully created``);
- the Trainer's metric dicts (``{'loss': …}``, ``{'eval_loss': …}``): the demo's progress lines carry
  those numbers, and metrics.jsonl all of them;
- empty lines.

Everything else is shown: the driver's and the trainer's lines, Ray's warnings and errors, library
warnings and tracebacks from the workers.
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
# `(Name pid=123)`, `(Name pid=123, ip=10.0.0.1)`, `(raylet)`, `(autoscaler +3s)`, `(pid=gcs_server)`
PREFIX = re.compile(r"^\((?P<who>[^)]*)\)\s?")
RAY_LOGGER = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?P<level>[A-Z]+)\s+\S+:\d+ -- ")
RAY_PROCESSES = ("TrainController", "raylet", "autoscaler", "pid=gcs_server", "gcs_server", "monitor",
                 "dashboard", "JobSupervisor")
QUIET_LEVELS = {"INFO", "DEBUG"}
RAY_PRINTS = ("Running entrypoint for job ", "Setting up process group for:", "Reporting training result ",
              "Checkpoint successfully created at:")
TRAINER_METRIC_DICT = re.compile(r"^\{'(loss|eval_loss|train_runtime)': ")
SHOWN_PREFIX = "  job | "


def is_ray_own(line: str) -> bool:
    """True for a line the terminal leaves out (see the module docstring); False for everything else."""
    text = ANSI.sub("", line).rstrip("\r")
    who = ""
    m = PREFIX.match(text)
    if m:
        who, text = m.group("who"), text[m.end():]
    if not text.strip():
        return True
    logged = RAY_LOGGER.match(text)
    if logged:
        return logged.group("level") in QUIET_LEVELS
    if any(who.startswith(p) for p in RAY_PROCESSES):
        return True
    return text.startswith(RAY_PRINTS) or bool(TRAINER_METRIC_DICT.match(text))


def for_terminal(line: str, ansi: bool) -> str:
    """The line as the terminal shows it: under the `job |` gutter, colours kept only on a TTY."""
    line = line.rstrip("\r")
    return SHOWN_PREFIX + (line if ansi else ANSI.sub("", line))


class LineSplitter:
    """Turns streamed chunks into whole lines (a chunk may end mid-line)."""

    def __init__(self) -> None:
        self.partial = ""

    def feed(self, chunk: str) -> list[str]:
        lines = (self.partial + chunk).split("\n")
        self.partial = lines.pop()
        return lines

    def flush(self) -> list[str]:
        rest, self.partial = self.partial, ""
        return [rest] if rest else []
