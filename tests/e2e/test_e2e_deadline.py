"""E2E_DEADLINE stops a run (issue #42, "What to build" 4): every wait and command of a stage is capped to the time
left (support/deadline.py), a stage the cap stops is "not run: time" with every row after it, and the clean-up is
never capped. Before: the deadline was read only when a stage started, and a stage ran on to its own 900-1500 s.

The waits here are the real Kube.run / wait_for / wait_rayjob and harness.run_script; kubectl's answers are replaced
where one is needed (a probe that never comes true, a RayJob that stays RUNNING), and `sleep` stands in for a
command that outlives the deadline. No test asserts how fast anything is: only which error and which rows."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import pytest

from e2e.runner import table as t
from e2e.support.deadline import CLEANUP_RESERVE_S, DEADLINE, Deadline, OutOfTime
from e2e.support.errors import StageError
from e2e.support.harness import run_script
from e2e.support.kube import Kube
from e2e.support.record import FAIL, NOT_RUN, PASS, Record


def test_cap_is_the_smaller_of_what_is_asked_and_what_is_left() -> None:
    now = [1000.0]
    d = Deadline(None, clock=lambda: now[0])
    assert d.cap(900, "x") == 900  # no deadline
    d.at = 1100.0
    assert d.cap(900, "x") == 100 and d.cap(30, "x") == 30
    now[0] = 1100.0
    with pytest.raises(OutOfTime, match="x: no time left before E2E_DEADLINE"):
        d.cap(30, "x")
    assert d.expired("w", 100, 900) is not None and d.expired("w", 30, 30) is None


def test_until_sets_the_deadline_for_the_block_only() -> None:
    d = Deadline()
    with d.until(5.0):
        assert d.at == 5.0
    assert d.at is None


@pytest.fixture
def kube(tmp_path: Path) -> Kube:
    return Kube(tmp_path / "kubeconfig", tmp_path / "log", kubectl="kubectl")


def test_a_command_is_stopped_at_the_deadline_as_out_of_time(kube: Kube) -> None:
    with DEADLINE.until(time.time() + 0.5), pytest.raises(OutOfTime, match="stopped after 0 s of its 300 s"):
        kube.run(["sleep", "30"], timeout=300, what="a long helm")


def test_a_command_past_its_own_timeout_is_still_a_failure(kube: Kube) -> None:
    with DEADLINE.until(time.time() + 600), pytest.raises(StageError) as e:
        kube.run(["sleep", "30"], timeout=0.3, what="a short helm")
    assert not isinstance(e.value, OutOfTime) and "did not finish in 0 s" in str(e.value)


def test_a_wait_is_stopped_at_the_deadline(kube: Kube) -> None:
    with DEADLINE.until(time.time() + 0.3), pytest.raises(OutOfTime, match="pods Ready: stopped after"):
        kube.wait_for("pods Ready", lambda: False, 900, interval=0.05)


def test_no_time_left_refuses_before_the_command_starts(kube: Kube, tmp_path: Path) -> None:
    with DEADLINE.until(time.time() - 1), pytest.raises(OutOfTime, match="no time left"):
        kube.run(["touch", str(tmp_path / "ran")], timeout=60)
    assert not (tmp_path / "ran").exists()


def test_a_rayjob_wait_is_stopped_at_the_deadline(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl's answer replaced: the RayJob stays Running (a 900 s wait, before, ran on past the deadline)."""
    monkeypatch.setattr(Kube, "get", lambda self, kind, name, ns: {"status": {"jobDeploymentStatus": "Running",
                                                                             "jobStatus": "RUNNING"}})
    monkeypatch.setattr(time, "sleep", lambda s: None)
    with DEADLINE.until(time.time() + 0.3), pytest.raises(OutOfTime, match="RayJob ns/r1 still Running/RUNNING"):
        kube.wait_rayjob("ns", "r1", 900)


def test_a_script_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    with DEADLINE.until(time.time() + 0.5), pytest.raises(OutOfTime, match="image build"):
        run_script(["sleep", "30"], tmp_path / "log", 3600, "image build")


def test_a_stage_the_deadline_stops_is_not_run_time_and_so_is_every_row_after_it(tmp_path: Path) -> None:
    """The table's walk: the stage waits through the real Kube.wait_for, capped; its row is not a failure."""
    kube = Kube(tmp_path / "kubeconfig", tmp_path / "log")

    def waits(h) -> str:
        kube.wait_for("RayJob SUCCEEDED", lambda: False, 900, interval=0.05)
        return "never"

    def fn(h) -> str:
        return "ok"
    table = tuple(dataclasses.replace(s, fn=waits if s.name == "RayJob SUCCEEDED" else fn, typical_s=1)
                  for s in t.STAGES)
    rec = Record(tmp_path, say=lambda m: None)
    with contextlib.suppress(StageError):
        t.run(object(), rec, t.select("first", "", table), deadline=time.time() + CLEANUP_RESERVE_S + 2, table=table)
    row = rec.row("RayJob SUCCEEDED")
    assert row.result == NOT_RUN and row.detail.startswith("time: RayJob SUCCEEDED: stopped after"), row
    later = [s.name for s in t.STAGES if s.group == t.FIRST][2:]
    assert all(rec.row(n).result == NOT_RUN and "E2E_DEADLINE came during 'RayJob SUCCEEDED'" in rec.row(n).detail
               for n in later), rec.table()
    assert rec.row("install").result == PASS and not rec.failed and FAIL not in {s.result for s in rec.stages}
    assert DEADLINE.at is None, "the clean-up after the walk is never capped"


def test_a_scripts_output_is_in_the_log_as_it_comes_and_stays_after_a_timeout(tmp_path: Path) -> None:
    """Before: the script's output was written to the log only after it ended; a timeout or ^C lost all of it."""
    log = tmp_path / "log"
    script = "echo building part one; echo 'a warning' >&2; sleep 30"
    with pytest.raises(StageError, match="did not finish"):
        run_script(["bash", "-c", script], log, 1.5, "image build")
    text = log.read_text()
    assert "building part one" in text and "a warning" in text
    # a script that ends: its stdout back whole, both streams in the log once
    assert run_script(["bash", "-c", "echo out1; echo err1 >&2; echo out2"], log, 30, "x") == "out1\nout2\n"
    lines = log.read_text().splitlines()
    assert lines.count("out1") == 1 and lines.count("err1") == 1 and lines.count("out2") == 1
