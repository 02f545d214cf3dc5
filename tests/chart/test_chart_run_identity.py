"""Each Helm revision is its own run (issue #10, failure 4, chart side): the RayJob passes --run_name,
new on every render and the same in the RayJob and NOTES; resume_from is explicit and shown."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
import yaml
from helm_render import CHART, CI_VALUES_DIR, NAMESPACE, RELEASE, helm_bin, load_docs

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
RUN = re.compile(r"r1-[0-9]{8}-[0-9]{6}-[a-z0-9]{4}")


def dry_run_install(helm: str, *sets: str) -> tuple[dict[str, str], str]:
    """(RayJob flags, NOTES) of one `helm install --dry-run=client`: one render, as Helm stores it."""
    cmd = [helm_bin(helm), "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(CI_DEFAULT), "--dry-run=client"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120,
                          env={**os.environ, "KUBECONFIG": os.devnull})
    assert proc.returncode == 0, proc.stderr
    manifest, notes = proc.stdout.split("\nMANIFEST:\n", 1)[1].split("\nNOTES:\n", 1)
    hooks = proc.stdout.split("\nHOOKS:\n", 1)[1].split("\nMANIFEST:\n", 1)[0]
    (job,) = [d for d in load_docs(hooks + "\n---\n" + manifest) if d["kind"] == "RayJob"]
    words = shlex.split(job["spec"]["entrypoint"])
    return dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w), notes


def test_the_rayjob_and_notes_name_the_same_new_run() -> None:
    """Helm 4 renders a client dry run offline; tests/lifecycle checks both Helms' stored NOTES."""
    helm = "HELM"
    flags, notes = dry_run_install(helm)
    run = flags["run_name"]
    assert RUN.fullmatch(run), run
    storage = flags["storage_path"]
    assert f"This revision's run: {run}, a fresh run" in notes
    assert f"gcloud storage ls {storage}/runs/{run}/" in notes
    again, _ = dry_run_install(helm)
    assert again["run_name"] != run, "every install/upgrade is a new run"


def test_resume_from_is_passed_verbatim_and_shown() -> None:
    flags, notes = dry_run_install("HELM", "training.resume_from=r3-20261201-090000-abcd")
    assert flags["resume_from"] == "r3-20261201-090000-abcd"
    assert "continuing r3-20261201-090000-abcd (training.resume_from)" in notes


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_run_name_is_derived_never_a_value(helm: str, tmp_path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text(yaml.safe_dump({"training": {"run_name": "mine"}}))
    proc = subprocess.run([helm_bin(helm), "template", RELEASE, str(CHART), "-f", str(CI_DEFAULT), "-f", str(f)],
                          capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode != 0 and "run_name" in proc.stderr, proc.stderr


def test_run_id_makes_the_run_and_the_rayjob_deterministic() -> None:
    """rayJob.runId (GitOps, `helm template`): the run is r<revision>-<runId> in the RayJob and NOTES,
    the same on every render, and the RayJob is named after it."""
    flags, notes = dry_run_install("HELM", "rayJob.runId=sweep-7")
    assert flags["run_name"] == "r1-sweep-7"
    assert "This revision's run: r1-sweep-7, a fresh run" in notes
    assert f"get rayjob {RELEASE}-gemma3-ray-sweep-7 -w" in notes
    assert "helm updates this same RayJob in place instead" in notes
    again, _ = dry_run_install("HELM", "rayJob.runId=sweep-7")
    assert again == flags
