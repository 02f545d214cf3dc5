"""`cluster create --standard --capacity flex-start|queued`: the GPU pool with the fields GKE requires
for flex-start VMs and queued provisioning, checked by the Container API fake (which refuses a pool
that lacks them), and the refusals made before any call."""

from __future__ import annotations

import pytest
from gemma3_ray import cli
from gemma3_ray.gke import cluster as gke_cluster
from google.api_core import exceptions as gexc
from google.cloud import container_v1 as gke

from tests.plugin.conftest import PROJECT, REGION, GcloudHome
from tests.plugin.container_fakes import FakeContainer, check_pool
from tests.plugin.test_gke_cluster import BASE, PATH, _clients

STANDARD = ["cluster", "create", "--apply", "--standard", "--machine-type", "a3-ultragpu-8g", "--replicas", "2", *BASE]


@pytest.fixture
def gcloud(gcloud_home: GcloudHome) -> GcloudHome:
    gcloud_home.write("ml", {"core": {"project": PROJECT, "account": "me@example.com"},
                             "compute": {"region": REGION, "zone": f"{REGION}-a"}}, activate=True)
    return gcloud_home


@pytest.fixture(autouse=True)
def _fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gke_cluster, "POLL_INTERVAL_S", 0.0)


@pytest.mark.parametrize("capacity", ["flex-start", "queued"])
def test_the_gpu_pool_is_made_as_gke_requires(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str], capacity: str) -> None:
    fake = FakeContainer(PROJECT)
    assert cli.main([*STANDARD, "--capacity", capacity], _clients(fake)) == 0
    assert "autoscaled 0..2 nodes, at most 7 days per VM" in capsys.readouterr().out
    _, gpu = fake.clusters[PATH].node_pools
    assert gpu.config.flex_start
    assert gpu.config.reservation_affinity.consume_reservation_type == gke.ReservationAffinity.Type.NO_RESERVATION
    a = gpu.autoscaling
    assert (a.enabled, a.total_min_node_count, a.total_max_node_count, gpu.initial_node_count) == (True, 0, 2, 0)
    assert a.location_policy == gke.NodePoolAutoscaling.LocationPolicy.ANY
    assert not gpu.management.auto_repair
    assert gpu.queued_provisioning.enabled == (capacity == "queued")


def _pool(**changes: object) -> gke.NodePool:
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "c", standard=True, machine_type="a3-ultragpu-8g",
                                   accelerator="nvidia-h200-141gb", gpus_per_node=8, gpu_nodes=2, zone=f"{REGION}-a",
                                   capacity="queued")
    pool = gke_cluster.gpu_node_pool(spec)
    for path, value in changes.items():
        obj = pool
        *parents, last = path.split("__")
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)
    return pool


@pytest.mark.parametrize(("change", "message"), [
    ({"config__reservation_affinity": gke.ReservationAffinity(
        consume_reservation_type=gke.ReservationAffinity.Type.ANY_RESERVATION)}, "NO_RESERVATION"),
    ({"initial_node_count": 2}, "from 0 nodes"),
    ({"autoscaling__enabled": False}, "from 0 nodes"),
    ({"autoscaling__location_policy": gke.NodePoolAutoscaling.LocationPolicy.BALANCED}, "location policy ANY"),
    ({"management__auto_repair": True}, "auto-repair"),
    ({"config__flex_start": False}, "needs flex-start"),
])
def test_the_fake_refuses_what_gke_refuses(change: dict[str, object], message: str) -> None:
    check_pool(_pool())  # the plugin's pool passes
    with pytest.raises(gexc.InvalidArgument, match=message):
        check_pool(_pool(**change))


@pytest.mark.parametrize(("extra", "message"), [
    (["--capacity", "flex-start", "--machine-type", "a4x-highgpu-4g"], "not offered as flex-start"),
    (["--capacity", "queued", "--reservation", "my-res", "--zone", "us-central1-a"], "takes no --reservation"),
])
def test_refused_before_any_call(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str], extra: list[str], message: str) -> None:
    fake = FakeContainer(PROJECT)
    assert cli.main([*STANDARD, *extra], _clients(fake)) == 2
    assert message in capsys.readouterr().err
    assert fake.calls == []


def test_autopilot_takes_no_capacity(gcloud: GcloudHome, capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeContainer(PROJECT)
    assert cli.main(["cluster", "create", "--capacity", "flex-start", *BASE], _clients(fake)) == 2
    assert "add --standard" in capsys.readouterr().err
    assert fake.calls == []
