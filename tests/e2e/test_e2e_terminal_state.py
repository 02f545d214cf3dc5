"""When a RayJob has ended, for the waits of `make e2e` (issue #31 (2)): KubeRay v1.5's own terminal states, and
ValidationFailed, after which the operator never touches the RayJob again (before: a 15-minute wait for nothing);
a failed attempt that KubeRay retries has not ended."""

from __future__ import annotations

import pytest

from e2e.support.kube import ended


@pytest.mark.parametrize(("deployment", "job", "want"), [
    ("Complete", "SUCCEEDED", True),
    ("Failed", "FAILED", True),
    ("Failed", "RUNNING", True),  # activeDeadlineSeconds: the deployment fails while Ray still says RUNNING
    ("ValidationFailed", "", True),
    ("Suspended", "STOPPED", True),
    ("Suspended", "", False),  # waiting for Kueue: it will start
    ("Retrying", "FAILED", False),  # rayJob.backoffLimit >= 1: a new cluster comes
    ("New", "FAILED", False),
    ("Running", "SUCCEEDED", False),  # the submitter has not finished yet
    ("Running", "RUNNING", False),
    ("Initializing", "", False),
    ("", "", False),
])
def test_ended(deployment: str, job: str, want: bool) -> None:
    assert ended({"jobDeploymentStatus": deployment, "jobStatus": job}) is want


def test_no_status_yet_has_not_ended() -> None:
    assert not ended(None) and not ended({})
