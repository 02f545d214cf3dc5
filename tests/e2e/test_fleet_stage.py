"""e2e/stages/fleet.py with kubectl's and helm's answers replaced (no cluster is started here): "not run" off the
local cluster or without kwok; the nodes created, waited on and deleted on every exit path; what the scheduler did
judged right and wrong. The kwok start of e2e/cluster/operators.sh with a stand-in binary that records how it was
started, and kwok's RBAC in e2e/cluster/manifests.py. The real run is `make e2e ARGS="--only first,fleet"`."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from e2e.stages import fleet
from e2e.support import fleet_cases, fleet_nodes
from e2e.support.errors import NotRun, StageError
from e2e.support.session import run_name

ROOT = Path(__file__).resolve().parents[2]
RUN = "t1fleet"


def _pod(name: str, kind: str, node: str = "", gpus: int = 0, message: str = "") -> dict[str, Any]:
    res = {"requests": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
    conds = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}] if message else []
    return {"metadata": {"name": name, "labels": {fleet.NODE_TYPE: kind}},
            "spec": {"nodeName": node, "containers": [{"resources": res}]} if node else {"containers": [{"resources": res}]},
            "status": {"conditions": conds}}


def _case(name: str = "f-tutorial") -> fleet_cases.Case:
    return next(c for c in fleet_cases.values_cases()[0] if c.name == name)


def _nodes(case: fleet_cases.Case) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in fleet_nodes.nodes(list(case.pools), RUN)}


def _placed(case: fleet_cases.Case) -> tuple[list, list, dict, dict]:
    nodes = _nodes(case)
    gpu = [n for n, o in nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == "gpu-pool"]
    cpu = next(n for n, o in nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == "cpu-pool")
    workers = [_pod(f"w{i}", "worker", n, case.gpu_pool.gpus) for i, n in enumerate(gpu)]
    return [_pod("h", "head", cpu)], workers, nodes, nodes[cpu]


def test_a_placed_file_passes_and_says_where() -> None:
    case = _case()
    text = fleet.check(case, *_placed(case))
    assert "2 of 2 workers on pool gpu-pool (2 x a4-highgpu-8g, 8 x nvidia-b200, reservation), one per node" in text


@pytest.mark.parametrize("defect", ["two on one node", "off the pool", "head on gpu", "fewer gpus", "missing worker",
                                    "pending without reason"])
def test_each_wrong_placement_fails(defect: str) -> None:
    case = _case()
    heads, workers, nodes, head_node = _placed(case)
    if defect == "two on one node":
        workers[1]["spec"]["nodeName"] = workers[0]["spec"]["nodeName"]
    elif defect == "off the pool":
        workers[0]["spec"]["nodeName"] = heads[0]["spec"]["nodeName"]
    elif defect == "head on gpu":
        head_node = nodes[workers[0]["spec"]["nodeName"]]
    elif defect == "fewer gpus":
        workers[0]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "4"
    elif defect == "missing worker":
        workers.pop()
    else:
        workers[1] = _pod("w1", "worker")
    with pytest.raises(StageError, match="f-tutorial"):
        fleet.check(case, heads, workers, nodes, head_node)


def test_a_file_that_cannot_fit_passes_only_with_the_schedulers_reason() -> None:
    short, _ = fleet_cases.cannot_fit_cases()
    nodes = _nodes(short)
    (gpu,) = [n for n, o in nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == "gpu-pool"]
    cpu = next(n for n in nodes if n != gpu)
    said = "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
    workers = [_pod("w0", "worker", gpu, 8), _pod("w1", "worker", message=said)]
    assert "1 Pending: 0/3 nodes are available" in fleet.check(short, [_pod("h", "head", cpu)], workers, nodes, nodes[cpu])
    workers[1] = _pod("w1", "worker", message="0/3 nodes are available: 3 node(s) didn't match Pod's node affinity")
    with pytest.raises(StageError, match="without the scheduler saying 'Insufficient nvidia.com/gpu'"):
        fleet.check(short, [_pod("h", "head", cpu)], workers, nodes, nodes[cpu])


def test_not_run_off_the_local_cluster_or_without_kwok(tmp_path: Path) -> None:
    with pytest.raises(NotRun, match="only on the local cluster the harness starts"):
        fleet.cluster_dir(SimpleNamespace(setup=SimpleNamespace(stack=[("storage", object())])))
    h = SimpleNamespace(setup=SimpleNamespace(stack=[("cluster", tmp_path)]))
    with pytest.raises(NotRun, match="e2e/build/parts.sh build kwok"):
        fleet.cluster_dir(h)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "kwok.pid").write_text(f"{os.getpid()} /bin/kwok\n")
    assert fleet.cluster_dir(h) == tmp_path


class FakeKube:
    """kubectl and helm answered from a scripted cluster: nodes turn Ready once created (as kwok makes them), the
    release's pods appear bound as `bind` says; every call is recorded."""

    def __init__(self, bind: dict[str, str] | None = None, ready: bool = True) -> None:
        self.calls: list[tuple[str, ...]] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.gone: set[str] = set()  # namespaces whose release was uninstalled and whose pods the GC removed
        self.bind, self.ready = bind or {}, ready

    def k(self, *args: str, input_text: str | None = None, **_: Any) -> Any:
        self.calls.append(("kubectl", *args))
        if args[:2] == ("create", "-f"):
            for n in json.loads(input_text or "{}")["items"]:
                if self.ready:
                    n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
                self.nodes[n["metadata"]["name"]] = n
        if args[:2] == ("delete", "nodes"):
            for name in args[2:]:
                self.nodes.pop(name, None)
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    def h(self, *args: str, **_: Any) -> Any:
        self.calls.append(("helm", *args))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    def items(self, kind: str, ns: str | None, selector: str = "") -> list[dict[str, Any]]:
        if kind == "nodes":
            return list(self.nodes.values())
        if ns in self.gone:
            return []
        gpu = sorted(n for n, o in self.nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == "gpu-pool")
        cpu = next(n for n, o in self.nodes.items() if o["metadata"]["labels"][fleet_nodes.POOL] == "cpu-pool")
        return [_pod("h", "head", cpu)] + [_pod(f"w{i}", "worker", self.bind.get(n, n), 8) for i, n in enumerate(gpu)]

    def get(self, kind: str, name: str, ns: str) -> dict[str, Any] | None:
        return self.nodes.get(name)

    def wait_for(self, what: str, probe: Any, timeout: float, ns: str | None = None, interval: float = 0) -> Any:
        got = probe()
        if not got:
            raise StageError(f"{what}: not reached in {timeout:.0f} s")
        return got


def _harness(kube: FakeKube, tmp_path: Path) -> Any:
    h = SimpleNamespace(kube=kube, session=SimpleNamespace(run_id=RUN), installed=[], out_dir=tmp_path)
    h.namespace = lambda name: name
    h.uninstall = lambda release, ns: kube.calls.append(("uninstall", release, ns)) or kube.gone.add(ns)
    return h


def test_place_creates_checks_uninstalls_and_deletes_its_nodes(tmp_path: Path) -> None:
    kube = FakeKube()
    text = fleet.place(_harness(kube, tmp_path), _case(), tmp_path)
    assert "2 of 2 workers on pool gpu-pool" in text
    install = next(c for c in kube.calls if c[:2] == ("helm", "install"))
    assert install[-2:] == ("-f", str(ROOT / "values" / "tutorial.yaml"))  # as shipped: no --set
    assert ("uninstall", "f-tutorial", run_name("f-tutorial")) in kube.calls
    assert kube.nodes == {}, "the run's simulated nodes are deleted after the case"
    h, pools = _harness(FakeKube(), tmp_path), _case().pools
    first, second = fleet.create_nodes(h, pools, tmp_path), fleet.create_nodes(h, pools, tmp_path)
    assert not set(first) & set(second), "each case's nodes get names of their own (a name made again met the old one)"


def test_a_case_waits_for_its_pods_to_go_before_the_next_reuses_the_node_names(tmp_path: Path) -> None:
    """2026-12-04's run: the nodes were deleted while the previous case's pods stayed bound to their names, and the
    next case's nodes (same names) were full: "Insufficient cpu". Pods that do not go fail the case; nodes still go."""
    kube = FakeKube()
    h = _harness(kube, tmp_path)
    h.uninstall = lambda release, ns: kube.calls.append(("uninstall", release, ns))  # the pods stay
    with pytest.raises(StageError, match="its pods gone before its nodes"):
        fleet.place(h, _case(), tmp_path)
    assert kube.nodes == {}


def test_the_nodes_go_when_the_check_fails_or_kwok_never_makes_them_ready(tmp_path: Path, monkeypatch) -> None:
    import itertools

    case = _case()
    monkeypatch.setattr(fleet, "CASE_TAGS", itertools.count(1))  # this case's nodes: fleet-RUN-c1-…
    kube = FakeKube(bind={f"fleet-{RUN}-c1-gpu-pool-1": f"fleet-{RUN}-c1-gpu-pool-0"})  # both workers on one node
    with pytest.raises(StageError, match="two workers on one node"):
        fleet.place(_harness(kube, tmp_path), case, tmp_path)
    assert kube.nodes == {}
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "kwok.log").write_text("E1204 kwok: nodes is forbidden\n")
    kube = FakeKube(ready=False)
    with pytest.raises(StageError, match="(?s)simulated nodes Ready.*nodes is forbidden"):
        fleet.place(_harness(kube, tmp_path), case, tmp_path)
    assert kube.nodes == {} and not any(c[:2] == ("helm", "install") for c in kube.calls)


def test_the_fleet_group_is_opt_in_and_its_rows_name_their_functions() -> None:
    from e2e.runner import table

    rows = [s for s in table.STAGES if s.group == table.FLEET]
    assert [s.name for s in rows] == ["fleet: values files placed", "fleet: machine families placed",
                                      "fleet: cannot fit", "fleet: Kueue on GPUs"]
    assert all("never run a container" in s.claim for s in rows)
    reasons = table.select("", "")
    assert all(reasons[s.name].startswith("not selected") for s in rows)
    assert not any(table.select("first,fleet", "")[s.name] for s in rows)


# ---------------------------------------------------------------------------------------------- the cluster's kwok
def test_kwok_is_started_managing_only_its_label_with_our_config_and_home(tmp_path: Path) -> None:
    part = tmp_path / "part"
    (part / "stages").mkdir(parents=True)
    (part / "stages" / "pod-ready.yaml").write_text("apiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\n"
                                                    "metadata: {name: pod-ready}\n")
    (part / "kwok").write_text(f'#!/bin/sh\necho "HOME=$HOME WLC=$KUBE_FEATURE_WatchListClient $*" > {tmp_path}/argv\n')
    (part / "kwok").chmod(0o755)
    d = tmp_path / "dir"
    (d / "run").mkdir(parents=True)
    (d / "logs").mkdir()
    script = (f'set -e; HERE={ROOT}/e2e/cluster; DIR={d}; KWOK_BIN={part}; T0=$SECONDS; . $HERE/lib.sh; '
              '. $HERE/operators.sh; start_kwok; for i in $(seq 100); do [ -s "$DIR/../argv" ] && break; sleep 0.1; done; '
              'wait; test -s "$DIR/run/kwok.pid"')  # the stand-in records its argv and exits
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    argv = (tmp_path / "argv").read_text()
    assert f"HOME={d}/kwok WLC=false " in argv
    assert "--manage-nodes-with-label-selector=kwok.x-k8s.io/node=fake" in argv
    assert f"--kubeconfig={d}/pki/kwok.kubeconfig" in argv and "--server-address=127.0.0.1:" in argv
    docs = list(yaml.safe_load_all((d / "kwok" / "kwok.yaml").read_text()))
    assert [x["kind"] for x in docs] == ["KwokConfiguration", "Stage"]
    assert docs[0]["options"]["podPlayStageParallelism"] > 0  # else kwok v0.8.0 exits at start
    assert "=".join(fleet_nodes.KWOK_LABEL) == "kwok.x-k8s.io/node=fake"


def test_kwok_gets_its_upstream_role_bound_to_its_own_user_only_when_built(tmp_path: Path) -> None:
    from e2e.cluster import manifests as m
    for d, name in ((tmp_path / "kuberay", "kuberay-operator"), (tmp_path / "kueue", "manager-role"),
                    (tmp_path / "kwok", "kwok-controller")):
        (d / "rbac").mkdir(parents=True)
        (d / "rbac" / "role.yaml").write_text(yaml.safe_dump({"apiVersion": "rbac.authorization.k8s.io/v1",
                                                              "kind": "ClusterRole", "metadata": {"name": name}}))
    without = m.rbac(tmp_path / "kuberay", tmp_path / "kueue")
    assert not any("kwok" in json.dumps(o) for o in without)
    binding = next(o for o in m.rbac(tmp_path / "kuberay", tmp_path / "kueue", tmp_path / "kwok")
                   if o["metadata"]["name"] == "e2e:kwok")
    assert binding["roleRef"]["name"] == "kwok-controller" and binding["subjects"][0]["name"] == "e2e:kwok"
