"""A `doctor` check's result, and the guard that turns a user-facing error into a failed check.

A `doctor` check's result (passed, failed, or a warning that passes) and the guard that turns a
user-facing error into a failed check."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gemma3_ray.utils.errors import UserError


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str  # what was found, or how to fix it

    def line(self) -> str:
        return f"[{'ok' if self.ok else 'FAIL'}] {self.name}: {self.detail}"


@dataclass(frozen=True)
class Warn(Check):
    """Passes (does not fail doctor) but is shown as a warning."""

    def line(self) -> str:
        return f"[warn] {self.name}: {self.detail}"


def guard(name: str, fn: Callable[[], Check]) -> Check:
    """``fn()``; a :class:`UserError` it raises is the failed check ``name`` with that sentence."""
    try:
        return fn()
    except UserError as exc:
        return Check(name, False, str(exc))
