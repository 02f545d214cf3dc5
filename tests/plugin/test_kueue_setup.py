"""`kueue setup` against the real kube-apiserver with Kueue v0.19.2's CRDs: the plan changes nothing,
--apply creates objects the server accepts with quota for the job the chart renders, a second run
changes nothing, changed values update only its own objects, and a same-named object it did not
create is refused before anything is applied."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest
from gemma3_ray.cli import kueue_command
from gemma3_ray.kueue import objects as ko
from gemma3_ray.kueue import setup as kueue_setup
from gemma3_ray.utils.errors import UserError

from tests.plugin.kube_apiserver import kubectl

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "values" / "h200-8gpu.yaml"
QUEUED = ROOT / "charts" / "gemma3-ray" / "ci" / "kueue-queued-values.yaml"


@pytest.fixture(autouse=True)
def _helm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HELM", os.environ.get("HELM", str(ROOT / ".tools" / "bin" / "helm")))


def _args(kubeconfig: Path | None, ns: str, *values: Path, apply: bool = False, queued: bool = False,
          name: str = "team", jobs: int = 1) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kueue_command.register(parser.add_subparsers())
    argv = ["kueue", "setup", "-n", ns, "--queue", name, "--cluster-queue", f"{name}-cq", "--jobs", str(jobs)]
    argv += [a for v in values for a in ("-f", str(v))]
    argv += ["--apply"] * apply + ["--queued"] * queued
    argv += ["--kubeconfig", str(kubeconfig)] if kubeconfig else ["--kubeconfig", "/nonexistent/kubeconfig"]
    return parser.parse_args(argv)


def _get(kubeconfig: Path, kind: str, name: str, ns: str | None = None) -> dict[str, Any] | None:
    args = ["get", f"{ko.PLURALS[kind]}.kueue.x-k8s.io", name, "-o", "json", "--ignore-not-found"]
    out = kubectl(kubeconfig, *args, *(["-n", ns] if ns else []))
    return json.loads(out) if out.strip() else None


def _ns(kubeconfig: Path, name: str) -> str:
    kubectl(kubeconfig, "create", "namespace", name)
    return name


def _run(args: argparse.Namespace) -> list[str]:
    lines: list[str] = []
    assert kueue_command.cmd_setup(args, None, lines.append) == 0
    return lines


def _quota(cq: dict[str, Any]) -> dict[tuple[str, str], str]:
    (group,) = cq["spec"]["resourceGroups"]
    return {(f["name"], r["name"]): str(r["nominalQuota"]) for f in group["flavors"] for r in f["resources"]}


def test_plan_then_apply_then_nothing_to_do(kueue_crds: Path) -> None:
    ns = _ns(kueue_crds, "kueue-plan")
    plan = _run(_args(kueue_crds, ns, H200, name="plan"))
    assert any("+ create ClusterQueue plan-cq" in line for line in plan), plan
    assert any("Dry run: nothing changed" in line for line in plan)
    assert _get(kueue_crds, "ClusterQueue", "plan-cq") is None

    _run(_args(kueue_crds, ns, H200, apply=True, name="plan"))
    cq = _get(kueue_crds, "ClusterQueue", "plan-cq")
    assert cq is not None
    # values/h200-8gpu.yaml: 1 worker pod of 8 GPUs, 200 CPU, 1800Gi; a 4 CPU / 16Gi / 9Gi head; the submitter.
    q = _quota(cq)
    assert (q[("plan-cq-gpu", "nvidia.com/gpu")], q[("plan-cq-gpu", "cpu")], q[("plan-cq-gpu", "memory")]) == ("8", "200", "1800Gi")
    assert q[("plan-cq-cpu", "nvidia.com/gpu")] == "0" and q[("plan-cq-cpu", "ephemeral-storage")] == "9Gi"
    assert ko.quantity(q[("plan-cq-cpu", "cpu")]) > 4  # the head and the submitter
    flavor = _get(kueue_crds, "ResourceFlavor", "plan-cq-gpu")
    assert flavor is not None
    assert flavor["spec"]["nodeLabels"] == {"cloud.google.com/gke-accelerator": "nvidia-h200-141gb",
                                            "cloud.google.com/gke-spot": "true"}
    lq = _get(kueue_crds, "LocalQueue", "plan", ns)
    assert lq is not None and lq["spec"]["clusterQueue"] == "plan-cq"
    versions = {k: _get(kueue_crds, k, n, s)["metadata"]["resourceVersion"]  # type: ignore[index]
                for k, n, s in (("ClusterQueue", "plan-cq", None), ("LocalQueue", "plan", ns), ("ResourceFlavor", "plan-cq-gpu", None))}

    again = _run(_args(kueue_crds, ns, H200, apply=True, name="plan"))
    assert any(line.startswith("Nothing to do") for line in again), again
    assert versions == {k: _get(kueue_crds, k, n, s)["metadata"]["resourceVersion"]  # type: ignore[index]
                        for k, n, s in (("ClusterQueue", "plan-cq", None), ("LocalQueue", "plan", ns),
                                        ("ResourceFlavor", "plan-cq-gpu", None))}

    more = _run(_args(kueue_crds, ns, H200, apply=True, name="plan", jobs=2))
    assert [line for line in more if line.startswith("  + ")] == ["  + update ClusterQueue plan-cq"]
    assert _quota(_get(kueue_crds, "ClusterQueue", "plan-cq"))[("plan-cq-gpu", "nvidia.com/gpu")] == "16"  # type: ignore[arg-type]


def test_queued_provisioning_adds_the_admission_check(kueue_crds: Path) -> None:
    ns = _ns(kueue_crds, "kueue-queued")
    lines = _run(_args(kueue_crds, ns, QUEUED, apply=True, queued=True, name="dws"))
    prc = _get(kueue_crds, "ProvisioningRequestConfig", "dws-cq-queued-provisioning")
    check = _get(kueue_crds, "AdmissionCheck", "dws-cq-queued-provisioning")
    assert prc is not None and prc["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert prc["spec"]["managedResources"] == ["nvidia.com/gpu"]
    # Kept by the API server (Kueue's CRD prunes a field it does not know): GKE's one pod set per request (#34).
    assert prc["spec"]["podSetMergePolicy"] == "IdenticalWorkloadSchedulingRequirements"
    assert prc["spec"]["retryStrategy"] == {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}
    assert any("podSetMergePolicy IdenticalWorkloadSchedulingRequirements" in line and "retries a request GKE cannot "
               "fill 3 times" in line for line in lines), lines
    assert check is not None and check["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    cq = _get(kueue_crds, "ClusterQueue", "dws-cq")
    assert cq is not None
    assert cq["spec"]["admissionChecksStrategy"]["admissionChecks"] == [
        {"name": "dws-cq-queued-provisioning", "onFlavors": ["dws-cq-gpu"]}]
    flavor = _get(kueue_crds, "ResourceFlavor", "dws-cq-gpu")
    assert flavor is not None and flavor["spec"]["nodeLabels"]["cloud.google.com/gke-flex-start"] == "true"
    assert {"key": "cloud.google.com/gke-queued", "value": "true", "effect": "NoSchedule"} in flavor["spec"]["nodeTaints"]
    assert _quota(cq)[("dws-cq-gpu", "nvidia.com/gpu")] == "16"  # 2 pods x 8 GPUs


def test_a_provisioning_config_without_the_merge_policy_is_brought_up_to_date(kueue_crds: Path) -> None:
    """A ProvisioningRequestConfig an older `kueue setup` made (no podSetMergePolicy, a retry strategy of its
    own) is planned as an update and then carries both."""
    ns = _ns(kueue_crds, "kueue-queued-old")
    _run(_args(kueue_crds, ns, QUEUED, apply=True, queued=True, name="old"))
    kubectl(kueue_crds, "patch", "provisioningrequestconfig", "old-cq-queued-provisioning", "--type=json", "-p", json.dumps([
        {"op": "remove", "path": "/spec/podSetMergePolicy"},
        {"op": "replace", "path": "/spec/retryStrategy/backoffLimitCount", "value": 0}]))
    plan_lines = _run(_args(kueue_crds, ns, QUEUED, queued=True, name="old"))
    assert "  + update ProvisioningRequestConfig old-cq-queued-provisioning" in plan_lines, plan_lines
    _run(_args(kueue_crds, ns, QUEUED, apply=True, queued=True, name="old"))
    prc = _get(kueue_crds, "ProvisioningRequestConfig", "old-cq-queued-provisioning")
    assert prc is not None and prc["spec"]["podSetMergePolicy"] == "IdenticalWorkloadSchedulingRequirements"
    assert prc["spec"]["retryStrategy"]["backoffLimitCount"] == 3


FALLBACK = ROOT / "charts" / "gemma3-ray" / "ci" / "kueue-fallback-values.yaml"


def test_capacity_that_falls_back_gets_one_flavor_per_kind_in_order(kueue_crds: Path, tmp_path: Path) -> None:
    """capacity.type=fallback (#34): one ResourceFlavor per kind of capacity.fallback, in that order in the
    ClusterQueue, each with the kind's GKE node labels (the reservation's as the chart renders them for
    type=reservation, flex-start's label, none for on-demand) and the quota of the GPU pod sets; the head
    and submitter on the CPU flavor last. The API server (Kueue's CRDs) keeps them as written."""
    ns = _ns(kueue_crds, "kueue-fallback")
    lines = _run(_args(kueue_crds, ns, FALLBACK, apply=True, name="fb"))
    assert any("Kueue tries fb-cq-reservation, fb-cq-flex-start, fb-cq-on-demand in that order" in line for line in lines), lines
    cq = _get(kueue_crds, "ClusterQueue", "fb-cq")
    assert cq is not None
    order = [f["name"] for f in cq["spec"]["resourceGroups"][0]["flavors"]]
    assert order == ["fb-cq-reservation", "fb-cq-flex-start", "fb-cq-on-demand", "fb-cq-cpu"]
    accel = {"cloud.google.com/gke-accelerator": "nvidia-h200-141gb"}
    labels = {k: (_get(kueue_crds, "ResourceFlavor", f"fb-cq-{k}") or {})["spec"].get("nodeLabels") for k in
              ("reservation", "flex-start", "on-demand")}
    assert labels == {"reservation": {**accel, "cloud.google.com/reservation-name": "h200-reservation",
                                      "cloud.google.com/reservation-affinity": "specific"},
                      "flex-start": {**accel, "cloud.google.com/gke-flex-start": "true"}, "on-demand": accel}
    assert _quota(cq)[("fb-cq-flex-start", "nvidia.com/gpu")] == "16"  # 2 pods x 8 GPUs on each kind
    # Another order, a shared reservation: the values' order and the chart's reservation labels.
    mine = tmp_path / "order.yaml"
    mine.write_text("capacity:\n  reservation: projects/other-proj-1/reservations/res-b\n  fallback: [flex-start, reservation]\n")
    _run(_args(kueue_crds, ns, FALLBACK, mine, apply=True, name="fb2"))
    cq2 = _get(kueue_crds, "ClusterQueue", "fb2-cq")
    assert [f["name"] for f in cq2["spec"]["resourceGroups"][0]["flavors"]] == ["fb2-cq-flex-start", "fb2-cq-reservation", "fb2-cq-cpu"]
    res = (_get(kueue_crds, "ResourceFlavor", "fb2-cq-reservation") or {})["spec"]["nodeLabels"]
    assert res["cloud.google.com/reservation-project"] == "other-proj-1" and res["cloud.google.com/reservation-name"] == "res-b"


def test_a_later_values_layer_replaces_a_list_as_helm_does(tmp_path: Path) -> None:
    """Helm's -f files: a later file's list replaces the earlier one (pyhelm3, given the layers, would
    concatenate them: the fallback order above would come out [reservation, flex-start, on-demand,
    flex-start, reservation] and be refused)."""
    from gemma3_ray.kube import helm_release

    layers = [{"storage": {"bucket": "bkt-a"}, "workers": {"tolerations": [{"key": "a", "operator": "Exists"}]}},
              {"workers": {"tolerations": [{"key": "b", "operator": "Exists"}]}}]
    docs = helm_release.template(helm_release.client(None, None), "t", helm_release.chart_path(None), layers, "default")
    (job,) = [d for d in docs if d.get("kind") == "RayJob"]
    tolerations = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["tolerations"]
    assert [t["key"] for t in tolerations] == ["nvidia.com/gpu", "b"]


def test_reservation_labels_match_the_chart() -> None:
    """The flavor's reservation labels are the worker nodeSelector the chart renders for type=reservation."""
    from tests.chart.helm_render import helm_template

    for reservation in ("res-a", "res-a/reservationBlocks/blk-1", "projects/other-proj-1/reservations/res-b"):
        job = helm_template([ROOT / "charts" / "gemma3-ray" / "ci" / "default-values.yaml"],
                            {"capacity.type": "reservation", "capacity.reservation": reservation}).one("RayJob")
        sel = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["nodeSelector"]
        want = {k: v for k, v in sel.items() if k.startswith("cloud.google.com/reservation")}
        assert ko.reservation_labels(reservation) == want


def test_an_object_it_did_not_create_is_never_touched(kueue_crds: Path) -> None:
    ns = _ns(kueue_crds, "kueue-foreign")
    kubectl(kueue_crds, "apply", "-f", "-", stdin=json.dumps({
        "apiVersion": ko.API_VERSION, "kind": "ClusterQueue", "metadata": {"name": "theirs-cq"},
        "spec": {"namespaceSelector": {}, "resourceGroups": []}}))
    before = _get(kueue_crds, "ClusterQueue", "theirs-cq")
    with pytest.raises(kueue_setup.ForeignObject, match="was not created by `gemma3-ray kueue setup`"):
        kueue_command.cmd_setup(_args(kueue_crds, ns, H200, apply=True, name="theirs"), None, lambda _: None)
    assert _get(kueue_crds, "ClusterQueue", "theirs-cq") == before
    assert _get(kueue_crds, "ResourceFlavor", "theirs-cq-gpu") is None  # refused before anything was applied
    assert _get(kueue_crds, "LocalQueue", "theirs", ns) is None


def test_the_plan_works_without_a_cluster_and_apply_says_why_not() -> None:
    lines = _run(_args(None, "ml", H200, name="offline"))
    assert "  + create LocalQueue ml/offline  [not checked]" in lines, lines
    assert any(line.startswith("  ? which of these exist: not checked (no cluster connection") for line in lines), lines
    with pytest.raises(UserError, match="No usable kube context"):
        kueue_command.cmd_setup(_args(None, "ml", H200, apply=True, name="offline"), None, lambda _: None)


def test_the_queue_defaults_to_the_values_queue() -> None:
    parser = argparse.ArgumentParser()
    kueue_command.register(parser.add_subparsers())
    args = parser.parse_args(["kueue", "setup", "-n", "ml", "-f", str(ROOT / "values" / "shared-cluster.yaml"),
                              "--kubeconfig", "/nonexistent/kubeconfig"])
    lines: list[str] = []
    assert kueue_command.cmd_setup(args, None, lines.append) == 0
    assert lines[0].startswith("Kueue objects for queue ml/team-vision (ClusterQueue ml-team-vision)"), lines


def test_values_the_chart_refuses_with_a_queue_stop_before_any_call() -> None:
    args = _args(None, "ml", ROOT / "charts" / "gemma3-ray" / "ci" / "spot-autoscaling-values.yaml")
    with pytest.raises(UserError, match="kueue.queueName=team needs mode=ephemeral"):
        kueue_command.cmd_setup(args, None, lambda _: None)


def test_a_fallback_cpu_flavor_holds_the_heads_of_every_job_its_gpu_flavors_admit() -> None:
    """#43 (Kueue on GPUs): with capacity.type=fallback each GPU flavor has quota for --jobs jobs' workers, so
    the flavors together admit jobs x kinds jobs at once; the heads and submitters of all of them go to the one
    CPU flavor (they do not tolerate the GPU flavors' taint). With quota there for --jobs jobs only, the second
    job, its workers fitting flex-start, waited for the CPU flavor and the fallback never reached its second kind."""
    head = ko.PodSet("head", 1, {"cpu": ko.quantity("4"), "memory": ko.quantity("16Gi")})
    workers = ko.PodSet("workers", 2, {"cpu": ko.quantity("160"), "memory": ko.quantity("2000Gi"), ko.GPU: ko.quantity("8")})
    submitter = ko.PodSet("submitter", 1, {"cpu": ko.quantity("500m"), "memory": ko.quantity("200Mi")})
    for jobs in (1, 2):
        setup = ko.Setup(namespace="ns", queue="q", cluster_queue="cq", sets=(head, workers, submitter),
                         capacity="fallback", jobs=jobs, fallback=ko.FALLBACK_KINDS, reservation="res")
        (cq,) = [o for o in ko.objects(setup) if o["kind"] == "ClusterQueue"]
        quota = {(f["name"], r["name"]): r["nominalQuota"] for f in cq["spec"]["resourceGroups"][0]["flavors"]
                 for r in f["resources"]}
        assert quota[("cq-reservation", ko.GPU)] == str(16 * jobs)
        assert quota[("cq-cpu", "cpu")] == ko.format_quantity(ko.quantity("4.5") * 3 * jobs), quota
