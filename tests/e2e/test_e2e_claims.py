"""The day-two claims of `make e2e` fail when false (issue #31 (2)): a lost worker or head must show a restore from a
checkpoint, a lost head a failed attempt and a new cluster, and rollback refuses to pass without a later revision to
roll back from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from e2e.stages import day_two
from e2e.support.errors import StageError
from e2e.support.harness import Run

MAX = 12


@pytest.mark.parametrize(("resumed", "ok"), [(4, True), (8, True), (None, False), (0, False), (12, False),
                                             (False, False), ("4", False)])
def test_a_restore_must_be_mid_run(resumed: object, ok: bool) -> None:
    """Before: a lost worker whose run never restored was only noted."""
    assert (day_two.resumed_problem({"resumed_from_step": resumed}, MAX) == "") is ok


def test_a_lost_head_needs_a_failed_attempt_a_new_cluster_and_a_restore() -> None:
    """Before: the failed attempt, the new cluster and the resumed step were recorded, not asserted."""
    good = day_two.lost_head_problem({"failed": 1}, "c-1", "c-2", {"resumed_from_step": 8}, MAX)
    assert good == ""
    assert "status.failed=0" in day_two.lost_head_problem({"failed": 0}, "c-1", "c-2", {"resumed_from_step": 8}, MAX)
    assert "want a new one" in day_two.lost_head_problem({"failed": 1}, "c-1", "c-1", {"resumed_from_step": 8}, MAX)
    assert "resumed_from_step=None" in day_two.lost_head_problem({"failed": 1}, "c-1", "c-2", {}, MAX)


def test_rollback_refuses_without_a_revision_to_roll_back_from() -> None:
    """Before: with the upgrade skipped, `helm rollback <r> 1` re-applied the live revision and the stage passed."""
    first = Run("ns", "e2e", "e2e-r1", "r1-x", "gs://b/p", {"max_steps": "12"})
    ran: list[str] = []
    h = SimpleNamespace(runs={"first": first}, current_run=lambda *_: first,
                        kube=SimpleNamespace(run=lambda argv, **_: ran.append(argv), h=lambda *a, **_: ran.append(a)))
    with pytest.raises(StageError, match="nothing to roll back from"):
        day_two.rollback(h)
    assert not ran, "no helm command ran"
