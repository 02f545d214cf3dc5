"""Plan by default, act with ``--apply``: the flag every command that changes something shares.

The one convention of every command that changes something: it plans by default (read calls only,
nothing changed) and acts with ``--apply``; ``--dry-run``, where a command had it, is still accepted
and changes nothing (planning is the default)."""

from __future__ import annotations

import argparse

from gemma3_ray.utils.errors import EXIT_USAGE, UserError


class ConflictingFlags(UserError):
    exit_code = EXIT_USAGE


def add(p: argparse.ArgumentParser, acts: str, *, dry_run_alias: bool = False) -> None:
    """``--apply`` (``acts``: what it does), and the accepted no-op ``--dry-run`` where it existed."""
    p.add_argument("--apply", action="store_true", help=f"{acts} (default: print the plan only, change nothing)")
    if dry_run_alias:
        p.add_argument("--dry-run", action="store_true",
                       help="accepted for compatibility and changes nothing: planning is the default, --apply acts")


def applying(args: argparse.Namespace, command: str) -> bool:
    """Whether this run acts; ``--apply`` with ``--dry-run`` is refused (they contradict each other)."""
    if args.apply and getattr(args, "dry_run", False):
        raise ConflictingFlags(f"`{command}` got both --apply and --dry-run: pass --apply to make the changes, or "
                               "neither to see the plan.")
    return bool(args.apply)
