"""A plan: the changes a command would make, what is already in place, and what it could not check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

NOT_CHECKED = "not checked (not logged in)"


@dataclass
class Action:
    """One change the plan makes; ``run`` is idempotent (safe after a concurrent run did it)."""

    text: str
    run: Callable[[], None]


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    in_place: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)  # not checked: not logged in to Google
    unread: list[tuple[str, str]] = field(default_factory=list)  # (what, why it was not checked)

    def lines(self) -> list[str]:
        return ([f"  + {a.text}" for a in self.actions] + [f"  = {t}" for t in self.in_place]
                + [f"  ? {t}: {NOT_CHECKED}" for t in self.unchecked]
                + [f"  ? {t}: not checked ({why})" for t, why in self.unread])
