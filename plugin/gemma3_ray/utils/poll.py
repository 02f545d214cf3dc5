"""The one poller: read something until it is done, saying when its state changes.

The one poller: read something until it is done (a Container API operation, a cluster's state, a
Cloud Build build, a RayJob), printing a line when its state changes and at least once a minute.

The loop is google.api_core's ``retry_target``: "not done yet" is the retryable outcome, the deadline
is its timeout, and any other error (already one sentence) ends the wait at once.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from google.api_core.exceptions import RetryError
from google.api_core.retry import retry_target

from gemma3_ray.utils.errors import UserError

T = TypeVar("T")
PROGRESS_EVERY_S = 60.0


class _Pending(Exception, Generic[T]):
    """What was read is not done yet: read again after the interval."""


def until(read: Callable[[], T], done: Callable[[T], bool], *, interval: float, timeout: float | None,
          describe: Callable[[T], str] | None = None, out: Callable[[str], None] | None = None,
          on_timeout: Callable[[float], UserError] | None = None, first: T | None = None,
          progress_every: float = PROGRESS_EVERY_S) -> T:
    """``read()`` every ``interval`` seconds until ``done`` says so; returns the last value read.

    ``first`` is a value already in hand (the operation a create call returned): it is looked at
    before the first read. ``describe``/``out`` print ``describe(value) [N s]`` on each change and
    every ``progress_every`` seconds. Past ``timeout`` (None: no limit), ``on_timeout(elapsed)`` is raised.
    """
    start = time.monotonic()
    shown: list[tuple[str, float]] = []
    pending = [first] if first is not None else []

    def attempt() -> T:
        value = pending.pop() if pending else read()
        now = time.monotonic()
        if describe and out:
            text = describe(value)
            if not shown or shown[-1][0] != text or now - shown[-1][1] >= progress_every:
                out(f"{text} [{now - start:.0f} s]")
                shown.append((text, now))
        if done(value):
            return value
        raise _Pending()

    try:
        return retry_target(attempt, lambda exc: isinstance(exc, _Pending), itertools.repeat(interval), timeout)
    except RetryError:
        if on_timeout is None:
            raise UserError(f"Still not done after {time.monotonic() - start:.0f} s: run the command again.") from None
        raise on_timeout(time.monotonic() - start) from None
