"""The stage record of `make e2e`: each stage's time and result, the table it prints, the JSON it writes.

Every stage of e2e/runner/table.py gets a row: `pass`, `fail`, or `not run` with the reason (skipped,
not selected, precondition unmet, time, stopped after a failure, interrupted). The run's result, one truth
for summary.json, the printed table and the exit code (`verdict`, `exit_code`): `pass` only when every
selected stage passed, nothing is left and nothing went wrong between the stages or in the clean-up; `fail`
when a stage failed, an error or a signal stopped the run, the clean-up left something or the run has not
ended (what a killed run's summary.json says); else `not run` (a selected stage did not run: time, or the
cluster lacks what it needs). summary.json is written after every row, so a killed run leaves one.
"""

from __future__ import annotations

import contextlib
import json
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2e.support.deadline import OutOfTime
from e2e.support.errors import NotRun, StageError

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
EXIT = {PASS: 0, FAIL: 1, NOT_RUN: 3}  # a signal: 128 + its number (a fail); 2: refused before anything ran


def say(msg: str) -> None:
    with contextlib.suppress(OSError):  # the terminal went away (SIGHUP): the log and summary.json still say it
        print(msg, flush=True)


@dataclass
class Stage:
    name: str
    result: str = NOT_RUN  # pass | fail | not run
    seconds: float = 0.0
    detail: str = ""  # what the stage saw (pass), the cluster's words (fail), or why it did not run
    group: str = ""
    claim: str = ""


@dataclass
class Record:
    """Every stage of this run, in order, with a say() for progress lines."""

    out_dir: Path
    say: Callable[[str], None] = print
    stages: list[Stage] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    selected: list[str] = field(default_factory=list)  # the stages this run was asked to prove
    errors: list[str] = field(default_factory=list)  # what went wrong outside a row: between stages, a signal, clean-up
    ended: bool = False  # the clean-up has finished: until then summary.json says the run did not end

    def row(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def result(self, name: str) -> str:
        """pass, fail, or not run (also for a stage without a row yet)."""
        st = self.row(name)
        return st.result if st else NOT_RUN

    @contextmanager
    def stage(self, name: str, detail: str = "", *, group: str = "", claim: str = "") -> Iterator[Stage]:
        """Time a stage; StageError marks it failed (and stops the run), anything else too, with its type; NotRun
        gives it a row "not run" with the reason."""
        if self.row(name) is not None:
            raise StageError(f"stage {name!r} ran twice in one run (a defect of the e2e harness)")
        st = Stage(name, detail=detail, group=group, claim=claim)
        self.stages.append(st)
        self.say(f"[e2e] {name} …")
        t0, skipped = time.monotonic(), False
        try:
            yield st
            st.result = PASS
        except NotRun as e:  # the stage does not apply here: its row says why, and the run goes on
            skipped, st.result, st.detail = True, NOT_RUN, str(e)
            self.say(f"[e2e] {name}: not run - {e}")
        except OutOfTime as e:  # E2E_DEADLINE stopped it: neither proven nor false
            st.result, st.detail = NOT_RUN, f"time: {e}"
            self.say(f"[e2e] {name}: not run - {st.detail}")
            raise
        except StageError as e:
            st.result, st.detail = FAIL, str(e)
            raise
        except KeyboardInterrupt:
            st.result, st.detail = FAIL, "interrupted"
            raise
        except Exception as e:  # a defect of the e2e itself: keep its traceback in the log, one line here
            st.result = FAIL
            st.detail = f"{type(e).__name__}: {e}"
            self.log_traceback()
            raise StageError(f"{name}: {st.detail}") from e
        finally:
            st.seconds = 0.0 if skipped else round(time.monotonic() - t0, 1)
            self.write()  # after every row: a run killed later still leaves what it saw
        if st.result == PASS:
            self.say(f"[e2e] {name}: pass ({st.seconds:.0f} s){' - ' + st.detail if st.detail else ''}")

    def log_traceback(self) -> None:
        """The traceback being handled, into e2e.log (the terminal gets one line)."""
        with open(self.out_dir / "e2e.log", "a", encoding="utf-8") as f:
            f.write(traceback.format_exc())

    def notes_line_ran(self, stage: str) -> None:
        """The stage `stage` ran its NOTES line as printed (the ledger says "ran" for it only then)."""
        ran = self.facts.setdefault("notes_lines_ran_by", [])
        if stage not in ran:
            ran.append(stage)

    def not_run(self, name: str, why: str, *, group: str = "", claim: str = "") -> None:
        """A row for a stage that did not run, with the reason (never a silent gap)."""
        if self.row(name) is not None:
            return
        self.stages.append(Stage(name, NOT_RUN, 0.0, why, group, claim))
        self.write()
        self.say(f"[e2e] {name}: not run - {why}")

    def finish(self, names: Iterable[tuple[str, str, str]], why: str) -> None:
        """Rows for every (name, group, claim) of the table that has none yet: not run, `why`."""
        for name, group, claim in names:
            self.not_run(name, why, group=group, claim=claim)

    @property
    def failed(self) -> list[str]:
        return [s.name for s in self.stages if s.result == FAIL]

    def verdict(self) -> tuple[str, str]:
        """(result, reason): pass only when every selected stage passed and nothing is left; fail when a stage
        failed, something went wrong outside the rows, something is left or the run has not ended; else not run."""
        why = [f"stage {n!r} failed" for n in self.failed] + self.errors
        left = self.facts.get("left") or []
        if left:
            why.append(f"left: {', '.join(left)}")
        if not self.ended:
            why.append("unfinished: the run has not ended (it runs, or it was killed)")
        if why:
            return FAIL, "; ".join(why)
        if not self.selected:
            return NOT_RUN, "no stage was selected"
        missing = [s for s in (self.row(n) for n in self.selected) if s is None or s.result != PASS]
        if missing:
            first = "; ".join(f"{s.name} ({s.detail.splitlines()[0][:100] if s.detail else s.result})"
                              for s in missing[:5] if s is not None)
            return NOT_RUN, (f"{len(missing)} of {len(self.selected)} selected stages not run: {first}"
                             + (" …" if len(missing) > 5 else ""))
        return PASS, f"all {len(self.selected)} selected stages passed, nothing left"

    @property
    def ok(self) -> bool:
        return self.verdict()[0] == PASS

    def table(self) -> str:
        w = max([len(s.name) for s in self.stages] + [5])
        rows = [f"{'stage':<{w}}  {'time':>7}  result", f"{'-' * w}  {'-' * 7}  ------"]
        for s in self.stages:
            first = s.detail.splitlines()[0][:110] if s.detail else ""
            time_s = f"{s.seconds:>6.0f}s" if s.result != NOT_RUN else f"{'-':>7}"
            rows.append(f"{s.name:<{w}}  {time_s}  {s.result}{'  ' + first if first else ''}")
        result, reason = self.verdict()
        rows.append(f"{'total':<{w}}  {time.monotonic() - self.started:>6.0f}s  {result}")
        rows.append(f"result: {result}: {reason}")
        return "\n".join(rows)

    def write(self) -> Path:
        """summary.json, replaced whole (a reader never sees half of it)."""
        path = self.out_dir / "summary.json"
        result, reason = self.verdict()
        data = {"result": result, "reason": reason, "exit_code": EXIT[result],
                "seconds": round(time.monotonic() - self.started, 1), "selected": self.selected,
                "stages": [asdict(s) for s in self.stages], **self.facts}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(path)
        return path
