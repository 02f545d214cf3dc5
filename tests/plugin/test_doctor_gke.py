"""doctor's GKE checks (cluster, Ray add-on, workload pool) and the GPU driver rule: the pinned torch's
CUDA build against the driver GKE's DEFAULT/LATEST gives, resolved through GKE's published maps
(served on 127.0.0.1 by tests/plugin/driver_maps.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.gke import cluster as gke_cluster
from gemma3_ray.gke import gpu_driver
from gemma3_ray.release import doctor_gke
from google.cloud import container_v1 as gke

from tests.plugin.conftest import PROJECT, REGION
from tests.plugin.container_fakes import FakeContainer
from tests.plugin.driver_maps import NEW_GKE, OLD_GKE, driver_maps  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[2]
LATEST = gke.GPUDriverInstallationConfig.GPUDriverVersion.LATEST
DEFAULT = gke.GPUDriverInstallationConfig.GPUDriverVersion.DEFAULT
DISABLED = gke.GPUDriverInstallationConfig.GPUDriverVersion.INSTALLATION_DISABLED


def _dep(cluster: str | None = "trainers"):  # type: ignore[no-untyped-def]
    return resolve(Overrides(project=PROJECT, region=REGION, cluster=cluster), None, None)


def _autopilot(fake: FakeContainer, **kw) -> gke.Cluster:  # type: ignore[no-untyped-def]
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "trainers")
    cluster = gke_cluster.desired_cluster(spec)
    for k, v in kw.items():
        setattr(cluster, k, v)
    return fake.ready(REGION, cluster)


def test_the_rule_comes_from_the_trainer_pin(tmp_path: Path) -> None:
    need = gpu_driver.requirement(ROOT)
    pin = next(line for line in (ROOT / "trainer/requirements.txt").read_text().splitlines() if line.startswith("torch=="))
    assert need is not None and pin.startswith(f"torch=={need.torch}.")
    assert (need.torch, need.cuda, need.min_driver) == ("2.11", "13.0", 580)
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer/requirements.txt").write_text("torch==2.99.0\n")
    assert gpu_driver.requirement(tmp_path) is None  # a torch the table does not know: no guess


@pytest.mark.usefixtures("driver_maps")
def test_resolve_follows_gke_to_cos_then_the_cos_driver_list() -> None:
    new = gpu_driver.resolve(NEW_GKE, "nvidia-h100-80gb", "LATEST")
    assert (new.version, new.major) == ("580.82.07", 580) and "COS 18867.199.28" in new.how
    assert gpu_driver.resolve(NEW_GKE, "nvidia-h100-80gb", "default").version == "570.172.08"
    assert gpu_driver.resolve("1.99.0-gke.1", "nvidia-l4", "LATEST").version is None
    assert gpu_driver.resolve(f"v{NEW_GKE}", "nvidia-l4", "LATEST").version == "580.82.07"
    maps = '{"entries": [{"gke_version": "1.33.5-gke.108000", "image": "cos-121-1-2-3"}]}'
    assert gpu_driver.cos_build_for(NEW_GKE, maps) is None  # exact versions, not a prefix of a longer one
    assert gpu_driver.resolve(NEW_GKE, "nvidia-tesla-t4", "LATEST").version is None


@pytest.mark.usefixtures("driver_maps")
def test_doctor_fails_on_a_missing_cluster_and_an_off_add_on_then_passes() -> None:
    fake = FakeContainer(PROJECT, version=NEW_GKE)
    clients = Clients(project=PROJECT, container=fake)
    (only,) = doctor_gke.checks(_dep(), clients)
    assert not only.ok and "does not exist: run `gemma3-ray cluster create`" in only.detail
    assert "no cluster named" in doctor_gke.checks(_dep(None), clients)[0].detail

    bare = gke.Cluster(name="trainers", initial_node_count=1)
    fake.ready(REGION, bare)
    by_name = {c.name: c for c in doctor_gke.checks(_dep(), clients)}
    assert by_name["GKE cluster"].ok
    assert not by_name["Ray operator add-on"].ok and "cluster create --apply --cluster trainers" in \
        by_name["Ray operator add-on"].detail
    assert not by_name["Workload pool"].ok and "Workload Identity is off" in by_name["Workload pool"].detail

    fake.clusters.clear()
    _autopilot(fake)
    results = doctor_gke.checks(_dep(), clients, {"workers": {"accelerator": "nvidia-h100-80gb"}})
    assert [c.line() for c in results if not c.ok] == []
    driver = next(c for c in results if c.name.startswith("GPU driver"))
    assert driver.line().startswith("[ok] GPU driver (nvidia-h100-80gb, Autopilot): driver 580.82.07")


@pytest.mark.parametrize(("gke_version", "label", "expect"), [
    (NEW_GKE, "latest", "[ok]"),
    (NEW_GKE, "default", "use LATEST"),
    (OLD_GKE, "latest", "upgrade the cluster to a GKE version whose LATEST driver is new enough"),
    (NEW_GKE, "", "driver 570.172.08 (DEFAULT"),  # no selector: Autopilot installs DEFAULT
])
@pytest.mark.usefixtures("driver_maps")
def test_autopilot_driver_warning_follows_the_values_and_the_gke_version(gke_version: str, label: str, expect: str) -> None:
    fake = FakeContainer(PROJECT, version=gke_version)
    _autopilot(fake)
    values = {"workers": {"accelerator": "nvidia-b200", "gpuDriverVersion": label}}
    (check,) = doctor_gke.driver_checks(fake.clusters[next(iter(fake.clusters))], values)
    assert check.ok  # a warning never fails doctor
    assert expect in check.line()
    if expect != "[ok]":
        assert check.line().startswith("[warn]") and "needs NVIDIA driver >= 580" in check.line()


@pytest.mark.usefixtures("driver_maps")
def test_standard_pools_are_checked_one_by_one() -> None:
    fake = FakeContainer(PROJECT, version=NEW_GKE)
    spec = gke_cluster.ClusterSpec(PROJECT, REGION, "trainers", standard=True, machine_type="g2-standard-8",
                                   accelerator="nvidia-l4", gpus_per_node=1, zone=f"{REGION}-a")
    cluster = gke_cluster.desired_cluster(spec)
    extra = gke_cluster.gpu_node_pool(spec)
    extra.name = "old-pool"
    extra.config.accelerators[0].gpu_driver_installation_config.gpu_driver_version = DEFAULT
    manual = gke_cluster.gpu_node_pool(spec)
    manual.name = "manual-pool"
    manual.config.accelerators[0].gpu_driver_installation_config.gpu_driver_version = DISABLED
    unset = gke_cluster.gpu_node_pool(spec)
    unset.name = "unset-pool"
    unset.config.accelerators[0].gpu_driver_installation_config = gke.GPUDriverInstallationConfig()
    cluster.node_pools = [*cluster.node_pools, extra, manual, unset]
    checks = {c.name: c.line() for c in doctor_gke.driver_checks(fake.ready(REGION, cluster), None)}
    assert checks["GPU driver (node pool gpu-pool)"].startswith("[ok]")
    assert checks["GPU driver (node pool old-pool)"].startswith("[warn]") and "570.172.08" in \
        checks["GPU driver (node pool old-pool)"]
    assert "GKE does not install the driver here (INSTALLATION_DISABLED)" in checks["GPU driver (node pool manual-pool)"]
    assert "the pool does not say which driver GKE installs" in checks["GPU driver (node pool unset-pool)"]
    assert "GPU driver (node pool cpu-pool)" not in checks


def test_offline_the_driver_is_unknown_and_doctor_says_what_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.plugin.conftest import free_port

    monkeypatch.setattr(gpu_driver, "GKE_TO_COS_URL", f"http://127.0.0.1:{free_port()}/gke-to-cos.json")
    fake = FakeContainer(PROJECT, version=NEW_GKE)
    _autopilot(fake)
    (check,) = doctor_gke.driver_checks(fake.clusters[next(iter(fake.clusters))], None)
    assert check.line().startswith("[warn] GPU driver (nvidia-b200, Autopilot): could not tell which driver LATEST gives")
    assert "nvidia-smi" in check.line()
