"""The `shared` drills' parts (e2e/support/foreign.py, e2e/support/nodes.py's refusal) on the session's real
kube-apiserver with Kueue's CRDs (no Kueue controller: the Workload is never admitted here, so `admitted` is
exercised only by `make e2e ARGS="--only shared"`). The drills themselves need the local cluster with kwok."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from e2e.support import foreign, nodes
from e2e.support.errors import StageError
from e2e.support.kube import Kube
from e2e.support.session import Session


@pytest.fixture
def kube(kueue_crds: Path, tmp_path: Path) -> Kube:
    return Kube(kueue_crds, tmp_path / "log")


def test_another_teams_objects_are_made_compared_to_the_byte_and_removed_only_by_uid(kube: Kube) -> None:
    team = foreign.Foreign(tag=f"dr{secrets.token_hex(2)}")  # this server has no namespace controller: never reused
    foreign.make(kube, team, with_prc=True)
    try:
        kinds = [k.split(".")[0] for k, _, _ in team.refs]
        assert kinds == ["namespaces", "priorityclasses", "workloadpriorityclasses", "resourceflavors",
                         "provisioningrequestconfigs", "clusterqueues", "localqueues", "workloads"]
        assert all(foreign.DRILL_LABEL in foreign.get(kube, r)["metadata"]["labels"] for r in team.refs)
        assert not any("gemma3-ray.dev/e2e-run" in (foreign.get(kube, r)["metadata"].get("labels") or {})
                       for r in team.refs), "another team's objects carry no run's label"
        foreign.snapshot(kube, team)
        assert foreign.changed(kube, team) == []
        # a label added to a status-less kind: its resourceVersion and labels differ; so does a deleted one
        kube.k("label", "priorityclass", team.names["pc"], "touched=yes")
        kube.k("-n", team.namespace, "delete", "localqueue", team.names["lq"])
        diff = foreign.changed(kube, team)
        assert any(d.startswith(f"priorityclasses {team.names['pc']}: metadata changed") and "labels" in d
                   for d in diff), diff
        assert f"localqueues {team.names['lq']}: deleted" in diff
        # a status write of a controller-kept kind is not a change the drill blames on a run
        cq = ("clusterqueues.kueue.x-k8s.io", "", team.names["cq"])
        body = foreign.get(kube, cq)
        body["status"] = {"pendingWorkloads": 1}
        kube.k("replace", "--subresource=status", "-f", "-", input_text=json.dumps(body))
        assert not any(d.startswith("clusterqueues") for d in foreign.changed(kube, team))
    finally:
        # someone else's PriorityClass of the same name made since: left alone (the uid precondition)
        pc = ("priorityclasses", "", team.names["pc"])
        kube.k("delete", "priorityclass", team.names["pc"])
        kube.k("create", "-f", "-", input_text=json.dumps({"apiVersion": "scheduling.k8s.io/v1",
                                                           "kind": "PriorityClass", "value": 1,
                                                           "metadata": {"name": team.names["pc"]}}))
        problems = foreign.remove(kube, team)
    assert problems == [], problems
    assert foreign.get(kube, pc) is not None, "a same-named object made by someone else stays"
    kube.k("delete", "priorityclass", team.names["pc"])
    ns = kube.get("namespace", team.namespace, "default")
    assert ns is None or ns["metadata"].get("deletionTimestamp"), "the namespace (with its queue and Workload) goes"
    for ref in (r for r in team.refs if not r[1]):
        got = foreign.get(kube, ref)
        assert got is None or got["metadata"].get("deletionTimestamp"), ref


def test_a_node_another_live_run_changed_is_refused_before_any_change(kube: Kube) -> None:
    """Two runs at once naming one node (E2E_NODE): the second's record would take the first's cordon for the
    node's own state and 'put it back' cordoned. Refused; an expired run's record is the pre-clean's, not a hold."""
    kube.k("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                       "metadata": {"name": "shared-node-1", "labels": {"a": "1"}}}))
    first, second = Session(kube, run_id="held01"), Session(kube, run_id="held02")
    first.start()
    second.start()
    try:
        nodes.change(kube, first.lease, "shared-node-1", cordon=True)
        with pytest.raises(StageError, match="node shared-node-1 is being changed by run held01"):
            nodes.change(kube, second.lease, "shared-node-1", labels={"b": "2"})
        assert "b" not in kube.get("node", "shared-node-1", "default")["metadata"]["labels"]
        assert nodes.restore(kube, first.lease) == []
        nodes.change(kube, second.lease, "shared-node-1", labels={"b": "2"})  # free again once put back
        assert nodes.restore(kube, second.lease) == []
    finally:
        first.close(release=True)
        second.close(release=True)
        kube.k("delete", "node", "shared-node-1", "--ignore-not-found")
    node = kube.get("node", "shared-node-1", "default")
    assert node is None
