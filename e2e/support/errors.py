"""The errors of `make e2e`: what a stage raises when its claim is false, or when it does not apply here."""

from __future__ import annotations


class StageError(RuntimeError):
    """A stage failed: the message names the object and carries the cluster's own words."""


class NotRun(Exception):  # noqa: N818 - a row's result, as the record names it ("not run"), not a failure
    """A stage that does not apply to this run (a setup stage on the cluster KUBECONFIG names): its row says
    "not run" with this reason, and the run goes on."""
