"""The run's clean-up when `helm uninstall --wait` gives up on an object still Terminating (2026-12-04: RayJob a-…
Terminating after 120 s while KubeRay's finalizer was still held; it went with its namespace, and the run, every
stage passed and nothing left, was failed for it): the harness waits for the release's objects to go and names a
problem only if any is still there, or if helm failed for another reason. kubectl's and helm's answers are replaced
(the logic under test is the harness's; the real uninstall runs in `make e2e`)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.support import harness as hm
from e2e.support.harness import Harness
from e2e.support.kube import Kube
from e2e.support.record import Record

TERMINATING = ("Error: uninstallation completed with 1 error(s): resource RayJob/ns1/a-gemma3-ray-r1 still exists. "
               "status: Terminating, message: Resource scheduled for deletion")


class FakeKube(Kube):
    def __init__(self, tmp: Path, helm_err: str, left_for: int) -> None:
        super().__init__(tmp / "kubeconfig", tmp / "log")
        self.helm_err, self.left_for, self.asked = helm_err, left_for, 0

    def h(self, *args: str, **kw):  # type: ignore[override]
        return subprocess.CompletedProcess(["helm", *args], 1 if self.helm_err else 0, "", self.helm_err)

    def k(self, *args: str, **kw):  # type: ignore[override]
        return subprocess.CompletedProcess(["kubectl", *args], 0, "", "")

    def gone(self, ns: str, selector: str, kinds: list[str]) -> list[str]:  # type: ignore[override]
        self.asked += 1
        return ["rayjob.ray.io/a-gemma3-ray-r1"] if self.asked <= self.left_for else []

    def diagnose(self, ns: str, limit: int = 12) -> str:  # type: ignore[override]
        return ""


def _harness(tmp_path: Path, kube: FakeKube) -> Harness:
    h = Harness(kube, Record(tmp_path / "out", lambda m: None), None, hm.Images(), tmp_path)  # type: ignore[arg-type]
    h.installed.append(("ns1", "a"))
    return h


def test_an_object_still_terminating_that_then_goes_is_no_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hm, "CLEANUP_GONE_S", 30)
    kube = FakeKube(tmp_path, TERMINATING, left_for=1)
    assert _harness(tmp_path, kube).cleanup() == [] and kube.asked == 2


def test_one_still_there_after_the_wait_is_a_problem_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hm, "CLEANUP_GONE_S", 1)
    problems = _harness(tmp_path, FakeKube(tmp_path, TERMINATING, left_for=10**6)).cleanup()
    assert len(problems) == 1 and "still exists" in problems[0] and "still there 1 s later" in problems[0]


def test_helm_failing_otherwise_is_a_problem_at_once(tmp_path: Path) -> None:
    kube = FakeKube(tmp_path, "Error: Kubernetes cluster unreachable", left_for=0)
    problems = _harness(tmp_path, kube).cleanup()
    assert problems == ["helm uninstall a -n ns1: Error: Kubernetes cluster unreachable"] and kube.asked == 0
