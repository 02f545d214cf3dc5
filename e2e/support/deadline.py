"""E2E_DEADLINE inside the stages: every wait and command of a stage is capped to the time left.

The runner sets `DEADLINE.at` to E2E_DEADLINE less CLEANUP_RESERVE_S (the clean-up's room) while the stages run
and clears it before the clean-up, which is never cut. `DEADLINE.cap(asked, what)` is what each wait and command
asks for its timeout (kube.Kube.run, wait_for, wait_rayjob, harness.run_script): min(asked, time left), or
OutOfTime when none is left. A wait cut short by the cap raises OutOfTime (`DEADLINE.expired`), not a failure:
its row says "not run: time", and the rows after it too. So the stages' work ends by E2E_DEADLINE - 60 s, and the
run by then plus the clean-up (recorded in summary.json as `deadline.ended_past_s`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from e2e.support.errors import StageError

CLEANUP_RESERVE_S = 60.0  # kept for the clean-up: uninstall, namespaces, the local cluster's stop


class OutOfTime(StageError):
    """E2E_DEADLINE (less the clean-up's room) came while a stage waited: its row is "not run: time"."""


@dataclass
class Deadline:
    at: float | None = None  # a Unix time: when the stages' work stops; None: no deadline (or the clean-up runs)
    clock: Callable[[], float] = field(default=time.time)

    def left(self) -> float | None:
        return None if self.at is None else self.at - self.clock()

    def cap(self, asked: float, what: str) -> float:
        """The timeout to use for a wait or command that asks for `asked` seconds: never past the deadline."""
        left = self.left()
        if left is None:
            return asked
        if left <= 0:
            raise OutOfTime(f"{what}: no time left before E2E_DEADLINE (less {CLEANUP_RESERVE_S:.0f} s for the "
                            "clean-up)")
        return min(asked, left)

    def expired(self, what: str, used: float, asked: float) -> StageError | None:
        """The error for a wait that ran out after `used` of its `asked` seconds: OutOfTime when the deadline cut
        it (used < asked), else None (its own timeout: the caller's failure)."""
        if used < asked:
            return OutOfTime(f"{what}: stopped after {used:.0f} s of its {asked:.0f} s at E2E_DEADLINE (less "
                             f"{CLEANUP_RESERVE_S:.0f} s for the clean-up)")
        return None

    @contextmanager
    def until(self, at: float | None) -> Iterator[Deadline]:
        """The deadline in force for the block (the stages), and none after it (the clean-up)."""
        old, self.at = self.at, at
        try:
            yield self
        finally:
            self.at = old


DEADLINE = Deadline()  # the run's: one per process, as E2E_DEADLINE is
