"""The errors of `make e2e`: what a stage raises when its claim is false."""

from __future__ import annotations


class StageError(RuntimeError):
    """A stage failed: the message names the object and carries the cluster's own words."""
