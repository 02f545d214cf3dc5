"""`up`: the chart renders the final values (its schema and templates, `helm template`) before any
Google Cloud change and before the values file is written (issue #12 (5)); then prereqs, then
`helm upgrade --install` on a real API server (../shared/kube-apiserver)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gemma3_ray import cli
from gemma3_ray.utils import names

from tests.plugin.conftest import PROJECT, REGION, ROOT, Recorder, storage_client
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.kube_apiserver import kubectl, serve_kuberay
from tests.plugin.test_prereqs import _clients

HELMS = {"helm4": os.environ.get("HELM", str(ROOT / ".tools/bin/helm")),
         "helm3": os.environ.get("HELM3", str(ROOT / ".tools/bin/helm3"))}
BASE = ["--project", PROJECT, "--region", REGION, "--cluster", "trainers", "--no-follow"]


@pytest.mark.parametrize("major", list(HELMS))
def test_up_refuses_values_the_chart_rejects_before_changing_anything(
    major: str, gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("HELM", HELMS[major])
    monkeypatch.delenv("HELM_BIN", raising=False)
    extra = tmp_path / "mine.yaml"
    extra.write_text("workers:\n  gpusPerNode: 3\n")
    values_file = tmp_path / "v.yaml"
    values_file.write_text("# mine\ntraining:\n  learning_rate: 0.0002\n")
    rec = Recorder()
    rc = cli.main(["up", *BASE, "--kubeconfig", str(tmp_path / "none"), "--values-file", str(values_file),
                   "-f", str(extra)], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert err.startswith("gemma3-ray: error: The chart rejects these values (") and "\n" not in err
    assert "gpusPerNode" in err and "nothing was changed" in err
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert list(storage_client(gcs_iam_emulator).list_buckets()) == []
    assert values_file.read_text() == "# mine\ntraining:\n  learning_rate: 0.0002\n"


def test_up_refuses_a_model_that_does_not_fit_the_gpu_before_changing_anything(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue #46: the model's size (here from a -f file, as helm merges it) against the fit table, before any change."""
    extra = tmp_path / "mine.yaml"
    extra.write_text("training:\n  model_id: google/gemma-3-27b-it\n")
    values_file = tmp_path / "v.yaml"
    values_file.write_text("# mine\n")
    rec = Recorder()
    rc = cli.main(["up", *BASE, "--machine-type", "g2-standard-24", "--kubeconfig", str(tmp_path / "none"),
                   "--values-file", str(values_file), "-f", str(extra)],
                  _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err and "Traceback" not in err
    assert "Gemma 3 27B does not fit nvidia-l4" in err and "12B" in err
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert values_file.read_text() == "# mine\n"


def test_up_installs_the_release_with_its_own_identity(
    kube_apiserver: Path, gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    ns = "up-team"
    kubectl(kube_apiserver, "create", "namespace", ns)
    monkeypatch.setenv("HELM", HELMS["helm4"])
    monkeypatch.delenv("HELM_BIN", raising=False)
    for var in ("HELM_DATA_HOME", "HELM_CONFIG_HOME", "HELM_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "helm"))
    # the hook RayJob of the previous chart version (named after the release): Helm never deletes it
    kubectl(kube_apiserver, "-n", ns, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {
            "name": "gemma3-ray", "labels": {"app.kubernetes.io/instance": "gemma3-ray"},
            "annotations": {"helm.sh/hook": "post-install,post-upgrade,post-rollback"}},
        "spec": {"entrypoint": "python vision_train.py"}}))
    values_file = tmp_path / "v.yaml"  # from an earlier `up` for an L4 on a reservation, plus a key of ours
    values_file.write_text("training:\n  recipe: tutorial\n  learning_rate: 0.0002\n"
                           "capacity:\n  type: reservation\n  reservation: l4-res\n")
    from gemma3_ray.config import clients as seam

    connections: list[tuple[str | None, str | None]] = []
    real_connect = seam.connect
    monkeypatch.setattr(seam, "connect", lambda *where: connections.append(where) or real_connect(*where))
    rc = cli.main(["up", "--apply", *BASE, "-n", ns, "--kubeconfig", str(kube_apiserver), "--machine-type", "a3-megagpu-8g",
                   "--values-file", str(values_file)], _clients(gcs_iam_emulator, fake_iam, fake_usage))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    order = [line.split(" ")[0] for line in captured.out.splitlines() if line.split(" ")[0] in
             {"Chart", "Values:", "Prerequisites", "Release"}]
    assert order == ["Chart", "Values:", "Prerequisites", "Release"], captured.out
    assert connections == [(str(kube_apiserver), None)]  # one Kubernetes connection for the whole command (#35)
    gsa = f"{names.release_gsa_id(ns, 'gemma3-ray')}@{PROJECT}.iam.gserviceaccount.com"
    assert gsa in fake_iam.accounts
    written = yaml.safe_load(values_file.read_text())
    assert written["serviceAccount"]["gcpServiceAccount"] == gsa
    assert "capacity" not in written  # issue #12 (1): up's values file drops the keys this run does not write
    assert "recipe" not in written["training"] and written["training"]["learning_rate"] == 0.0002
    sa = json.loads(kubectl(kube_apiserver, "-n", ns, "get", "serviceaccount", "gemma3-ray", "-o", "json"))
    assert sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == gsa
    listed = subprocess.run([HELMS["helm4"], "list", "-q", "-n", ns, "--kubeconfig", str(kube_apiserver)],
                            capture_output=True, text=True, timeout=60)
    assert listed.stdout.split() == ["gemma3-ray"]
    assert f"Deleted RayJob {ns}/gemma3-ray: a RayJob of release gemma3-ray that Helm does not manage" in captured.out
    jobs = json.loads(kubectl(kube_apiserver, "-n", ns, "get", "rayjobs", "-o", "json"))["items"]
    assert [j["metadata"]["name"] for j in jobs] == ["gemma3-ray-r1"], "only the chart's RayJob, Helm's"


@pytest.fixture(scope="class", params=["v1.4.2", "v1.5.0"])
def older_kuberay(request: pytest.FixtureRequest, kube_apiserver: Path) -> Iterator[tuple[Path, str]]:
    """The session's API server serving KubeRay 1.4.2's, then 1.5.0's CRDs for one class of tests (1.7.0's
    again after each): swapping them takes ~10 s each way, so the cases share one swap per version."""
    serve_kuberay(kube_apiserver, request.param)
    try:
        yield kube_apiserver, request.param
    finally:
        serve_kuberay(kube_apiserver, "v1.7.0")


class TestOnOlderKubeRay:
    """KubeRay 1.4.2's or 1.5.0's CRDs served for every case of the class."""

    @pytest.mark.parametrize(("values", "named", "version"), [
        ("rayTokenAuth: true\n", "rayTokenAuth", "KubeRay 1.5.1"),
        ("rayJob:\n  preRunningDeadlineSeconds: 600\n", "rayJob.preRunningDeadlineSeconds", "KubeRay 1.6.0"),
        ("service:\n  dashboardPort: 8266\n", "service.dashboardPort", "KubeRay 1.6.0"),
        ("rayJob:\n  deletion:\n    workersAfterSeconds: 0\n", "rayJob.deletion", "KubeRay 1.6.0"),
        ("historyServer:\n  collector:\n    image: collector:v1\n", "historyServer.collector.image", "KubeRay 1.7.0"),
    ])
    def test_up_refuses_values_an_older_kuberay_would_drop_before_changing_anything(
        self, older_kuberay: tuple[Path, str], gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], values: str, named: str,
        version: str,
    ) -> None:
        """KubeRay 1.4.2's CRDs prune spec.rayClusterSpec.authOptions and spec.preRunningDeadlineSeconds (a
        warning only), and its head probes hard-code 8265 (issue #19, failure 5); 1.5.0's lack them too, and
        neither has the deletion rules the chart renders nor historyServerOptions (#34): `up` reads the served
        CRD and refuses, naming the value and the KubeRay it needs, before any change."""
        kubeconfig, served = older_kuberay
        ns = f"up-{served.replace('.', '')}-{named.split('.')[-1].lower()}"
        kubectl(kubeconfig, "create", "namespace", ns)
        monkeypatch.setenv("HELM", HELMS["helm3"])
        monkeypatch.delenv("HELM_BIN", raising=False)
        extra = tmp_path / "mine.yaml"
        extra.write_text(values)
        values_file = tmp_path / "v.yaml"
        values_file.write_text("# mine\n")
        rec = Recorder()
        rc = cli.main(["up", *BASE, "-n", ns, "--kubeconfig", str(kubeconfig), "--values-file", str(values_file),
                       "-f", str(extra)], _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
        err = capsys.readouterr().err.strip()
        assert rc != 0 and "\n" not in err, err
        assert f"{named} needs {version} or newer" in err and "nothing was changed" in err, err
        assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
        assert values_file.read_text() == "# mine\n"
        listed = subprocess.run([HELMS["helm3"], "list", "-q", "-n", ns, "--kubeconfig", str(kubeconfig)],
                                capture_output=True, text=True, timeout=60)
        assert listed.stdout.split() == []


def test_up_waits_for_a_terminating_rayjob_of_the_release_and_names_its_finalizer(
    kube_apiserver: Path, gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    """Right after an uninstall the release's RayJob may still be terminating (KubeRay's finalizer): Helm
    would apply the new revision's RayJob of the same name onto it, and it would then go with the
    deletion (seen with Helm 4.1.4 and 3.17.1). `up` waits for it, and with no operator to remove the
    finalizer stops, naming it and the command, before any change."""
    from gemma3_ray.release import down

    monkeypatch.setattr(down, "GONE_TIMEOUT_S", 3.0)
    monkeypatch.setattr(down, "GONE_POLL_S", 0.5)
    ns = "up-terminating"
    kubectl(kube_apiserver, "create", "namespace", ns)
    kubectl(kube_apiserver, "-n", ns, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {
            "name": "gemma3-ray-r1", "labels": {"app.kubernetes.io/instance": "gemma3-ray"},
            "finalizers": ["ray.io/rayjob-finalizer"]},
        "spec": {"entrypoint": "python vision_train.py"}}))
    kubectl(kube_apiserver, "-n", ns, "delete", "rayjob", "gemma3-ray-r1", "--wait=false")
    monkeypatch.setenv("HELM", HELMS["helm4"])
    monkeypatch.delenv("HELM_BIN", raising=False)
    values_file = tmp_path / "v.yaml"
    values_file.write_text("# mine\n")
    rec = Recorder()
    rc = cli.main(["up", "--apply", *BASE, "-n", ns, "--kubeconfig", str(kube_apiserver), "--values-file", str(values_file)],
                  _clients(gcs_iam_emulator, fake_iam, fake_usage, rec))
    err = capsys.readouterr().err.strip()
    assert rc != 0 and "\n" not in err, err
    assert f"RayJob {ns}/gemma3-ray-r1 is still there" in err and "KubeRay's finalizer" in err, err
    assert f"kubectl -n {ns} patch rayjob gemma3-ray-r1 --type=merge" in err and "gemma3-ray up" in err, err
    assert rec.mutations() == [] and fake_iam.mutations() == [] and fake_usage.mutations() == []
    assert values_file.read_text() == "# mine\n"
