"""The simulated GKE pools (e2e/support/fleet_nodes.py) against what the chart renders and the plugin creates.

For every values file whose workers want GPUs and for `gemma3-ray values --machine-type` of every GPU family: the
worker pod `helm template` renders fits each node of its pool and no other, one per node, with the node's GPUs;
the head fits the CPU pool and no GPU node. The plugin's own `cluster create` pools (gpu_node_pool) take the
workers its `values` writes. The Node objects are accepted by a real kube-apiserver. The filters are
e2e/support/placement.py's stand-in for the scheduler; the `fleet` stages use the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gemma3_ray.gke import cluster as gke_cluster

from e2e.support import fleet_cases, fleet_nodes, placement
from e2e.support.fleet_nodes import Pool, cpu_pool
from tests.plugin.kube_apiserver import kubectl

ROOT = Path(__file__).resolve().parents[2]
HELM = os.environ.get("HELM", str(ROOT / ".tools" / "bin" / "helm"))
RUN = "t0fleet"
# a node like the local cluster's real one: no GKE label, no taint, room for anything
REAL_NODE = {"metadata": {"name": "localhost", "labels": {"kubernetes.io/hostname": "localhost"}}, "spec": {},
             "status": {"allocatable": {"cpu": "1000", "memory": "10000Gi", "ephemeral-storage": "1000Gi",
                                        "pods": "110"}}}


def render(values: Path) -> dict[str, dict[str, Any]]:
    """The head and worker pod templates `helm template` renders from the file (RayJob or RayCluster)."""
    out = subprocess.run([HELM, "template", "t", str(fleet_cases.CHART), "-n", "ml", "-f", str(values)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for doc in yaml.safe_load_all(out.stdout):
        if doc and doc.get("kind") in ("RayJob", "RayCluster"):
            spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
            return {"head": spec["headGroupSpec"]["template"]["spec"],
                    "worker": spec["workerGroupSpecs"][0]["template"]["spec"]}
    raise AssertionError(f"{values}: no RayJob or RayCluster rendered")


def assert_placed(case: fleet_cases.Case) -> None:
    pods = render(case.values)
    gpu_nodes = fleet_nodes.nodes([case.gpu_pool], RUN)
    cpu_nodes = fleet_nodes.nodes([p for p in case.pools if not p.gpus], RUN)
    assert len(gpu_nodes) == case.replicas
    worker, head = pods["worker"], pods["head"]
    for n in gpu_nodes:
        assert placement.why_not(worker, n) == "", (case.name, n["metadata"]["name"])
        assert placement.requests(worker)["nvidia.com/gpu"] == float(n["status"]["allocatable"]["nvidia.com/gpu"])
        assert placement.why_not(head, n).startswith("node(s) had untolerated taint {nvidia.com/gpu"), case.name
    for n in [*cpu_nodes, REAL_NODE]:
        assert placement.why_not(worker, n) == "node(s) didn't match Pod's node affinity/selector", case.name
    assert any(placement.why_not(head, n) == "" for n in cpu_nodes), case.name


CASES, LEFT = fleet_cases.values_cases()


def test_the_shipped_gpu_files_are_cases_and_the_rest_say_why() -> None:
    assert {c.values.name for c in CASES} == {"tutorial.yaml", "h200-8gpu.yaml", "h100-8gpu.yaml", "l4-dev.yaml"}
    assert set(LEFT) == {"e2e.yaml", "local.yaml", "shared-cluster.yaml"} and "Kueue" in LEFT["shared-cluster.yaml"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_shipped_values_file_fits_its_pool_one_worker_per_node(case: fleet_cases.Case) -> None:
    assert_placed(case)


@pytest.mark.parametrize("machine", fleet_cases.families())
def test_values_of_each_gpu_family_fit_that_machine(machine: str, tmp_path: Path) -> None:
    assert_placed(fleet_cases.family_case(machine, fleet_cases.family_values(machine, tmp_path)))


def test_the_families_cover_every_gpu_series_machine_shapes_knows() -> None:
    assert {"-".join(m.split("-")[:2]) for m in fleet_cases.families()} == {
        "a2-highgpu", "a2-ultragpu", "a3-edgegpu", "a3-highgpu", "a3-megagpu", "a3-ultragpu", "a4-highgpu",
        "a4x-highgpu", "g2-standard", "g4-standard"}


def test_what_cannot_fit_is_refused_with_the_schedulers_reason() -> None:
    short, no_res = fleet_cases.cannot_fit_cases()
    worker = render(short.values)["worker"]
    (node,) = fleet_nodes.nodes([short.gpu_pool], RUN)
    taken = json.loads(json.dumps(node))  # the node with one worker bound: no GPU left
    taken["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    assert placement.why_not(worker, node) == "" and placement.why_not(worker, taken) == "Insufficient nvidia.com/gpu"
    for n in fleet_nodes.nodes([no_res.gpu_pool], RUN):
        assert no_res.pending in placement.why_not(worker, n)


def test_a_worker_without_the_gpu_toleration_is_kept_off_gpu_nodes() -> None:
    """The taint does its job (ExtendedResourceToleration is what adds the toleration when a pod asks for GPUs)."""
    (n,) = fleet_nodes.nodes([Pool("gpu-pool", "a3-highgpu-8g", 1)], RUN)
    pod = {"nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
           "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}
    assert placement.why_not(pod, n) == "node(s) had untolerated taint {nvidia.com/gpu: present}"
    pod["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert placement.why_not(pod, n) == ""


def test_the_local_api_server_adds_the_gpu_toleration_as_gke_does() -> None:
    text = (ROOT / "e2e" / "cluster" / "cluster.sh").read_text()
    flag = next(w for w in text.split() if w.startswith("--enable-admission-plugins="))
    assert "ExtendedResourceToleration" in flag.split("=", 1)[1].split(",")


@pytest.mark.parametrize(("machine", "reservation"), [("a4-highgpu-8g", "my-b200-res"), ("g2-standard-24", ""),
                                                      ("a3-ultragpu-8g", "projects/acme-ml-1/reservations/h200-res")])
def test_the_plugins_own_cluster_create_pool_takes_the_workers_its_values_write(
        machine: str, reservation: str, tmp_path: Path) -> None:
    """gke/cluster.py's gpu_node_pool as GKE makes it (accelerator, driver LATEST, reservation affinity) against
    `gemma3-ray values --machine-type M [--reservation R]` rendered by the chart."""
    from gemma3_ray.config import machine_shapes

    shape = machine_shapes.shape_for_machine_type(machine)
    spec = gke_cluster.ClusterSpec(project="acme", region="us-central1", name="c", standard=True, machine_type=machine,
                                   accelerator=shape.accelerator, gpus_per_node=shape.gpus_per_node, gpu_nodes=2,
                                   zone="us-central1-b", reservation=reservation or None)
    pool = fleet_nodes.pool_from_plugin(gke_cluster.gpu_node_pool(spec))
    assert (pool.name, pool.nodes, pool.driver, pool.capacity) == (
        gke_cluster.GPU_POOL, 2, "latest", "reservation" if reservation else "none")
    values = fleet_cases.family_values(machine, tmp_path)
    if reservation:
        doc = yaml.safe_load(values.read_text())
        doc["capacity"] = {"type": "reservation", "reservation": reservation}
        values.write_text(yaml.safe_dump(doc))
    assert_placed(fleet_cases.Case("plugin", values, (cpu_pool(), pool), 2))


def test_machine_for_picks_the_smallest_machine_that_fits_and_refuses_what_none_fits() -> None:
    assert fleet_nodes.machine_for("nvidia-l4", 1, 6, 20) == "g2-standard-8"
    with pytest.raises(ValueError, match="no machine type of 8 x nvidia-h100-80gb fits"):
        fleet_nodes.machine_for("nvidia-h100-80gb", 8, 500, 10)


def test_allocatable_follows_gkes_reservation_table() -> None:
    # 4 vCPU / 16 GiB: CPU 60+10+10 m reserved; memory 1 + 0.8 + 0.8 GiB + 100 MiB eviction
    assert fleet_nodes.allocatable(4, 16) == (3920, int(16 * 1024 - 2.6 * 1024 - 100))


def test_the_nodes_are_valid_objects_for_a_real_api_server(kube_apiserver: Path) -> None:
    pools = [cpu_pool(), Pool("gpu-pool", "a4-highgpu-8g", 2, capacity="reservation",
                              reservation="projects/acme/reservations/b200/reservationBlocks/blk-1"),
             Pool("spot-pool", "g2-standard-24", 1, capacity="spot"), Pool("q-pool", "a3-megagpu-8g", 1, capacity="queued")]
    objs = fleet_nodes.nodes(pools, RUN)
    kubectl(kube_apiserver, "create", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    try:
        got = {n["metadata"]["name"]: n for n in json.loads(kubectl(
            kube_apiserver, "get", "nodes", "-l", f"{fleet_nodes.RUN_LABEL}={RUN}", "-o", "json"))["items"]}
        assert set(got) == {o["metadata"]["name"] for o in objs}
        for o in objs:
            n = got[o["metadata"]["name"]]
            assert n["metadata"]["labels"] == o["metadata"]["labels"]
            # the API server's TaintNodesByCondition adds node.kubernetes.io/not-ready until a kubelet (kwok) says Ready
            assert [t for t in n["spec"].get("taints", []) if t["key"] != "node.kubernetes.io/not-ready"] == \
                o["spec"].get("taints", [])
            assert n["status"]["allocatable"] == o["status"]["allocatable"]
        b200 = got[f"fleet-{RUN}-gpu-pool-0"]["metadata"]["labels"]
        assert (b200["cloud.google.com/reservation-name"], b200["cloud.google.com/reservation-project"],
                b200["cloud.google.com/reservation-blocks"]) == ("b200", "acme", "blk-1")
    finally:
        kubectl(kube_apiserver, "delete", "nodes", "-l", f"{fleet_nodes.RUN_LABEL}={RUN}")
