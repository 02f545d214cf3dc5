"""One truth for the result of `make e2e` (issue #42, "What to build" 3): summary.json is on disk after every stage,
its `result` is `pass` only when every selected stage passed and nothing is left, else `fail` or `not run` with the
reason, and the exit code agrees (0 pass, 1 fail, 3 not run, 128 + the signal for ^C/SIGTERM/SIGHUP).

Every test drives the real runner (`e2e.runner.cli.main`: the table's walk, the record, the clean-up) with each
stage's function replaced by one that passes, fails or raises as the case needs, and the run's Session replaced by
one whose `left()` answers as kubectl would (nothing, or a namespace still there): no cluster runs here. The
stand-ins are the stage functions and kubectl's answers; the runner, the record and the exit code are the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import pytest

from e2e.runner import cleanup as cleanup_mod
from e2e.runner import cli
from e2e.runner import table as t
from e2e.support.errors import StageError
from e2e.support.record import FAIL, NOT_RUN, PASS

SETUP = [s.name for s in t.STAGES if s.group == t.SETUP]
FIRST = [s.name for s in t.STAGES if s.group == t.FIRST]


class FakeSession:
    """The run's Session as the clean-up uses it; `left()` answers what kubectl would list after the clean-up."""

    def __init__(self, left: list[str]) -> None:
        self._left, self.before, self.labels = left, {}, {}
        from e2e.support.deadline import DEADLINE

        self.deadline = DEADLINE
        self.deadline_in_cleanup: list = []

    def delete(self, objs, extra) -> list[str]:
        return []

    def left(self) -> list[str]:
        self.deadline_in_cleanup.append(self.deadline.at)
        return list(self._left)

    def cluster_objects(self) -> list:
        return []

    def close(self, release: bool) -> list[str]:  # the Lease's end (e2e/support/session.py): nothing to put back
        self.closed = release
        return []


@pytest.fixture
def drive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run `python -m e2e ARGS` in this process; returns (exit code, summary.json, printed lines)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    out = tmp_path / "out"
    values = tmp_path / "images.yaml"
    values.write_text("workers:\n  image:\n    repository: r/trainer\n    tag: x\n")
    for k, v in {"KUBECONFIG": str(tmp_path / "kubeconfig"), "E2E_VALUES": str(values),
                 "E2E_STORAGE_IMAGE": "r/fake-gcs:x", "GEMMA3_RAY_CACHE": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(k, v)
    for k in ("E2E_DEADLINE", "E2E_BUCKET", "E2E_HEAD_IMAGE", "E2E_WORKER_IMAGE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(cli, "OUT", out)
    monkeypatch.setattr(cleanup_mod, "OUT", out)
    monkeypatch.setattr(cli, "tools_missing", lambda env: "")
    printed: list[str] = []
    monkeypatch.setattr(cli, "say", printed.append)

    def run(args: list[str], fns: dict | None = None, left: list[str] | None = None) -> tuple[int, dict, list[str]]:
        def default(name: str):
            def fn(h) -> str:
                if name == "preflight":
                    h.session = FakeSession(left or [])
                return f"{name} done"
            return fn
        table = tuple(dataclasses.replace(s, fn=(fns or {}).get(s.name) or default(s.name)) for s in t.STAGES)
        monkeypatch.setattr(t, "STAGES", table)
        try:
            code = cli.main(args)
        finally:
            for s, h in saved.items():
                signal.signal(s, h)
        return code, json.loads((out / "summary.json").read_text()), printed
    return run


def _rows(summary: dict) -> dict[str, dict]:
    return {s["name"]: s for s in summary["stages"]}


def test_every_selected_stage_passed_and_nothing_left_is_pass_and_exit_0(drive) -> None:
    code, summary, _ = drive(["--only", "first"])
    assert (code, summary["result"]) == (0, PASS), summary
    assert all(_rows(summary)[n]["result"] == PASS for n in FIRST)
    assert summary["left"] == []


def test_a_failing_stage_is_fail_and_exit_1(drive) -> None:
    def fails(h) -> str:
        raise StageError("RayJob e2e-r1 ended Failed/FAILED")
    code, summary, _ = drive(["--only", "first"], {"RayJob SUCCEEDED": fails})
    assert (code, summary["result"]) == (1, FAIL)
    assert "stage 'RayJob SUCCEEDED' failed" in summary["reason"]


def test_an_error_between_stages_is_fail_and_exit_1(drive, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 1 with "result": "pass" (the rows that ran had passed). The error stands in for one of the
    runner's own between two rows (here: while it reads the precondition of `helm test`)."""
    real = t.precondition

    def precondition(spec, record, missing):
        if spec.name == "helm test":
            raise StageError("the cluster went away between stages")
        return real(spec, record, missing)
    monkeypatch.setattr(t, "precondition", precondition)
    code, summary, _ = drive(["--only", "first"])
    assert (code, summary["result"]) == (1, FAIL), summary
    assert "the cluster went away between stages" in summary["reason"]


def test_leftovers_are_fail_and_exit_1(drive) -> None:
    """Before: exit 1 with "result": "pass". kubectl's answer after the clean-up: a namespace is still there."""
    code, summary, printed = drive(["--only", "first"], left=["namespace g3r-e2e-abc"])
    assert (code, summary["result"]) == (1, FAIL)
    assert summary["left"] == ["namespace g3r-e2e-abc"] and "namespace g3r-e2e-abc" in summary["reason"]
    assert any("left on the cluster: namespace g3r-e2e-abc" in p for p in printed)


def test_a_deadline_already_past_is_not_run_and_exit_3(drive, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: E2E_DEADLINE one second in the past ran the four setup stages, left every selected stage "not run:
    time", printed "total 41s pass" and exited 0. Now the setup rows are not run either (nothing would fit)."""
    monkeypatch.setenv("E2E_DEADLINE", str(time.time() - 1))
    ran: list[str] = []

    def setup_fn(name: str):
        def fn(h) -> str:
            ran.append(name)
            return "ran"
        return fn
    code, summary, printed = drive(["--only", "first"], {n: setup_fn(n) for n in SETUP})
    assert (code, summary["result"]) == (3, NOT_RUN), summary
    assert ran == []
    rows = _rows(summary)
    assert all(rows[n]["result"] == NOT_RUN and rows[n]["detail"].startswith("time:") for n in SETUP + FIRST)
    assert summary["reason"].startswith(f"{len(FIRST)} of {len(FIRST)} selected stages not run")
    assert any(line.startswith("total") and line.rstrip().endswith("not run") for p in printed for line in
               p.splitlines()), printed
    assert summary["deadline"]["ended_past_s"] >= 0 and summary["deadline"]["cleanup_s"] >= 0


def test_the_clean_up_is_not_capped_by_the_deadline(drive, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stages stop at E2E_DEADLINE less 60 s; the clean-up after them runs to its end (no deadline in force)."""
    monkeypatch.setenv("E2E_DEADLINE", str(time.time() + 3600))
    sessions: list[FakeSession] = []

    def preflight(h) -> str:
        h.session = FakeSession([])
        sessions.append(h.session)
        return "ok"
    code, summary, _ = drive(["--only", "first"], {"preflight": preflight})
    assert code == 0 and sessions[0].deadline_in_cleanup == [None]
    assert summary["deadline"]["stages_stop"] == summary["deadline"]["E2E_DEADLINE"] - 60


def test_stages_left_out_by_the_selection_do_not_make_the_run_not_run(drive) -> None:
    """--skip helm test leaves `NOTES commands` (which needs it) not run: neither was asked for, so the run passes."""
    code, summary, _ = drive(["--only", "first", "--skip", "helm test"])
    assert (code, summary["result"]) == (0, PASS), summary
    assert _rows(summary)["NOTES commands"]["result"] == NOT_RUN
    assert "NOTES commands" not in summary["selected"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_is_fail_and_exit_128_plus_the_signal(drive, sig: int) -> None:
    def signalled(h) -> str:
        os.kill(os.getpid(), sig)
        time.sleep(5)  # the handler raises here
        return "never"
    code, summary, _ = drive(["--only", "first"], {"helm test": signalled})
    assert code == 128 + sig
    assert summary["result"] == FAIL and f"interrupted ({signal.Signals(sig).name})" in summary["reason"]
    assert _rows(summary)["NOTES commands"]["detail"] == "interrupted"


def test_an_unexpected_exception_is_fail_exit_1_and_no_traceback(drive, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the exception went out of main() (a traceback to the user) after summary.json said "pass". It stands
    in for a defect of the runner outside any stage's row."""
    def broken(spec, record, missing):
        if spec.name == "helm test":
            raise TypeError("'NoneType' object is not subscriptable")
        return ""
    monkeypatch.setattr(t, "precondition", broken)
    code, summary, printed = drive(["--only", "first"])
    assert (code, summary["result"]) == (1, FAIL)
    assert "TypeError: 'NoneType' object is not subscriptable" in summary["reason"]
    assert not any("Traceback" in p for p in printed)
    log = (Path(cli.OUT) / "e2e.log").read_text()
    assert "Traceback" in log, "the traceback is kept in the log"


def test_summary_json_is_on_disk_after_every_stage_and_says_fail_until_the_run_ends(drive) -> None:
    """A run killed now (SIGKILL, a crash of the machine) leaves a summary.json with every row so far and
    "result": "fail" (unfinished), never a missing file or a "pass" it did not see."""
    seen: dict = {}

    def peek(h) -> str:
        seen.update(json.loads((Path(cli.OUT) / "summary.json").read_text()))
        return "peeked"
    code, summary, _ = drive(["--only", "first"], {"helm test": peek})
    assert code == 0
    assert seen["result"] == FAIL and "unfinished" in seen["reason"]
    assert [s["name"] for s in seen["stages"]] == [*SETUP, "install", "RayJob SUCCEEDED"]
    assert summary["result"] == PASS


def test_an_exception_in_the_clean_up_still_writes_the_summary_and_fails(drive, monkeypatch) -> None:
    class Broken(FakeSession):
        def left(self) -> list[str]:
            raise RuntimeError("kubectl's output was not JSON")

    def preflight(h) -> str:
        h.session = Broken([])
        return "ok"
    code, summary, _ = drive(["--only", "first"], {"preflight": preflight})
    assert (code, summary["result"]) == (1, FAIL)
    assert "RuntimeError: kubectl's output was not JSON" in summary["reason"]


# ---------------------------------------------------------------------------------------------- what CI says
def _summary(result: str, rows: dict[str, tuple[str, str]], reason: str = "r") -> dict:
    return {"result": result, "reason": reason, "selected": list(rows),
            "stages": [{"name": n, "result": r, "detail": d} for n, (r, d) in rows.items()]}


def test_ci_says_plainly_when_the_deadline_left_no_time_and_does_not_fail() -> None:
    from e2e.runner.verdict import ci_line

    line, code = ci_line(_summary(NOT_RUN, {"install": (NOT_RUN, "time: about 10 s needed, 0 s left before "
                                                                 "E2E_DEADLINE")}))
    assert code == 0 and line.startswith("make e2e ran nothing: 1 not run for time before E2E_DEADLINE"), line
    line, code = ci_line(_summary(NOT_RUN, {"install": (PASS, "ok"), "helm test": (NOT_RUN, "time: about 20 s")}))
    assert code == 0 and line.startswith("make e2e ran 1 of 2 selected stages"), line


def test_ci_fails_for_a_fail_and_for_a_not_run_other_than_time() -> None:
    from e2e.runner.verdict import ci_line

    assert ci_line(_summary(FAIL, {"install": (FAIL, "x")}, "stage 'install' failed"))[1] == 1
    line, code = ci_line(_summary(NOT_RUN, {"kueue setup": (NOT_RUN, "precondition unmet: the cluster has no kueue")},
                                  "1 of 1 selected stages not run: kueue setup (precondition unmet…)"))
    assert code == 1 and "precondition unmet" in line
    assert ci_line(_summary(PASS, {"install": (PASS, "ok")}))[1] == 0


def test_ci_fails_when_make_e2e_left_no_summary(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from e2e.runner.verdict import main

    assert main([str(tmp_path / "summary.json")]) == 1
    assert "left no readable" in capsys.readouterr().out
