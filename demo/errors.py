"""The demo's error: a LocalKitError (the kit's one error), so ``python -m demo`` reports both the same way."""

from __future__ import annotations

from localkit.errors import LocalKitError


class DemoError(LocalKitError):
    """A failure of the demo's own steps the user can act on: the message says what to do."""
