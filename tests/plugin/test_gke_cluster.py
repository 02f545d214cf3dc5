"""`cluster create | delete | status` against the Container API and Resource Manager fakes (operations,
409, 403, 404, one update per request), with settings read from a real gcloud configuration."""

from __future__ import annotations

import io

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.gke import cluster as gke_cluster
from gemma3_ray.utils.errors import UserError
from google.cloud import container_v1 as gke

from tests.plugin.conftest import PROJECT, PROJECT_NUMBER, REGION, GcloudHome
from tests.plugin.container_fakes import RESOURCE_EXHAUSTED, FakeContainer, FakeResourceManager
from tests.plugin.gcp_fakes import FakeServiceUsage

PATH = f"projects/{PROJECT}/locations/{REGION}/clusters/gemma3-ray"
BASE = ["--no-kube-context"]


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gke_cluster, "POLL_INTERVAL_S", 0.0)


@pytest.fixture
def gcloud(gcloud_home: GcloudHome) -> GcloudHome:
    gcloud_home.write("ml", {"core": {"project": PROJECT, "account": "me@example.com"},
                             "compute": {"region": REGION, "zone": f"{REGION}-a"}}, activate=True)
    return gcloud_home


def _clients(container: FakeContainer, rm: FakeResourceManager | None = None) -> Clients:
    usage = container.usage or FakeServiceUsage(PROJECT_NUMBER, enabled={"container.googleapis.com"})
    return Clients(project=PROJECT, container=container, resource_manager=rm or FakeResourceManager(PROJECT),
                   service_usage=usage)


def test_autopilot_plan_then_create_then_nothing_to_do(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeContainer(PROJECT, polls_per_state=2)
    assert cli.main(["cluster", "create", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    assert f"+ create Autopilot cluster gemma3-ray in {REGION}" in out
    assert "Dry run: nothing changed (1 change(s) planned)" in out
    assert "permissions: you hold all 4" in out
    assert fake.mutations() == [] and fake.clusters == {}

    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    progress = [line.split(": ")[1].split(" ")[0] for line in out.splitlines() if "create cluster gemma3-ray:" in line]
    assert progress == ["PENDING", "RUNNING", "DONE"], out
    assert "Done: 1 change(s) applied" in out
    assert f"gcloud container clusters get-credentials gemma3-ray --location {REGION} --project {PROJECT}" in out
    made = fake.clusters[PATH]
    assert made.status == gke.Cluster.Status.RUNNING and made.autopilot.enabled
    ray = made.addons_config.ray_operator_config
    assert ray.enabled and ray.ray_cluster_logging_config.enabled and ray.ray_cluster_monitoring_config.enabled
    assert made.workload_identity_config.workload_pool == f"{PROJECT}.svc.id.goog"
    assert list(made.node_pools) == []

    before = len(fake.mutations())
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    assert "Nothing to do: the cluster is ready." in out and "  + " not in out
    assert len(fake.mutations()) == before


def test_existing_cluster_gets_the_ray_add_on_and_workload_identity_one_update_at_a_time(
    gcloud: GcloudHome, capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeContainer(PROJECT)
    bare = gke.Cluster(name="trainers", initial_node_count=1,
                       monitoring_config=gke.MonitoringConfig(managed_prometheus_config=gke.ManagedPrometheusConfig(enabled=True)))
    fake.ready(REGION, bare)
    args = ["cluster", "create", "--cluster", "trainers", *BASE]
    assert cli.main(args, _clients(fake)) == 0
    out = capsys.readouterr().out
    assert "= Standard cluster trainers" in out
    assert "+ enable on trainers: Ray operator add-on, Ray cluster logging, Ray cluster monitoring" in out
    assert f"+ enable Workload Identity on trainers (pool {PROJECT}.svc.id.goog)" in out

    assert cli.main([*args, "--apply"], _clients(fake)) == 0
    assert [c for c in fake.mutations() if c[0] == "update_cluster"] == [("update_cluster", bare_path := PATH.replace(
        "gemma3-ray", "trainers"))] * 2
    cluster = fake.clusters[bare_path]
    assert cluster.addons_config.ray_operator_config.ray_cluster_monitoring_config.enabled
    assert cluster.workload_identity_config.workload_pool == f"{PROJECT}.svc.id.goog"
    assert gke_cluster.gaps(cluster, gke_cluster.ClusterSpec(PROJECT, REGION, "trainers")) == []


def test_standard_cluster_with_a_gpu_pool_on_a_specific_reservation(
    gcloud: GcloudHome, capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeContainer(PROJECT)
    args = ["cluster", "create", "--apply", "--standard", "--machine-type", "a3-highgpu-8g", "--reservation", "h100-res",
            "--replicas", "2", *BASE]
    assert cli.main(args, _clients(fake)) == 0
    assert "on reservation h100-res (specific)" in capsys.readouterr().out
    cluster = fake.clusters[PATH]
    assert not cluster.autopilot.enabled
    assert cluster.monitoring_config.managed_prometheus_config.enabled  # Ray cluster monitoring needs it
    cpu, gpu = cluster.node_pools
    assert (cpu.name, cpu.config.machine_type, cpu.initial_node_count) == ("cpu-pool", "e2-standard-32", 1)
    assert list(cpu.locations) == [f"{REGION}-a"]  # one head node, not one per zone of the region
    assert (gpu.config.machine_type, gpu.initial_node_count, list(gpu.locations)) == ("a3-highgpu-8g", 2, [f"{REGION}-a"])
    (accel,) = gpu.config.accelerators
    assert (accel.accelerator_type, accel.accelerator_count) == ("nvidia-h100-80gb", 8)
    assert accel.gpu_driver_installation_config.gpu_driver_version == \
        gke.GPUDriverInstallationConfig.GPUDriverVersion.LATEST
    res = gpu.config.reservation_affinity
    assert res.consume_reservation_type == gke.ReservationAffinity.Type.SPECIFIC_RESERVATION
    assert (res.key, list(res.values)) == ("compute.googleapis.com/reservation-name", ["h100-res"])
    for pool in (cpu, gpu):
        assert pool.config.workload_metadata_config.mode == gke.WorkloadMetadataConfig.Mode.GKE_METADATA
        # what gcloud sets when --scopes is not given (container_v1 adds none): nodes can pull from Artifact Registry
        assert set(pool.config.oauth_scopes) == set(gke_cluster.GKE_DEFAULT_SCOPES)
        assert "https://www.googleapis.com/auth/devstorage.read_only" in pool.config.oauth_scopes
        assert pool.management.auto_repair and pool.management.auto_upgrade


def test_standard_needs_a_machine_type_and_zone_before_any_call(gcloud_home: GcloudHome,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeContainer(PROJECT)
    base = ["cluster", "create", "--standard", "--project", PROJECT, "--region", REGION, *BASE]
    assert cli.main(base, _clients(fake)) == 2
    assert "needs a machine type: pass --machine-type" in capsys.readouterr().err
    assert cli.main([*base, "--machine-type", "g2-standard-8"], _clients(fake)) == 2
    assert "needs its zone" in capsys.readouterr().err
    assert fake.calls == []


def test_an_error_inside_the_finished_operation_fails_the_command(
    gcloud: GcloudHome, capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeContainer(PROJECT, fail_next=(RESOURCE_EXHAUSTED, "Insufficient regional quota to satisfy request: "
                                             "resource \"CPUS\": request requires '12.0' and is short '4.0'."))
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 1
    captured = capsys.readouterr()
    assert "create cluster gemma3-ray failed: Insufficient regional quota" in captured.err
    assert "Done:" not in captured.out
    assert fake.clusters[PATH].status == gke.Cluster.Status.ERROR
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 1
    assert "Cluster gemma3-ray is ERROR" in capsys.readouterr().err


def test_missing_permissions_are_named_before_any_change(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    viewer = {"container.clusters.get", "container.operations.get"}
    fake = FakeContainer(PROJECT, allowed=viewer)
    rm = FakeResourceManager(PROJECT, granted=viewer)
    assert cli.main(["cluster", "create", *BASE], _clients(fake, rm)) == 0
    out = capsys.readouterr().out
    assert "! permissions MISSING on the project: container.clusters.create (in roles/container.clusterAdmin); " \
           "container.clusters.update (in roles/container.clusterAdmin)" in out
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake, rm)) == 1
    err = capsys.readouterr().err
    assert "Permission denied before any change: you lack container.clusters.create, container.clusters.update" in err
    assert "roles/container.clusterAdmin" in err
    assert fake.mutations() == []
    assert rm.calls and rm.calls[0][1] == f"projects/{PROJECT}"

    # Without the preflight's word (e.g. a custom role), the API's own 403 is one sentence too.
    fake.allowed = viewer
    def forbidden() -> None:
        raise fake_forbidden(fake)

    with pytest.raises(UserError) as raised:
        gke_cluster._call("create", PATH, forbidden)
    err_text = str(raised.value)
    assert "'container.clusters.create'" in err_text and "roles/" in err_text


def fake_forbidden(fake: FakeContainer) -> Exception:
    try:
        fake.create_cluster(request={"parent": f"projects/{PROJECT}/locations/{REGION}",
                                     "cluster": gke.Cluster(name="x", autopilot=gke.Autopilot(enabled=True))})
    except Exception as exc:
        return exc
    raise AssertionError("the fake allowed a create without the permission")


def test_a_concurrent_create_409_is_accepted(gcloud: GcloudHome) -> None:
    fake = FakeContainer(PROJECT)
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "gemma3-ray")
    lines: list[str] = []
    plan = gke_cluster.plan_create(fake, spec, lines.append)
    fake.create_cluster(request={"parent": spec.parent, "cluster": gke_cluster.desired_cluster(spec)})  # another run
    for action in plan.actions:
        action.run()
    assert any("created meanwhile" in line for line in lines)
    assert [c[0] for c in fake.mutations()] == ["create_cluster", "create_cluster"]
    # it waited for the other run's cluster instead of calling a PROVISIONING cluster ready
    assert [line.split(": ")[1].split(" ")[0] for line in lines if "cluster gemma3-ray:" in line] == [
        "PROVISIONING", "RUNNING"]
    assert fake.clusters[spec.path].status == gke.Cluster.Status.RUNNING


def test_a_cluster_still_provisioning_is_waited_for_not_called_ready(gcloud: GcloudHome,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeContainer(PROJECT, polls_per_state=3)
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "gemma3-ray")
    fake.create_cluster(request={"parent": spec.parent, "cluster": gke_cluster.desired_cluster(spec)})  # interrupted
    assert cli.main(["cluster", "create", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    assert "+ wait for the operation running on gemma3-ray to finish (PROVISIONING)" in out and "Nothing to do" not in out
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 0
    assert "cluster gemma3-ray: RUNNING" in capsys.readouterr().out
    assert fake.clusters[spec.path].status == gke.Cluster.Status.RUNNING


def test_an_update_while_another_operation_runs_is_one_sentence(gcloud: GcloudHome) -> None:
    fake = FakeContainer(PROJECT)
    fake.create_cluster(request={"parent": f"projects/{PROJECT}/locations/{REGION}",
                                 "cluster": gke.Cluster(name="gemma3-ray", initial_node_count=1)})
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "gemma3-ray")
    with pytest.raises(gke_cluster.ClusterError, match="another operation is running on it"):
        gke_cluster._update(fake, spec, lambda _: None, "x", desired_workload_identity_config=gke.WorkloadIdentityConfig(
            workload_pool=spec.workload_pool))


def test_delete_asks_refuses_without_a_tty_and_is_idempotent(
    gcloud: GcloudHome, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeContainer(PROJECT)
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake)) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    assert cli.main(["cluster", "delete", "--apply", *BASE], _clients(fake)) == 2
    assert "no terminal to ask on; pass --yes" in capsys.readouterr().err
    assert cli.main(["cluster", "delete", "--dry-run", *BASE], _clients(fake)) == 0
    assert f"- delete cluster {PATH}" in capsys.readouterr().out

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("gemma3-rai\n"))
    assert cli.main(["cluster", "delete", "--apply", *BASE], _clients(fake)) == 1
    assert "Not deleted" in capsys.readouterr().out
    assert [c for c in fake.mutations() if c[0] == "delete_cluster"] == []

    monkeypatch.setattr("sys.stdin", Tty("gemma3-ray\n"))
    assert cli.main(["cluster", "delete", "--apply", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    assert "delete cluster gemma3-ray: DONE" in out and "Deleted cluster gemma3-ray." in out
    assert fake.clusters == {}
    assert cli.main(["cluster", "delete", "--apply", "--yes", *BASE], _clients(fake)) == 0
    assert "Nothing to delete" in capsys.readouterr().out


def test_status_reports_the_add_on_pool_and_driver_or_that_it_is_missing(
    gcloud: GcloudHome, capsys: pytest.CaptureFixture[str],
) -> None:
    fake = FakeContainer(PROJECT)
    assert cli.main(["cluster", "status", *BASE], _clients(fake)) == 1
    assert "does not exist" in capsys.readouterr().out
    assert cli.main(["cluster", "create", "--apply", "--standard", "--machine-type", "g2-standard-8", *BASE],
                    _clients(fake)) == 0
    capsys.readouterr()
    assert cli.main(["cluster", "status", *BASE], _clients(fake)) == 0
    out = capsys.readouterr().out
    assert "Cluster gemma3-ray (Standard)" in out and "RUNNING" in out
    assert "Ray operator add-on: on; Ray cluster logging: on; monitoring: on" in out
    assert "node pool gpu-pool: 1 × g2-standard-8, 1 × nvidia-l4 (driver LATEST)" in out


def test_offline_plan_without_credentials(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    assert cli.main(["cluster", "create", *BASE], Clients(project=PROJECT)) == 0
    out = capsys.readouterr().out
    assert "[not checked: not logged in]" in out and "permissions: not checked" in out
    assert cli.main(["cluster", "create", "--apply", *BASE], Clients(project=PROJECT)) == 1
    assert "Not logged in" in capsys.readouterr().err


def test_an_empty_project_gets_the_container_api_first(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    usage = FakeServiceUsage(PROJECT_NUMBER, enabled=set())
    fake = FakeContainer(PROJECT, usage=usage)
    rm = FakeResourceManager(PROJECT, api_disabled=True)
    assert cli.main(["cluster", "create", *BASE], _clients(fake, rm)) == 0
    out = capsys.readouterr().out
    assert "+ enable API container.googleapis.com" in out and "+ create Autopilot cluster gemma3-ray" in out
    assert "permissions: not checked (The cloudresourcemanager.googleapis.com API is disabled in project" in out
    assert usage.mutations() == [] and fake.mutations() == []
    assert cli.main(["cluster", "create", "--apply", *BASE], _clients(fake, rm)) == 0
    assert usage.enabled == {"container.googleapis.com"}
    assert fake.clusters[PATH].status == gke.Cluster.Status.RUNNING


def test_the_nodes_run_as_a_given_service_account(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = f"gke-nodes@{PROJECT}.iam.gserviceaccount.com"
    fake = FakeContainer(PROJECT)
    assert cli.main(["cluster", "create", "--apply", "--node-service-account", nodes, *BASE], _clients(fake)) == 0
    assert f"nodes as {nodes}" in capsys.readouterr().out
    assert fake.clusters[PATH].autoscaling.autoprovisioning_node_pool_defaults.service_account == nodes
    fake.clusters.clear()
    args = ["cluster", "create", "--apply", "--standard", "--machine-type", "g2-standard-8", "--node-service-account"]
    assert cli.main([*args, nodes, *BASE], _clients(fake)) == 0
    assert {p.config.service_account for p in fake.clusters[PATH].node_pools} == {nodes}
    capsys.readouterr()
    assert cli.main([*args, "not-an-email", *BASE], _clients(FakeContainer(PROJECT))) == 2
    err = capsys.readouterr().err
    assert "Invalid --node-service-account" in err and "not-an-email" not in err


def test_a_cluster_already_being_deleted_is_waited_for(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeContainer(PROJECT, polls_per_state=2)
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "gemma3-ray")
    fake.ready(REGION, gke_cluster.desired_cluster(spec))
    fake.delete_cluster(request={"name": spec.path})  # someone else's delete
    assert cli.main(["cluster", "delete", "--apply", "--yes", *BASE], _clients(fake)) == 0
    assert "already being deleted (STOPPING)" in capsys.readouterr().out
    assert fake.clusters == {}
    assert [c for c in fake.mutations() if c[0] == "delete_cluster"] == [("delete_cluster", spec.path)]
