"""`fleet: Kueue on GPUs` (e2e/stages/fleet_kueue.py, e2e/support/fleet_fallback.py) with kubectl's, helm's and
`gemma3-ray`'s answers replaced (no cluster, no Kueue, no scheduler here): a scripted cluster answers what Kueue
and the kube-scheduler would have done, right and wrong, and the stage must pass only on the right answers.

The ClusterQueue the script serves is the one the plugin's own `kueue setup` code makes (kueue.objects) for the
RayJob the real chart renders (helm template) from the stage's values; Kueue's and the scheduler's decisions are
the script's. The real run is `make e2e ARGS="--only first,fleet"`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from e2e.stages import fleet, fleet_kueue
from e2e.support import fleet_fallback as ff
from e2e.support import fleet_nodes
from e2e.support.errors import StageError
from e2e.support.session import run_name
from tests.e2e.test_fleet_stage import FakeKube

RUN = "t1kq"
NS = run_name("f-kueue")
QUOTA_MSG = ("couldn't assign flavors to pod set workers: insufficient unused quota for nvidia.com/gpu in flavor "
             "{cq}-reservation, 16 more needed")


@pytest.fixture(scope="module")
def cq() -> dict[str, Any]:
    """The ClusterQueue `kueue setup -n NS -f <the stage's values> --jobs 1` makes (the plugin's own code)."""
    import yaml
    from gemma3_ray.kueue import objects as ko
    from gemma3_ray.kueue import setup as ks

    from tests.chart.helm_render import helm_template

    rayjob = helm_template([ff.VALUES]).one("RayJob")
    rayjob["metadata"]["labels"][ko.QUEUE_LABEL] = "team-a"
    setup = ks.setup_from(ks.Flags(namespace=NS), rayjob, "fallback", [yaml.safe_load(ff.VALUES.read_text())])
    return next(o for o in ko.objects(setup) if o["kind"] == "ClusterQueue")


def test_the_pools_hold_exactly_each_flavors_gpu_quota(cq: dict[str, Any]) -> None:
    p = ff.plan(cq["metadata"]["name"], cq["spec"])
    assert p.gpu_flavors == tuple(f"{cq['metadata']['name']}-{k}" for k in ("reservation", "flex-start", "on-demand"))
    pools = list(p.pools.values())
    assert [(x.name, x.machine_type, x.nodes, x.capacity) for x in pools] == [
        ("reservation", "a3-ultragpu-8g", 2, "reservation"), ("flex-start", "a3-ultragpu-8g", 2, "flex-start"),
        ("on-demand", "a3-ultragpu-8g", 2, "none")]
    labels = [fleet_nodes.labels(x, 0, RUN) for x in pools]
    assert labels[0]["cloud.google.com/reservation-name"] == "h200-reservation"
    assert labels[1]["cloud.google.com/gke-flex-start"] == "true"
    assert not {"cloud.google.com/reservation-name", "cloud.google.com/gke-flex-start"} & set(labels[2])
    # the CPU flavor holds the heads of the three jobs the GPU flavors admit (kueue.objects, #43)
    cpu = next(f for f in cq["spec"]["resourceGroups"][0]["flavors"] if f["name"] == p.cpu_flavor)
    assert next(r["nominalQuota"] for r in cpu["resources"] if r["name"] == "cpu") == "72600m"  # 3 x (head 24 + submitter 200m)


def test_flavors_out_of_order_or_quota_not_whole_nodes_stop_the_stage(cq: dict[str, Any]) -> None:
    name, spec = cq["metadata"]["name"], json.loads(json.dumps(cq["spec"]))
    flavors = spec["resourceGroups"][0]["flavors"]
    flavors[0], flavors[1] = flavors[1], flavors[0]
    with pytest.raises(StageError, match="want .*reservation.*flex-start"):
        ff.plan(name, spec)
    flavors[0], flavors[1] = flavors[1], flavors[0]
    next(r for r in flavors[0]["resources"] if r["name"] == "nvidia.com/gpu")["nominalQuota"] = "12"
    with pytest.raises(StageError, match="quota 12, not whole a3-ultragpu-8g nodes"):
        ff.plan(name, spec)


class FakeCluster(FakeKube):
    """kubectl, helm and `gemma3-ray` answered from a script of what Kueue and the scheduler did: `admit` maps a
    release's index to the flavor its workers got (absent: it waits on quota), `bind` a worker's default node to
    the node it was bound to instead. Nodes turn Ready once created (as kwok makes them); calls are recorded."""

    def __init__(self, cq: dict[str, Any], admit: dict[int, str] | None = None, bind: dict[str, str] | None = None,
                 status: str | None = None) -> None:
        super().__init__()
        self.cq = cq
        self.flavors = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
        self.admit = {i: self.flavors[i] for i in range(3)} if admit is None else admit
        self.bind, self.status = bind or {}, status
        self.releases: list[str] = []  # installed, not uninstalled

    # helm, commands (kubectl's node create and delete, and wait_for: FakeKube's)
    def h(self, *args: str, **_: Any) -> Any:
        self.calls.append(("helm", *args))
        if args[0] == "install":
            self.releases.append(args[1])
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    def run(self, argv: list[str], **_: Any) -> Any:
        self.calls.append(tuple(argv))
        out = ""
        if argv[1] == "status":
            from gemma3_ray.kueue.check import workload_state

            release = argv[argv.index("--release") + 1]
            out = self.status if self.status is not None else f"Kueue Workload: {workload_state(self._workload(release))}"
        return SimpleNamespace(returncode=0, stdout=out, stderr="")

    # what Kueue and the scheduler did
    def _index(self, release: str) -> int:
        return int(release.rsplit("-", 1)[1]) - 1

    def _workload(self, release: str) -> dict[str, Any]:
        flavor = self.admit.get(self._index(release))
        meta = {"name": f"wl-{release}", "ownerReferences": [{"kind": "RayJob", "name": f"{release}-job"}]}
        if flavor is None:
            msg = QUOTA_MSG.format(cq=self.cq["metadata"]["name"])
            return {"metadata": meta, "status": {"conditions": [
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": msg}]}}
        sets = [("head", self.flavors[-1]), ("workers", flavor), ("submitter", self.flavors[-1])]
        return {"metadata": meta, "status": {"admission": {"podSetAssignments": [
            {"name": s, "flavors": {"cpu": f, "memory": f, "nvidia.com/gpu": f}} for s, f in sets]}}}

    def _pool(self, pool: str) -> list[str]:
        return sorted(n for n, o in self.nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == pool)

    def _pods(self, release: str) -> list[dict[str, Any]]:
        i = self._index(release)
        flavor = self.admit.get(i)
        if flavor is None:
            return []
        pool = next(k for k in ("reservation", "flex-start", "on-demand") if flavor.endswith(k))  # the kind's pool
        head = {"metadata": {"name": f"{release}-head", "labels": {fleet.NODE_TYPE: "head"}},
                "spec": {"nodeName": self._pool("cpu-pool")[i % 3], "containers": [{}]}}
        workers = [{"metadata": {"name": f"{release}-w{j}", "labels": {fleet.NODE_TYPE: "worker"}},
                    "spec": {"nodeName": self.bind.get(n, n),
                             "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}]}}
                   for j, n in enumerate(self._pool(pool))]
        return [head, *workers]

    def items(self, kind: str, ns: str | None, selector: str = "") -> list[dict[str, Any]]:
        if kind == "nodes":
            return list(self.nodes.values())
        if kind == "localqueues":
            return [{"metadata": {"name": "team-a"}, "spec": {"clusterQueue": self.cq["metadata"]["name"]}}]
        if kind == "rayjobs":
            release = selector.split("=", 1)[1]
            admitted = release in self.releases and self._index(release) in self.admit
            return [{"metadata": {"name": f"{release}-job"},
                     "status": {"rayClusterName": f"{release}-rc"} if admitted else {}}] if release in self.releases else []
        if kind == "workloads":
            return [self._workload(r) for r in self.releases]
        if kind == "pods":
            if selector == "ray.io/cluster":
                return [p for r in self.releases for p in self._pods(r)]
            return self._pods(selector.split("=", 1)[1].removesuffix("-rc"))
        raise AssertionError(f"unexpected kubectl get {kind}")

    def get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        return self.cq if kind == "clusterqueue" else self.nodes.get(name)


def _harness(kube: FakeCluster, tmp_path: Path) -> Any:
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "kwok.pid").write_text(f"{os.getpid()} /bin/kwok\n")
    claimed: list[tuple[str, str]] = []
    h = SimpleNamespace(kube=kube, installed=[], out_dir=tmp_path, claimed=claimed,
                        setup=SimpleNamespace(stack=[("cluster", tmp_path)]),
                        session=SimpleNamespace(run_id=RUN, claim=claimed.extend))
    h.namespace = lambda name: name
    h.uninstall = lambda release, ns: kube.calls.append(("uninstall", release, ns)) or kube.releases.remove(release)
    return h


def test_the_fallback_order_admitted_placed_and_the_fourth_waiting_passes(cq: dict[str, Any], tmp_path: Path) -> None:
    kube = FakeCluster(cq)
    h = _harness(kube, tmp_path)
    text = fleet_kueue.kueue_on_gpus(h)
    name = cq["metadata"]["name"]
    assert "f-kq-1 (kueue-fallback-values.yaml): 2 of 2 workers on pool reservation" in text, text
    assert f"admitted on {name}-flex-start; f-kq-2 (kueue-fallback-values.yaml): 2 of 2 workers on pool flex-start" in text
    assert "on pool on-demand (2 x a3-ultragpu-8g, 8 x nvidia-h200-141gb)" in text
    assert "f-kq-4 waits: couldn't assign flavors" in text
    setup = next(c for c in kube.calls if c[:3] == ("gemma3-ray", "kueue", "setup"))
    assert "--apply" in setup and ("-f", str(ff.VALUES)) == setup[-3:-1]
    assert ("clusterqueues.kueue.x-k8s.io", name) in h.claimed and len(h.claimed) == 5  # the CQ and its 4 flavors
    installs = [c[2] for c in kube.calls if c[:2] == ("helm", "install")]
    assert installs == ["f-kq-1", "f-kq-2", "f-kq-3", "f-kq-4"]
    assert [c[1] for c in kube.calls if c[0] == "uninstall"] == installs
    assert kube.nodes == {}, "the simulated pools are deleted after the stage"


def test_a_job_admitted_on_the_wrong_flavor_fails(cq: dict[str, Any], tmp_path: Path) -> None:
    flavors = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
    kube = FakeCluster(cq, admit={0: flavors[0], 1: flavors[2], 2: flavors[1]})  # on-demand before flex-start
    with pytest.raises(StageError, match=f"f-kq-2: workers admitted on \\['{flavors[2]}'\\], want {flavors[1]}"):
        fleet_kueue.kueue_on_gpus(_harness(kube, tmp_path))
    assert kube.nodes == {}


def test_a_worker_on_another_pools_node_fails(cq: dict[str, Any], tmp_path: Path, monkeypatch) -> None:
    import itertools

    monkeypatch.setattr(fleet, "CASE_TAGS", itertools.count(1))
    # f-kq-2 (flex-start) has a worker on an on-demand node (still free then: it matches the accelerator)
    kube = FakeCluster(cq, bind={f"fleet-{RUN}-c1-flex-start-1": f"fleet-{RUN}-c1-on-demand-0"})
    with pytest.raises(StageError, match=f"f-kq-2 .*workers on fleet-{RUN}-c1-on-demand-0, not in pool flex-start"):
        fleet_kueue.kueue_on_gpus(_harness(kube, tmp_path))
    assert kube.nodes == {}


def test_a_fourth_job_admitted_instead_of_waiting_fails(cq: dict[str, Any], tmp_path: Path) -> None:
    flavors = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
    kube = FakeCluster(cq, admit={i: flavors[i] for i in range(3)} | {3: flavors[0]})
    with pytest.raises(StageError, match="f-kq-4: admitted .* instead of waiting"):
        fleet_kueue.kueue_on_gpus(_harness(kube, tmp_path))
    assert kube.nodes == {}


def test_a_wait_that_status_does_not_show_fails(cq: dict[str, Any], tmp_path: Path) -> None:
    kube = FakeCluster(cq, status="Kueue Workload: waiting in the queue (not yet considered by Kueue)")
    with pytest.raises(StageError, match="gemma3-ray status for f-kq-4 does not show Kueue's reason"):
        fleet_kueue.kueue_on_gpus(_harness(kube, tmp_path))


def test_check_waits_wants_kueues_quota_reason_and_no_pods() -> None:
    p = ff.Plan("cq", ("cq-reservation",), "cq-cpu", {}, 2)
    wl = {"metadata": {}, "status": {"conditions": [{"type": "QuotaReserved", "status": "False",
                                                     "message": "the ClusterQueue is inactive"}]}}
    with pytest.raises(StageError, match="without Kueue's quota reason"):
        ff.check_waits(p, "f-kq-2", wl, [])
    wl["status"]["conditions"][0]["message"] = "insufficient unused quota for cpu in flavor cq-cpu"
    with pytest.raises(StageError, match="waits, yet 1 Ray pods exist"):
        ff.check_waits(p, "f-kq-2", wl, [{"metadata": {"name": "p"}}])
    assert ff.check_waits(p, "f-kq-2", wl, []).startswith("insufficient unused quota")
