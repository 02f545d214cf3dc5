"""The local kit's one error: a failure the user can act on, its message one sentence saying what to do."""

from __future__ import annotations


class LocalKitError(RuntimeError):
    """A failure the user can act on: the message says what to do."""
