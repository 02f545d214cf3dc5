"""Files the trainer reads back (manifest, trainer state, run definition, summary, Ray's snapshot), checked whole before use."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# A check: (value, where in the file) -> why it is not what the trainer wrote, or None.
Check = Callable[[Any, str], "str | None"]


class Unusable(ValueError):
    """A stored file that is torn or is not what the trainer wrote; the message names the file and what is wrong."""


def parse(raw: bytes, name: str, check: Check) -> Any:
    """The JSON in `raw` (the file `name`) if it passes `check` as a whole; Unusable otherwise."""
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise Unusable(f"{name}: not valid JSON (torn or overwritten: {e})") from e
    problem = check(value, "")
    if problem:
        raise Unusable(f"{name}: {problem}")
    return value


def _at(where: str) -> str:
    return f"{where}: " if where else ""


def is_a(kind: type, what: str) -> Check:
    """A JSON value of Python type `kind` (int never matches a bool; float matches an int too)."""
    kinds = (int, float) if kind is float else (kind,)

    def check(value: Any, where: str) -> str | None:
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and kind is not bool)
        return None if ok else f"{_at(where)}{json.dumps(value)[:60]} is not {what}"

    return check


def where(test: Callable[[Any], bool], what: str, kind: Check | None = None) -> Check:
    """A value that passes `kind` (when given) and `test`; `what` says what it must be."""

    def check(value: Any, at: str) -> str | None:
        problem = kind(value, at) if kind else None
        if problem:
            return problem
        return None if test(value) else f"{_at(at)}{json.dumps(value)[:60]} is not {what}"

    return check


def fields(required: dict[str, Check], optional: dict[str, Check] | None = None) -> Check:
    """A JSON object with every `required` key (and, when present, the `optional` ones) as their checks say."""

    def check(value: Any, where_: str) -> str | None:
        if not isinstance(value, dict):
            return f"{_at(where_)}not a JSON object"
        for key, sub in {**required, **(optional or {})}.items():
            if key not in value:
                if key in required:
                    return f"{_at(where_)}no {key!r}"
                continue
            problem = sub(value[key], f"{where_}.{key}" if where_ else key)
            if problem:
                return problem
        return None

    return check


def each(item: Check) -> Check:
    """A JSON list whose every item passes `item`."""

    def check(value: Any, where_: str) -> str | None:
        if not isinstance(value, list):
            return f"{_at(where_)}not a JSON list"
        return next((p for i, v in enumerate(value) if (p := item(v, f"{where_}[{i}]"))), None)

    return check


def mapping(key: Check, item: Check) -> Check:
    """A JSON object whose every key passes `key` and every value passes `item`."""

    def check(value: Any, where_: str) -> str | None:
        if not isinstance(value, dict):
            return f"{_at(where_)}not a JSON object"
        for k, v in value.items():
            problem = key(k, f"{where_} key" if where_ else "key") or item(v, f"{where_}[{k!r}]")
            if problem:
                return problem
        return None

    return check


def both(*checks: Check) -> Check:
    """Every one of `checks`, in order."""
    return lambda value, at: next((p for c in checks if (p := c(value, at))), None)


ANY: Check = lambda value, at: None  # noqa: E731 - a check that accepts anything
COUNT = where(lambda v: v >= 0, "a count (an integer >= 0)", is_a(int, "an integer"))
TEXT = is_a(str, "a string")
FLAG = is_a(bool, "true or false")


def read(files: Any, name: str, check: Check) -> tuple[Any, str | None]:
    """(the checked content of the file `name` of `files` (a Storage), or None; why it is unusable, or None)."""
    raw = files.read_bytes(name)
    if raw is None:
        return None, None
    try:
        return parse(raw, name, check), None
    except Unusable as e:
        return None, str(e)
