"""A plan: the changes a command would make, what is already in place, and what it could not check.

Also the one epilogue of a plan that changed nothing (``dry_run``, ``offline``): every command that
plans by default ends its plan with one of these lines.
"""

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


def dry_run(planned: int | None = None, *, what: str = "change", why: str = "", apply: str = "",
            verb: str = "Apply", note: str = "", alternative: str = "") -> str:
    """The last line of a plan that changed nothing: ``Dry run: nothing changed (N change(s) planned). Apply
    with `COMMAND` (same flags).`` — ``why`` instead of the count, ``verb`` for another word than Apply,
    ``note`` inside the parentheses after "same flags", ``alternative`` another way to apply."""
    reason = f"{planned} {what}(s) planned" if planned is not None else why
    line = "Dry run: nothing changed" + (f" ({reason})" if reason else "") + "."
    if apply:
        line += f" {verb} with `{apply}` (same flags{'; ' + note if note else ''})"
        line += f" or {alternative}." if alternative else "."
    return line


def offline() -> str:
    """The last line of a plan made without Google credentials (nothing was read, nothing changed)."""
    return "Dry run: nothing checked or changed (no Google credentials: `gcloud auth application-default login`)."
