"""Two teams on one cluster, against the real kube-apiserver with Kueue's CRDs (#27 item 6): `kueue setup` for a
second namespace with the same values never takes over the first team's ClusterQueue (each namespace gets its
own, by default), naming another team's ClusterQueue is refused in one sentence before anything changes,
doctor stays right for both, and the WorkloadPriorityClass the values name is created (an existing one,
whoever made it, is left as it is)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest
from gemma3_ray.cli import kueue_command
from gemma3_ray.config import render
from gemma3_ray.kueue import check as kueue_check
from gemma3_ray.kueue import objects as ko
from gemma3_ray.utils.errors import UserError
from kubernetes import client, config

from tests.plugin.kube_apiserver import kubectl

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT / "values" / "shared-cluster.yaml"  # kueue.queueName team-vision, kueue.priorityClass batch-high


@pytest.fixture(autouse=True)
def _helm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELM", os.environ.get("HELM", str(ROOT / ".tools" / "bin" / "helm")))


def _priority(tmp_path: Path, name: str) -> Path:
    """values naming a WorkloadPriorityClass of this test's own (the API server is the session's: another
    test's classes are there too)."""
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"kueue:\n  priorityClass: {name}\n")
    return path


def _setup(kubeconfig: Path, ns: str, *extra: str, apply: bool = False, values: tuple[Path, ...] = ()) -> list[str]:
    """`gemma3-ray kueue setup -n NS -f values/shared-cluster.yaml [-f ...] [extra] [--apply]`: its printed lines."""
    parser = argparse.ArgumentParser()
    kueue_command.register(parser.add_subparsers())
    files = [a for v in (SHARED, *values) for a in ("-f", str(v))]
    args = parser.parse_args(["kueue", "setup", "-n", ns, *files, "--kubeconfig", str(kubeconfig), *extra,
                              *(["--apply"] if apply else [])])
    lines: list[str] = []
    assert kueue_command.cmd_setup(args, None, lines.append) == 0, lines
    return lines


def _get(custom: Any, plural: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
    try:
        if ns:
            return custom.get_namespaced_custom_object(ko.GROUP, ko.VERSION, ns, plural, name)
        return custom.get_cluster_custom_object(ko.GROUP, ko.VERSION, plural, name)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _queue_of(custom: Any, ns: str) -> tuple[str, dict[str, Any]]:
    lq = _get(custom, "localqueues", "team-vision", ns)
    assert lq is not None, f"no LocalQueue team-vision in {ns}"
    name = lq["spec"]["clusterQueue"]
    cq = _get(custom, "clusterqueues", name)
    assert cq is not None
    return name, cq


def test_a_second_namespace_gets_its_own_queue_and_never_takes_over_the_first(kueue_crds: Path, tmp_path: Path) -> None:
    api = config.new_client_from_config(config_file=str(kueue_crds))
    custom, api_ext, core = client.CustomObjectsApi(api), client.ApiextensionsV1Api(api), client.CoreV1Api(api)
    team_a, team_b = "vision-a", "vision-b"
    for ns in (team_a, team_b):
        kubectl(kueue_crds, "create", "namespace", ns)
    mine = (_priority(tmp_path, "teams-high"),)

    _setup(kueue_crds, team_a, apply=True, values=mine)
    cq_a, before = _queue_of(custom, team_a)
    wpc = _get(custom, "workloadpriorityclasses", "teams-high")
    assert wpc is not None and wpc["metadata"]["labels"][ko.OWNER_LABEL] == ko.OWNER  # the class the values name

    plan_b = _setup(kueue_crds, team_b, values=mine)
    assert not [line for line in plan_b if cq_a in line and line.startswith("  + ")], plan_b
    assert any(line.startswith("  = WorkloadPriorityClass teams-high") for line in plan_b), plan_b
    _setup(kueue_crds, team_b, apply=True, values=mine)
    cq_b, theirs = _queue_of(custom, team_b)
    assert cq_b != cq_a
    assert theirs["spec"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": team_b}}
    after = _get(custom, "clusterqueues", cq_a)
    assert after is not None and after["spec"] == before["spec"]
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]

    # Naming the first team's ClusterQueue on purpose: one sentence, nothing changed.
    parser = argparse.ArgumentParser()
    kueue_command.register(parser.add_subparsers())
    args = parser.parse_args(["kueue", "setup", "-n", team_b, "-f", str(SHARED), "-f", str(mine[0]),
                              "--cluster-queue", cq_a, "--kubeconfig", str(kueue_crds), "--apply"])
    with pytest.raises(UserError) as refused:
        kueue_command.cmd_setup(args, None, lambda _: None)
    sentence = str(refused.value)
    assert f"ClusterQueue {cq_a}" in sentence and team_a in sentence and "--cluster-queue" in sentence
    assert "nothing was changed" in sentence and sentence.count(". ") == 0, sentence
    assert _get(custom, "clusterqueues", cq_a)["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # type: ignore[index]

    # doctor: each team's queue admits its job.
    values = render.load_values([SHARED, *mine])
    for ns, cq in ((team_a, cq_a), (team_b, cq_b)):
        checks = {c.name: c for c in kueue_check.doctor_checks(ns, "gemma3-ray", custom, api_ext, values, core)}
        assert all(c.ok for c in checks.values()), [c.line() for c in checks.values()]
        assert f"{ns}/team-vision -> ClusterQueue {cq}" in checks["Kueue LocalQueue"].detail
        assert checks["Kueue WorkloadPriorityClass"].ok


def test_an_existing_priority_class_is_left_as_it_is(kueue_crds: Path, tmp_path: Path) -> None:
    api = config.new_client_from_config(config_file=str(kueue_crds))
    custom = client.CustomObjectsApi(api)
    ns = "vision-wpc"
    kubectl(kueue_crds, "create", "namespace", ns)
    kubectl(kueue_crds, "create", "-f", "-", stdin=json.dumps({  # the admin's own, made before any setup
        "apiVersion": ko.API_VERSION, "kind": "WorkloadPriorityClass", "metadata": {"name": "teams-admins"},
        "value": 5000}))
    before = _get(custom, "workloadpriorityclasses", "teams-admins")
    lines = _setup(kueue_crds, ns, "--priority-value", "7", apply=True, values=(_priority(tmp_path, "teams-admins"),))
    assert "  = WorkloadPriorityClass teams-admins (exists, value 5000; shared by the jobs that name it, not changed)" \
        in lines, lines
    assert _get(custom, "workloadpriorityclasses", "teams-admins") == before


def test_the_default_queue_objects_are_per_namespace() -> None:
    parser = argparse.ArgumentParser()
    kueue_command.register(parser.add_subparsers())
    heads = []
    for ns in ("team-a", "team-b"):
        args = parser.parse_args(["kueue", "setup", "-n", ns, "-f", str(SHARED), "--kubeconfig", "/nonexistent/kubeconfig"])
        lines: list[str] = []
        assert kueue_command.cmd_setup(args, None, lines.append) == 0
        heads.append(lines[0])
        assert f"+ create LocalQueue {ns}/team-vision" in "\n".join(lines)
        assert "+ create WorkloadPriorityClass batch-high  [not checked]" in "\n".join(lines)
    assert heads[0] != heads[1] and "(ClusterQueue team-a-team-vision)" in heads[0], heads
