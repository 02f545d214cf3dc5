"""The cluster side: the HF token Secret, doctor's checks (with the real KubeRay CRD manifests), and
status's newest checkpoint (on fake-gcs-server)."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients, Kube
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.kube import kuberay_crd
from gemma3_ray.release import doctor
from kubernetes import client

from tests.plugin.conftest import PROJECT, REGION, storage_client
from tests.plugin.container_fakes import FakeContainer, FakeResourceManager
from tests.plugin.driver_maps import driver_maps  # noqa: F401 - fixture
from tests.plugin.gcp_fakes import FakeIAM, FakeServiceUsage
from tests.plugin.kube_fakes import FakeApiExtensions, FakeCore, crd_manifest

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"  # noqa: S105 - a made-up test token
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]


def test_hf_secret_comes_from_the_environment_and_is_never_printed(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    core = FakeCore()
    clients = Clients(project=PROJECT, storage=storage_client(gcs_iam_emulator), iam=fake_iam, resource_manager=FakeResourceManager(PROJECT),
                      service_usage=fake_usage, kube=Kube(core=core))
    monkeypatch.delenv("MY_HF", raising=False)
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-from-env", "MY_HF"], clients) == 2
    assert "MY_HF is empty or unset" in capsys.readouterr().err

    monkeypatch.setenv("MY_HF", TOKEN)
    assert cli.main(["prereqs", "--dry-run", *BASE, "--hf-token-from-env", "MY_HF"], clients) == 0
    out = capsys.readouterr()
    assert "create Secret ml/hf-secret with the Hugging Face token under key hf_api_token (value not shown)" in out.out
    assert core.writes == []

    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-from-env", "MY_HF"], clients) == 0
    out = capsys.readouterr()
    secret = core.secrets[("ml", "hf-secret")]
    assert base64.b64decode(secret.data["hf_api_token"]).decode() == TOKEN
    assert secret.metadata.labels == {"app.kubernetes.io/managed-by": "gemma3-ray"}

    monkeypatch.setenv("MY_HF", TOKEN + "-rotated")
    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-from-env", "MY_HF"], clients) == 0
    out2 = capsys.readouterr()
    assert "update Secret ml/hf-secret" in out2.out
    assert core.writes == ["create", "create", "replace"]  # create met 409, then replaced
    for captured in (out, out2):
        assert TOKEN not in captured.out + captured.err

    assert cli.main(["prereqs", "--apply", *BASE, "--hf-token-from-env", "MY_HF"], clients) == 0
    assert "Nothing to do" in capsys.readouterr().out


# Each value newer than KubeRay 1.4, the doctor/`up` refusal it gets on each tested CRD set (None: kept).
NEWER_VALUES = {
    "rayJob.deletion": ({"rayJob": {"deletion": {"workersAfterSeconds": 0, "clusterAfterSeconds": 600}}}, "KubeRay 1.6.0"),
    "historyServer.collector.image": ({"historyServer": {"collector": {"image": "collector:v1"}}}, "KubeRay 1.7.0"),
    "rayJob.preRunningDeadlineSeconds": ({"rayJob": {"preRunningDeadlineSeconds": 600}}, "KubeRay 1.6.0"),
    "rayTokenAuth": ({"rayTokenAuth": True}, "KubeRay 1.5.1"),
}


@pytest.mark.parametrize("version", ["v1.7.0", "v1.5.0", "v1.4.2"])
@pytest.mark.parametrize("key", list(NEWER_VALUES))
def test_each_newer_value_is_refused_where_the_crd_is_older(version: str, key: str) -> None:
    """On KubeRay 1.4.2's and 1.5.0's CRDs (the 1.5.0 that `make e2e` runs) each newer value is refused
    with one sentence naming it, the KubeRay it needs and how to turn it off; 1.7.0 keeps them all."""
    values, since = NEWER_VALUES[key]
    kube = doctor.Kube(api_ext=FakeApiExtensions.kuberay(version))
    check = {c.name: c for c in doctor.check_crds(kube, values)}["rayjobs.ray.io"]
    assert check.ok is (version == "v1.7.0"), check.detail
    if not check.ok:
        assert check.detail.startswith(f"{key} needs {since} or newer") and "upgrade the KubeRay operator or " in check.detail
        assert "\n" not in check.detail


@pytest.mark.parametrize(("version", "knows_deadline"), [("v1.7.0", True), ("v1.5.0", False), ("v1.4.2", False)])
def test_rayjob_fields_of_the_installed_crd(version: str, knows_deadline: bool) -> None:
    report = kuberay_crd.rayjob_spec_fields(crd_manifest(version, "rayjobs"))
    assert report.missing_required == []
    assert report.supports("preRunningDeadlineSeconds") is knows_deadline
    assert report.supports("rayClusterSpec.authOptions") is knows_deadline
    assert report.supports("rayClusterSpec.workerGroupSpecs")
    kube = doctor.Kube(api_ext=FakeApiExtensions.kuberay(version))
    plain = {c.name: c for c in doctor.check_crds(kube, {"rayJob": {"preRunningDeadlineSeconds": None}})}
    assert plain["rayclusters.ray.io"].ok and plain["rayjobs.ray.io"].ok
    assert ("not known" in plain["rayjobs.ray.io"].detail) is not knows_deadline
    newer = {"rayJob": {"preRunningDeadlineSeconds": 600}, "rayTokenAuth": True}
    by_name = {c.name: c for c in doctor.check_crds(kube, newer)}
    assert by_name["rayjobs.ray.io"].ok is knows_deadline
    if not knows_deadline:
        detail = by_name["rayjobs.ray.io"].detail
        assert "rayJob.preRunningDeadlineSeconds needs KubeRay 1.6.0 or newer" in detail
        assert "set rayJob.preRunningDeadlineSeconds to null" in detail
        assert "rayTokenAuth needs KubeRay 1.5.1 or newer" in detail and "set rayTokenAuth to false" in detail
    # KubeRay 1.4.2's head probes hard-code 8265 (initLivenessAndReadinessProbe): another port is refused there.
    port = {c.name: c for c in doctor.check_crds(kube, {"service": {"dashboardPort": 8266}})}["rayjobs.ray.io"]
    assert port.ok is knows_deadline
    if not knows_deadline:
        assert "service.dashboardPort needs KubeRay 1.6.0 or newer" in port.detail and "8265" in port.detail
    assert {c.name: c for c in doctor.check_crds(kube, {"service": {"dashboardPort": 8265}})}["rayjobs.ray.io"].ok


@pytest.mark.usefixtures("driver_maps")
def test_doctor_explains_each_failure_and_passes_once_fixed(
    gcs_iam_emulator: str, fake_iam: FakeIAM, fake_usage: FakeServiceUsage,
) -> None:
    from gemma3_ray.gke import cluster as gke_cluster

    dep = resolve(Overrides(project=PROJECT, region=REGION, namespace="ml", cluster="trainers"), None, None)
    container = FakeContainer(PROJECT)
    container.ready(REGION, gke_cluster.desired_cluster(gke_cluster.ClusterSpec(PROJECT, REGION, "trainers")))
    clients = Clients(project=PROJECT, storage=storage_client(gcs_iam_emulator), iam=fake_iam, resource_manager=FakeResourceManager(PROJECT),
                      service_usage=fake_usage, container=container, _credentials=object())
    core = FakeCore()
    kube = doctor.Kube(core=core, api_ext=FakeApiExtensions(), context=f"gke_{PROJECT}_{REGION}_trainers")
    failing = {c.name: c for c in doctor.run_checks(dep, clients, kube) if not c.ok}
    assert "install the KubeRay operator" in failing["rayjobs.ray.io"].detail
    assert "--hf-token-file -" in failing["Hugging Face Secret"].detail
    assert "run `gemma3-ray prereqs --apply`" in failing["bucket"].detail
    assert "run `gemma3-ray prereqs --apply`" in failing["bucket grants"].detail
    assert "run `gemma3-ray prereqs --apply -n ml" in failing["Workload Identity binding"].detail
    assert "the chart creates it" in failing["KSA annotation"].detail

    from gemma3_ray.release import prereqs

    core.secrets[("ml", "hf-secret")] = client.V1Secret(data={"hf_api_token": "eA=="})
    core.service_accounts[("ml", "gemma3-ray")] = client.V1ServiceAccount(metadata=client.V1ObjectMeta(
        annotations={doctor.WI_ANNOTATION: dep.gsa_email}))
    assert prereqs.run(dep, clients, dry_run=False, hf_token=None, out=lambda _: None) == 0
    kube.api_ext = FakeApiExtensions.kuberay("v1.7.0")
    results = doctor.run_checks(dep, clients, kube)
    assert [c.line() for c in results if not c.ok] == []

    wrong = doctor.Kube(core=core, api_ext=kube.api_ext, context="gke_other-proj-1_us-east1_elsewhere")
    ctx = next(c for c in doctor.run_checks(dep, clients, wrong) if c.name == "kube context")
    assert not ctx.ok and "switch context" in ctx.detail


def test_newest_checkpoint_on_fake_gcs(fake_gcs_factory) -> None:
    from gemma3_ray.gcp import run_reports

    url = fake_gcs_factory(REGION)
    storage = storage_client(url)
    bucket = storage.create_bucket("ckpt-bucket")
    prefix = "gemma3-ray/run1"
    assert run_reports.newest_checkpoint(storage, "ckpt-bucket", prefix) is None
    bucket.blob(f"{prefix}/metrics.jsonl").upload_from_string("{}\n")
    for step in (1, 2):
        bucket.blob(f"{prefix}/checkpoints/TorchTrainer_x/checkpoint_00000{step}/model.pt").upload_from_string("w")
        time.sleep(0.01)  # distinct write times (the server stamps them)
    bucket.blob("gemma3-ray/run2/checkpoints/checkpoint_000009/model.pt").upload_from_string("other run")
    newest = run_reports.newest_checkpoint(storage, "ckpt-bucket", prefix)
    assert newest is not None
    assert newest.path == f"gs://ckpt-bucket/{prefix}/checkpoints/TorchTrainer_x/checkpoint_000002"


def test_rayjob_state_reads_kuberay_status() -> None:
    from gemma3_ray.kube import cluster

    state = cluster.rayjob_state({"metadata": {"name": "t-gemma3-ray"}, "status": {
        "jobStatus": "RUNNING", "jobDeploymentStatus": "Running", "rayClusterName": "t-gemma3-ray-abcde",
        "jobId": "t-gemma3-ray-xyz"}})
    assert (state.job_status, state.deployment_status, state.ray_cluster) == ("RUNNING", "Running", "t-gemma3-ray-abcde")
    fresh = cluster.rayjob_state({"metadata": {"name": "t"}})
    assert (fresh.job_status, fresh.deployment_status) == ("PENDING", "New")


def test_one_kubernetes_connection_per_kube_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """config.clients.Kube makes one connection for its kube context and every API client on it; pointed at
    another context (the same Clients given to a second command) it drops what it made, never what it was given."""
    from gemma3_ray.config import clients as seam

    made: list[tuple[str | None, str | None]] = []
    real = seam.connect
    monkeypatch.setattr(seam, "connect", lambda *where: made.append(where) or real(*where))
    configs = []
    for name in ("a", "b"):
        path = tmp_path / name
        path.write_text(f"apiVersion: v1\nkind: Config\ncurrent-context: {name}\n"
                        f"clusters: [{{name: {name}, cluster: {{server: 'https://{name}.invalid:6443'}}}}]\n"
                        f"users: [{{name: {name}, user: {{token: t}}}}]\n"
                        f"contexts: [{{name: {name}, context: {{cluster: {name}, user: {name}}}}}]\n")
        configs.append(str(path))
    given = FakeCore()
    kube = Kube(core=given)
    kube.point_at(configs[0], None)
    custom, api_ext = kube.get_custom(), kube.get_api_ext()
    assert kube.get_core() is given and kube.get_custom() is custom and made == [(configs[0], None)]
    assert custom.api_client is api_ext.api_client and custom.api_client.configuration.host == "https://a.invalid:6443"
    kube.point_at(configs[0], None)  # the same context: nothing made again
    assert kube.get_custom() is custom and made == [(configs[0], None)]
    kube.point_at(configs[1], None)
    assert kube.get_core() is given and kube.get_custom() is not custom
    assert made == [(configs[0], None), (configs[1], None)]
    assert kube.get_custom().api_client.configuration.host == "https://b.invalid:6443"
