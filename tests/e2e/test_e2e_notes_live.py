"""The NOTES command checks of `make e2e` against a real API server and the real kubectl (issue #31 (2)): a command
that fails while printing the RayJob's name fails its check; the same command on a RayJob that exists passes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from e2e.stages.first_run import run_notes_line
from e2e.support import notes_check as nc
from e2e.support.errors import StageError
from e2e.support.harness import Run
from e2e.support.kube import Kube
from tests.plugin.kube_apiserver import kubectl
from tests.plugin.test_down_cluster import _rayjob

NS = "e2e-notes-live"


@pytest.fixture(scope="module")
def live(kube_apiserver: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    kubectl(kube_apiserver, "create", "namespace", NS)
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=_rayjob(NS, "e2e-gemma3-ray-r1"))
    log = tmp_path_factory.mktemp("e2e") / "e2e.log"
    return SimpleNamespace(kube=Kube(kube_apiserver, log))


def _run(name: str) -> Run:
    return Run(NS, "e2e", name, "r1-20261202-000000-abcd", "gs://b/p", {})


def test_watch_of_a_missing_rayjob_fails_though_its_error_names_it(live: SimpleNamespace) -> None:
    """Before: `kubectl get rayjob X -w` passed on `rayjobs.ray.io "X" not found` (the name is in the output)."""
    line = nc.classify(f"kubectl -n {NS} get rayjob e2e-gemma3-ray-r9 -w")
    assert line.kind == nc.WATCH
    with pytest.raises(StageError, match=r"exited 1 on its own: .*not found"):
        run_notes_line(live, line, _run("e2e-gemma3-ray-r9"), "2.60.0")


def test_watch_of_the_rayjob_shows_its_row(live: SimpleNamespace) -> None:
    line = nc.classify(f"kubectl -n {NS} get rayjob e2e-gemma3-ray-r1 -w")
    assert run_notes_line(live, line, _run("e2e-gemma3-ray-r1"), "2.60.0") == nc.WATCH


def test_logs_of_a_job_that_is_not_there_fail(live: SimpleNamespace) -> None:
    """Before: `logs -f` waited for '', found at once whatever kubectl said."""
    line = nc.classify(f"kubectl -n {NS} logs -f job/e2e-gemma3-ray-r1")
    assert line.kind == nc.FOLLOW
    with pytest.raises(StageError, match="exited 1"):
        run_notes_line(live, line, _run("e2e-gemma3-ray-r1"), "2.60.0")


def test_a_plain_kubectl_line_must_exit_0(live: SimpleNamespace) -> None:
    ok = nc.classify(f"kubectl -n {NS} delete pod e2e-gemma3-ray-test-head --ignore-not-found")
    assert run_notes_line(live, ok, _run("e2e-gemma3-ray-r1"), "2.60.0") == nc.RUN
    bad = nc.classify(f"kubectl -n {NS} delete pod e2e-gemma3-ray-test-head")
    with pytest.raises(StageError, match="NotFound"):
        run_notes_line(live, bad, _run("e2e-gemma3-ray-r1"), "2.60.0")


def test_the_log_records_each_command_and_its_exit(live: SimpleNamespace) -> None:
    line = nc.classify(f"kubectl -n {NS} get rayjob e2e-gemma3-ray-r1 -w")
    run_notes_line(live, line, _run("e2e-gemma3-ray-r1"), "2.60.0")
    text = live.kube.log_path.read_text()
    assert f"$ kubectl -n {NS} get rayjob e2e-gemma3-ray-r1 -w" in text and "# exit (stopped)" in text
