"""The stage table of `make e2e` (issue #31 (1)): one row per stage, --only/--skip checked against it, every stage a
row in the summary (pass, fail, or not run with the reason), preconditions that stop a stage from passing while its
claim is false, and the chart README's table equal to the one generated from it."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

from e2e.runner import table as t
from e2e.support.errors import NotRun, StageError
from e2e.support.harness import Harness, Images
from e2e.support.record import FAIL, NOT_RUN, PASS, Record

ROOT = Path(__file__).resolve().parents[2]
CHART_README = ROOT / "charts" / "gemma3-ray" / "README.md"


def _record(tmp_path: Path) -> Record:
    return Record(tmp_path, say=lambda _m: None)


class FakeHarness:
    """What the runner reads of a Harness (its preflight's findings); the stage functions here record their calls."""

    def __init__(self, missing: dict[str, str] | None = None) -> None:
        self.missing = missing or {}
        self.called: list[str] = []


def _table(fail: str = "") -> tuple[t.StageSpec, ...]:
    """The real table with each stage's function replaced by one that records it ran (and fails for `fail`)."""
    def fn_for(name: str):
        def fn(h: FakeHarness) -> str:
            h.called.append(name)
            if name == fail:
                raise StageError(f"{name}: its claim is false here")
            return f"{name} done"
        return fn
    return tuple(dataclasses.replace(s, fn=fn_for(s.name)) for s in t.STAGES)


def _run(tmp_path: Path, only: str = "", skip: str = "", fail: str = "", missing=None, deadline=None, clock=None):
    rec, h = _record(tmp_path), FakeHarness(missing)
    table = _table(fail)
    with contextlib.suppress(StageError):
        t.run(h, rec, t.select(only, skip, table), deadline=deadline, table=table,
              **({"clock": clock} if clock else {}))
    t.finish(rec, t.stop_reason(rec, False), table, reasons=t.select(only, skip, table))
    rec.ended = True  # the clean-up's part (e2e/runner/cleanup.py): the run has ended, nothing left
    return rec, h


# ---------------------------------------------------------------------------------------------- the table
def test_every_stage_has_one_row_a_known_group_a_claim_and_a_function() -> None:
    names = [s.name for s in t.STAGES]
    assert len(names) == len(set(names)), "stage names are unique"
    assert not [n for n in names if "," in n], "--only/--skip split names at commas"
    for s in t.STAGES:
        assert s.group in t.GROUPS, s
        assert s.claim.endswith(".") and len(s.claim) > 20, s  # a sentence the README can cite
        assert callable(s.fn), s  # the setup rows too: the runner only walks the table
        assert s.typical_s > 0, s


def test_every_stage_function_exists() -> None:
    """A row pointing at a missing function would fail only on the real cluster, an hour in."""
    for s in t.STAGES:
        module, name = s.fn.__qualname__.split(".")
        assert callable(getattr(importlib.import_module(f"e2e.stages.{module}"), name, None)), s.name


def test_a_stage_needs_only_stages_before_it() -> None:
    seen: set[str] = set()
    for s in t.STAGES:
        assert set(s.needs) <= seen, f"{s.name} needs {set(s.needs) - seen}, which do not run before it"
        seen.add(s.name)


# ---------------------------------------------------------------------------------------------- --only / --skip
@pytest.mark.parametrize(("only", "skip", "bad"), [("first,ct,dya2", "", "'dya2'"), ("", "upgrad", "'upgrad'"),
                                                   ("", "upgrade,rolback", "'rolback'")])
def test_an_unknown_name_is_refused_in_one_sentence_listing_the_valid_ones(only: str, skip: str, bad: str) -> None:
    """Before: a --skip typo ran everything."""
    with pytest.raises(t.SelectionError) as e:
        t.select(only, skip)
    msg = str(e.value)
    assert bad in msg and "\n" not in msg
    assert "groups: first, ct, day2" in msg
    for s in t.STAGES:
        if s.group != t.SETUP:
            assert s.name in msg


def test_day2_alone_is_refused_naming_the_group_it_needs() -> None:
    with pytest.raises(t.SelectionError, match=r"add first \(for example --only first,day2\)"):
        t.select("day2", "")


def test_groups_and_stage_names_both_select() -> None:
    reasons = t.select("first,upgrade", "")
    assert reasons["upgrade"] == "" and reasons["install"] == ""
    assert reasons["rollback"].startswith("not selected")
    assert reasons["ct lint"].startswith("not selected")



EVERY_GROUP = ",".join(g for g in t.GROUPS if g != t.SETUP)  # every stage of the table selected
# ---------------------------------------------------------------------------------------------- rows
def test_every_stage_gets_a_row_in_table_order(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, only=EVERY_GROUP)
    assert [s.name for s in rec.stages] == [s.name for s in t.STAGES]
    assert all(s.result == PASS for s in rec.stages), rec.table()
    assert rec.ok
    assert all(s.claim for s in rec.stages), "every row carries its claim into summary.json"


def test_stages_left_out_get_a_row_with_the_reason(tmp_path: Path) -> None:
    """Before: skipped stages left no row."""
    rec, h = _run(tmp_path, only="first,day2", skip="elastic")
    assert rec.row("elastic").result == NOT_RUN and rec.row("elastic").detail == "skipped (--skip)"
    assert rec.row("ct install").result == NOT_RUN and rec.row("ct install").detail.startswith("not selected")
    assert "elastic" not in h.called and "ct install" not in h.called
    assert rec.ok, "leaving stages out is not a failure"


def test_skipping_the_upgrade_does_not_let_rollback_pass(tmp_path: Path) -> None:
    """Before: `--skip upgrade` made rollback pass without rolling anything back."""
    rec, h = _run(tmp_path, only="first,day2", skip="upgrade")
    row = rec.row("rollback")
    assert row.result == NOT_RUN
    assert row.detail.startswith("precondition unmet: needs stage 'upgrade' to pass (not run: skipped (--skip))")
    assert "rollback" not in h.called


def test_a_failure_stops_the_run_and_the_rest_are_not_run(tmp_path: Path) -> None:
    rec, h = _run(tmp_path, only=EVERY_GROUP, fail="helm test")
    assert rec.row("helm test").result == FAIL
    names = [s.name for s in t.STAGES]
    for later in names[names.index("helm test") + 1:]:
        assert rec.row(later).result == NOT_RUN and rec.row(later).detail == "stopped: stage 'helm test' failed"
        assert later not in h.called
    assert not rec.ok
    assert len(rec.stages) == len(t.STAGES)


def test_what_the_cluster_lacks_makes_its_stages_not_run_with_why(tmp_path: Path) -> None:
    rec, h = _run(tmp_path, only="first,day2,fleet,shared", missing={"kueue": "Kueue's CRDs are not served"})
    for s in t.STAGES:
        if "kueue" in s.requires:
            assert rec.row(s.name).result == NOT_RUN, s.name
            assert "the cluster has no kueue (Kueue's CRDs are not served)" in rec.row(s.name).detail
    assert rec.row("elastic").result == PASS
    result, why = rec.verdict()  # day2 asked for the Kueue stages: the run proved less than it was asked to
    assert result == NOT_RUN and "kueue setup (precondition unmet: the cluster has no kueue" in why, why


def test_stages_that_do_not_fit_before_the_deadline_are_not_run_time(tmp_path: Path) -> None:
    now = [1000.0]

    def clock() -> float:
        now[0] += 1
        return now[0]
    rec, h = _run(tmp_path, only="first,ct", deadline=1100.0, clock=clock)
    timed = [s for s in rec.stages if s.detail.startswith("time:")]
    assert timed, rec.table()
    assert rec.row("install").result == PASS  # 10 s fits
    assert rec.row("RayJob SUCCEEDED").result == NOT_RUN  # 120 s does not
    assert "s left before E2E_DEADLINE" in rec.row("RayJob SUCCEEDED").detail
    # what reads the job's own output is not run without it (2026-12-05, E2E_DEADLINE 300 s ahead: `NOTES commands`
    # ran after `RayJob SUCCEEDED` was left out for time, and failed on `logs -f job/…`: the submitter not made yet)
    for later in ("NOTES commands", "outputs in the bucket", "gemma3-ray status/logs"):
        assert rec.row(later).result == NOT_RUN and rec.row(later).result != "fail", later
        assert later not in h.called, later


def test_the_setup_rows_are_walked_first(tmp_path: Path) -> None:
    """The runner only walks the table: the four setup rows run through it, first."""
    rec, h = _run(tmp_path, only="first")
    setup = [s.name for s in t.STAGES if s.group == t.SETUP]
    assert h.called[:4] == setup and [s.name for s in rec.stages][:4] == setup
    assert all(rec.row(n).result == PASS and rec.row(n).claim for n in setup)


def test_a_deadline_already_past_gates_the_setup_rows_too(tmp_path: Path) -> None:
    """Before (issue #42): E2E_DEADLINE gated only the stages after the setup rows, so a deadline already past
    still started the cluster, built the images and uploaded the inputs for nothing."""
    rec, h = _run(tmp_path, only="first", deadline=0.0, clock=lambda: 1000.0)
    assert h.called == []
    asked = [s for s in rec.stages if s.group in (t.SETUP, t.FIRST)]
    assert all(s.result == NOT_RUN and s.detail.startswith("time:") for s in asked), rec.table()
    assert "no selected stage fits" in rec.row("cluster start").detail


def test_setup_runs_when_a_selected_stage_still_fits(tmp_path: Path) -> None:
    """The setup rows are left out only when no selected stage would fit after them (a cached image build takes
    seconds: its typical 900 s does not gate it)."""
    rec, h = _run(tmp_path, only="first", deadline=1000.0 + t.CLEANUP_RESERVE_S + 15, clock=lambda: 1000.0)
    assert h.called == [*(s.name for s in t.STAGES if s.group == t.SETUP), "install"], rec.table()


def test_a_stage_that_does_not_apply_gets_a_not_run_row_and_the_run_goes_on(tmp_path: Path) -> None:
    def fn(h: FakeHarness) -> str:
        h.called.append("cluster start")
        raise NotRun("KUBECONFIG is set: its cluster is used")
    table = tuple(dataclasses.replace(s, fn=fn) if s.name == "cluster start" else s for s in _table())
    rec, h = _record(tmp_path), FakeHarness()
    t.run(h, rec, t.select("first", "", table), table=table)
    row = rec.row("cluster start")
    assert (row.result, row.detail, row.seconds) == (NOT_RUN, "KUBECONFIG is set: its cluster is used", 0.0)
    rec.ended = True
    assert rec.row("install").result == PASS and rec.ok, "a setup row not run is not a stage the run was asked for"


def test_with_kubeconfig_the_setup_functions_take_that_cluster_and_their_rows_say_not_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real setup functions of e2e/stages/setup.py (nothing here touches a cluster): cluster start takes the
    cluster KUBECONFIG names into the Harness; images is not run, the values name them."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    rec = _record(tmp_path)
    h = Harness(None, rec, None, Images(), tmp_path)
    setup_rows = tuple(s for s in t.STAGES if s.name in ("cluster start", "images"))
    t.run(h, rec, {}, table=setup_rows)
    assert [(s.name, s.result) for s in rec.stages] == [("cluster start", NOT_RUN), ("images", NOT_RUN)]
    assert rec.row("cluster start").detail == "KUBECONFIG is set: its cluster is used"
    assert h.kube.kubeconfig == tmp_path / "kubeconfig" and h.kube.log_path == tmp_path / "e2e.log"


def test_a_bad_deadline_is_one_sentence() -> None:
    with pytest.raises(StageError, match="E2E_DEADLINE='soon': give a Unix time"):
        t.deadline_from_env("soon")


def test_a_stage_cannot_run_twice(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    with rec.stage("install"):
        pass
    with pytest.raises(StageError, match="ran twice"), rec.stage("install"):
        pass


def test_an_interrupt_leaves_rows_saying_so(tmp_path: Path) -> None:
    rec = _record(tmp_path)
    with pytest.raises(KeyboardInterrupt), rec.stage("cluster start"):
        raise KeyboardInterrupt
    t.finish(rec, t.stop_reason(rec, True))
    assert rec.row("cluster start").result == FAIL
    assert rec.row("install").detail == "interrupted"
    assert not rec.ok


def test_summary_json_has_every_row_with_its_claim(tmp_path: Path) -> None:
    import json

    rec, _ = _run(tmp_path, only="first", skip="helm test")
    rec.facts["versions"] = {"kubelet": "v1.32.9"}
    data = json.loads(rec.write().read_text())
    assert [s["name"] for s in data["stages"]] == [s.name for s in t.STAGES]
    assert {s["result"] for s in data["stages"]} == {PASS, NOT_RUN}
    by = {s["name"]: s for s in data["stages"]}
    assert by["NOTES commands"]["detail"].startswith("precondition unmet: needs stage 'helm test'")
    assert by["upgrade"]["claim"] and by["upgrade"]["group"] == "day2"
    assert data["versions"] == {"kubelet": "v1.32.9"}


# ---------------------------------------------------------------------------------------------- the chart README
def test_the_chart_readme_cites_the_table_as_generated() -> None:
    """The README's lifecycle table of `make e2e` is the one generated from STAGES (`python -m e2e.runner.table`)."""
    text = CHART_README.read_text()
    m = re.search(r"<!-- e2e stage table: python -m e2e.runner.table -->\n(.*?)\n<!-- end of e2e stage table -->",
                  text, re.S)
    assert m, "charts/gemma3-ray/README.md lacks the generated e2e stage table"
    assert m.group(1) == t.lifecycle_table()


def test_the_readme_names_only_stages_that_exist() -> None:
    names = {s.name for s in t.STAGES}
    for readme in (CHART_README, ROOT / "e2e" / "README.md"):
        cited = set(re.findall(r"stages? `([^`]+)`", readme.read_text()))
        assert cited <= names, (readme, cited - names)


def test_a_notes_line_left_to_a_stage_that_did_not_pass_is_not_run(tmp_path: Path) -> None:
    """Before: lines of other tools were 'proved by other stages' whether or not those stages ran."""
    rec, _ = _run(tmp_path, only="first,day2", skip="rollback")
    rec.facts["notes_commands"] = [{"command": "helm upgrade e2e <chart> …", "stage": "upgrade"},
                                   {"command": "helm rollback e2e <revision> …", "stage": "rollback"},
                                   {"command": "kubectl -n ns delete pod x --ignore-not-found", "result": "ran"}]
    rec.notes_line_ran("upgrade")
    t.settle_notes(rec)
    up, back, plain = rec.facts["notes_commands"]
    assert up["result"] == "ran (stage 'upgrade' passed)"
    assert back["result"] == "not run" and back["why"] == "stage 'rollback' not run: skipped (--skip)"
    assert plain["result"] == "ran"


def test_a_notes_line_its_stage_passed_without_running_is_not_run(tmp_path: Path) -> None:
    """Before (issue #42): `kubectl wait --for=delete` was "ran" whenever `upgrade + rollback at once` passed, though
    that stage runs it only when Helm refuses the immediate rollback."""
    rec, _ = _run(tmp_path, only="first,day2")
    rec.facts["notes_commands"] = [{"command": "kubectl -n ns wait --for=delete rayjob/<its-name> --timeout=300s",
                                    "stage": "upgrade + rollback at once"}]
    t.settle_notes(rec)
    entry = rec.facts["notes_commands"][0]
    assert entry["result"] == "not run", entry
    assert entry["why"].startswith("stage 'upgrade + rollback at once' passed without running it")


def test_after_a_failure_left_out_stages_keep_their_own_reason(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, only="first", skip="gemma3-ray status/logs", fail="install")
    assert rec.row("RayJob SUCCEEDED").detail == "stopped: stage 'install' failed"
    assert rec.row("gemma3-ray status/logs").detail == "skipped (--skip)"
    assert rec.row("upgrade").detail.startswith("not selected")
