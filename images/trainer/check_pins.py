"""Check that this Python has exactly the versions a requirements file pins (build-time and test check)."""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==(?P<version>[^\s;#]+)")


def pins(text: str) -> dict[str, str]:
    """``name -> version`` of every ``name[extras]==version`` line; any other requirement is an error."""
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        if not m:
            raise ValueError(f"line {number}: {line!r} is not an exact pin (name==version)")
        out[m["name"]] = m["version"]
    return out


def mismatches(wanted: dict[str, str], ignore: set[str] = frozenset()) -> list[str]:
    """One sentence per package whose installed version differs from its pin."""
    problems = []
    for name, want in sorted(wanted.items()):
        if name.lower() in ignore:
            continue
        try:
            have = version(name)
        except PackageNotFoundError:
            problems.append(f"{name}: pinned {want}, not installed")
            continue
        # A local version label (+cu130, +cpu) is the same release.
        if have.split("+", 1)[0] != want.split("+", 1)[0]:
            problems.append(f"{name}: pinned {want}, installed {have}")
    return problems


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: check_pins.py REQUIREMENTS [--ignore NAME ...]")
        return 0 if argv else 2
    path, rest = Path(argv[0]), argv[1:]
    ignore = {n.lower() for n in rest[rest.index("--ignore") + 1 :]} if "--ignore" in rest else set()
    try:
        problems = mismatches(pins(path.read_text()), ignore)
    except ValueError as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 2
    for p in problems:
        print(f"{path}: {p}", file=sys.stderr)
    if not problems:
        print(f"{path}: every pin is installed at its version")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
