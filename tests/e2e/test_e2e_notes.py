"""The NOTES commands of `make e2e` (issue #31 (2)): every command NOTES print is run here, run as printed by the
stage named (a stage that exists), or listed as not run with why; the checks of what each showed fail when it did
not show what it promises."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e.runner import table as t
from e2e.support import notes_check as nc

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gemma3-ray"
HELM = os.environ.get("HELM", str(ROOT / ".tools" / "bin" / "helm"))


def notes(*sets: str, values: str = "values/e2e.yaml") -> str:
    """NOTES as `helm install --dry-run=client` prints them for the e2e release (no cluster)."""
    cmd = [HELM, "install", "e2e", str(CHART), "-n", "g3r-e2e", "-f", str(ROOT / values), "--dry-run=client"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "KUBECONFIG": os.devnull})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\nNOTES:\n", 1)[1]


@pytest.fixture(scope="module")
def e2e_notes() -> str:
    return notes()


def test_every_notes_command_is_run_or_not_run_with_why(e2e_notes: str) -> None:
    """Before: kubectl lines ran, every other line was 'proved by other stages' and never run."""
    lines = nc.plan(e2e_notes)
    stages = {s.name for s in t.STAGES}
    assert len(lines) >= 10, lines
    for ln in lines:
        assert ln.kind in {nc.WATCH, nc.FOLLOW, nc.PORT_FORWARD, nc.RUN, nc.BY_STAGE, nc.NOT_RUN}, ln
        if ln.kind == nc.BY_STAGE:
            assert ln.by in stages, f"{ln.command}: run by stage {ln.by!r}, which the table has not"
        if ln.kind == nc.NOT_RUN:
            assert ln.why and "elsewhere" not in ln.why and "proved" not in ln.why, ln
    kinds = {ln.command.split()[3] if ln.command.startswith("kubectl -n") else ln.command.split()[1]: ln for ln in lines}
    assert kinds["get"].kind == nc.WATCH
    assert kinds["logs"].kind == nc.FOLLOW
    assert kinds["port-forward"].kind == nc.PORT_FORWARD
    assert kinds["storage"].kind == nc.RUN, "gcloud storage ls runs, against the storage emulator"
    assert {ln.by for ln in lines if ln.kind == nc.BY_STAGE} == {
        "helm test", "upgrade", "rollback", "uninstall", nc.FINALIZER_STAGE, nc.QUICK_ROLLBACK_STAGE}


def test_the_uninstall_line_loses_its_remark(e2e_notes: str) -> None:
    (line,) = [ln for ln in nc.plan(e2e_notes) if ln.by == "uninstall"]
    assert line.argv == ["helm", "uninstall", "e2e", "-n", "g3r-e2e"]


def test_the_finalizer_line_is_only_for_its_own_stage(e2e_notes: str) -> None:
    """Before: the finalizer line ran on the live first RayJob."""
    (line,) = [ln for ln in nc.plan(e2e_notes) if "finalizers" in ln.command]
    assert line.kind == nc.BY_STAGE and line.by == nc.FINALIZER_STAGE
    assert line.kind != nc.NOT_RUN


def test_the_lost_head_line_is_not_run_with_why(e2e_notes: str) -> None:
    (line,) = [ln for ln in nc.plan(e2e_notes) if "resume_from" in ln.command]
    assert line.kind == nc.NOT_RUN and "backoffLimit" in line.why


def test_with_a_retry_budget_no_resume_line_is_printed() -> None:
    assert not [ln for ln in nc.plan(notes("rayJob.backoffLimit=1")) if "resume_from" in ln.command]


def test_notes_name_the_ray_version_the_dashboard_must_report(e2e_notes: str) -> None:
    import yaml

    assert nc.ray_version(e2e_notes) == str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])


# ---------------------------------------------------------------------------------------------- -w
def test_watch_fails_on_an_error_that_merely_names_the_rayjob() -> None:
    """Before: `-w` passed when its output held the RayJob's name, which kubectl's NotFound error does."""
    out = 'Error from server (NotFound): rayjobs.ray.io "e2e-gemma3-ray-r1" not found\n'
    assert nc.watch_problem(out, 1, "e2e-gemma3-ray-r1").startswith("exited 1")
    assert nc.watch_problem(out, None, "e2e-gemma3-ray-r1").startswith("printed no row")


def test_watch_passes_on_the_rayjobs_row() -> None:
    out = ("NAME                JOB STATUS   DEPLOYMENT STATUS   RAY CLUSTER NAME   START TIME   END TIME   AGE\n"
           "e2e-gemma3-ray-r1   SUCCEEDED    Complete            e2e-gemma3-ray-r1-x   2026-12-02T10:00:00Z\n")
    assert nc.watch_problem(out, None, "e2e-gemma3-ray-r1") == ""
    assert nc.watch_problem(out, 0, "e2e-gemma3-ray-r1") == ""
    assert nc.watch_problem(out, 1, "e2e-gemma3-ray-r1"), "an exit code other than 0 fails even with the row"


# ---------------------------------------------------------------------------------------------- logs -f
def test_follow_fails_without_the_runs_own_name() -> None:
    """Before: `logs -f` waited for the empty string, which is always found."""
    assert nc.follow_problem("", None, "r1-20261202-1")
    assert nc.follow_problem("training r2-other\n", 0, "r1-20261202-1")
    assert nc.follow_problem("", 0, "")
    assert nc.follow_problem("run r1-20261202-1\n", 1, "r1-20261202-1").startswith("exited 1")
    assert nc.follow_problem(SUMMARY, 0, "r1-20261202-1") == ""


SUMMARY = ("fresh run r1-20261202-1\n" + "=" * 72 + "\ngemma3-ray training summary\n"
           "  run_name                     r1-20261202-1\n  global_step                  5\n" + "=" * 72 + "\n")
ECHO = ("2026-12-04 10:00:01,000 INFO cli.py:41 -- Job submitted; entrypoint: python -m trainer.vision_train "
        "--run_name r1-20261202-1 --max_steps=5\n2026-12-04 10:00:02 Runtime env is setting up.\n")


def test_logs_need_the_trainers_own_summary_not_rays_echo_of_the_entrypoint() -> None:
    """Before: the run's name anywhere passed, and Ray's echo of the entrypoint (`--run_name <name>`) carries it
    from the first second: a job whose trainer printed nothing passed `logs -f` and `gemma3-ray logs`."""
    name = "r1-20261202-1"
    assert not nc.trainer_said(ECHO, name) and nc.follow_problem(ECHO, 0, name)
    assert not nc.trainer_said(ECHO + "  --run_name=r1-20261202-1\n", name)
    assert nc.trainer_said(SUMMARY, name) and nc.trainer_said(ECHO + SUMMARY, name)
    assert not nc.trainer_said(SUMMARY, "r1-2026120"), "a prefix of the name is not the name"
    prefixed = "".join(f"[pod/e2e-submitter-x/ray-job-submitter] {line}\n" for line in SUMMARY.splitlines())
    assert nc.trainer_said(prefixed, name), "kubectl logs --prefix keeps the row"


# ---------------------------------------------------------------------------------------------- port-forward
def test_port_forward_moves_to_the_free_local_port() -> None:
    """Before: port 8265 as printed, so any server already there answered."""
    argv = ["kubectl", "-n", "ns", "port-forward", "svc/e2e-head", "8265:8265"]
    assert nc.with_local_port(argv, 40123) == ["kubectl", "-n", "ns", "port-forward", "svc/e2e-head", "40123:8265"]
    assert nc.with_local_port(["kubectl", "port-forward", "pod/x", "8265"], 4) == ["kubectl", "port-forward", "pod/x",
                                                                                   "4:8265"]


def test_the_dashboard_must_be_that_clusters() -> None:
    assert nc.dashboard_problem('{"ray_version": "2.60.0", "version": "4"}', "2.60.0") == ""
    assert "reports Ray '2.9.0'" in nc.dashboard_problem('{"ray_version": "2.9.0"}', "2.60.0")
    assert "not with the Ray dashboard's JSON" in nc.dashboard_problem("<html>some other server</html>", "2.60.0")
    assert nc.dashboard_problem('{"ray_version": "2.60.0"}', "")
