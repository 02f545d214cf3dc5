"""A release of the previous chart version upgraded to this one (#47 item 3), on a real API server: the released
0.1.0 artifact (charts/releases/gemma3-ray-0.1.0.tgz) installed with the values files written for it (its own
ci/default-values.yaml), then `helm upgrade` to the working-tree chart with the same values.

The rule (charts/gemma3-ray/README.md, "Release lifecycle" and "Upgrading from a previous chart version"): an
upgrade is a new revision, so a new RayJob `<r>-r2` and a new run; Helm creates it, then deletes 0.1.0's `<r>-r1`
(KubeRay's finalizer stops that job; ephemeral: its cluster goes with it). The ServiceAccount and the user's Secret
are the same objects (same uid); the trainer ConfigMap is the same object when the trainer did not change between
the versions, else the new one replaces it; nothing of 0.1.0 is left that the chart no longer renders, and nothing
live references a missing object. KubeRay's controller and the garbage collector are cluster_sim's stand-ins.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
import yaml
from cluster_sim import Controllers
from helm_render import CHART, helm_bin
from kube_api import ApiServer
from release_state import helm, snapshot
from test_lifecycle_release import (
    FULLNAME,
    RELEASE,
    USER_SECRET,
    chart_objects,
    check_running,
    job_clusters,
    notes_run,
)

PREVIOUS = CHART.parent / "releases" / "gemma3-ray-0.1.0.tgz"
CURRENT = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
CASES = [("ephemeral", "HELM"), ("persistent", "HELM3")]


def previous_values(dest: Path) -> Path:
    """ci/default-values.yaml as the 0.1.0 artifact ships it: the values written for the previous version."""
    with tarfile.open(PREVIOUS) as tar:
        tar.extractall(dest, members=[tar.getmember("gemma3-ray/ci/default-values.yaml")], filter="data")
    return dest / "gemma3-ray" / "ci" / "default-values.yaml"


def uid(snap: object, kind: str, name: str) -> str:
    return snap.objects[kind][name]["metadata"]["uid"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("mode", "helm_var"), CASES, ids=["-".join(c) for c in CASES])
def test_a_0_1_0_release_upgraded_to_this_chart(apiserver: ApiServer, tmp_path: Path, mode: str, helm_var: str) -> None:
    apiserver.use_crds("v1.7.0")
    ns = apiserver.namespace(f"upgrade-{mode[:4]}-{helm_var.lower()}")
    apiserver.admin.create(f"/api/v1/namespaces/{ns}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": USER_SECRET}, "stringData": {"hf_api_token": "x"}})
    bin_ = helm_bin(helm_var)
    values = ["-f", str(previous_values(tmp_path)), "--set", f"mode={mode}"]
    with Controllers(apiserver, ns, tmp_path / "sim") as sim:
        helm(apiserver, bin_, "install", RELEASE, str(PREVIOUS), "-n", ns, *values)
        sim.settle()
        s1 = snapshot(apiserver, ns)
        cm1 = next(n for n in s1.names("ConfigMap") if n.startswith(f"{FULLNAME}-trainer-"))
        run1 = check_running(s1, mode, "0.0002", cm1, 1)
        assert s1.rayjob()["metadata"]["labels"]["helm.sh/chart"] == "gemma3-ray-0.1.0"
        job1 = uid(s1, "RayJob", f"{FULLNAME}-r1")

        helm(apiserver, bin_, "upgrade", RELEASE, str(CHART), "-n", ns, *values)
        sim.settle()
        s2 = snapshot(apiserver, ns)
        cm2 = next(n for n in s2.names("ConfigMap") if n.startswith(f"{FULLNAME}-trainer-"))
        run2 = check_running(s2, mode, "0.0002", cm2, 2)  # exactly the new chart's objects: nothing orphaned
        (listed,) = json.loads(helm(apiserver, bin_, "list", "-n", ns, "-o", "json"))
        assert (listed["chart"], listed["revision"]) == (f"gemma3-ray-{CURRENT}", "2"), listed
        assert s2.rayjob()["metadata"]["labels"]["helm.sh/chart"] == f"gemma3-ray-{CURRENT}"
        assert run2 != run1 and notes_run(apiserver, bin_, ns) == run2, "a new revision is a new run"
        assert f"{FULLNAME}-r1" not in s2.names("RayJob") and any(job1 in s for s in sim.stopped_jobs), \
            "0.1.0's RayJob was stopped by KubeRay and deleted by Helm"
        if mode == "ephemeral":
            assert not job_clusters(s2, job1), "the old job's cluster went with it"
        else:
            assert uid(s2, "RayCluster", FULLNAME) == uid(s1, "RayCluster", FULLNAME), "the persistent cluster is kept"
        for kind, name in (("ServiceAccount", FULLNAME), ("Secret", USER_SECRET)):
            assert uid(s2, kind, name) == uid(s1, kind, name), f"{kind} {name} survives the upgrade"
        if s1.objects["ConfigMap"][cm1]["data"] == s2.objects["ConfigMap"][cm2]["data"]:
            assert cm2 == cm1 and uid(s2, "ConfigMap", cm2) == uid(s1, "ConfigMap", cm1), "same trainer: same ConfigMap"
        else:
            assert cm2 != cm1 and cm1 not in s2.names("ConfigMap"), "a changed trainer: the new ConfigMap replaces it"
        assert chart_objects(s2) - chart_objects(s1) == {("RayJob", f"{FULLNAME}-r2")} | (
            {("ConfigMap", cm2)} if cm2 != cm1 else set())
