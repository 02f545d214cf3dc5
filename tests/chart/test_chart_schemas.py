"""Every rendered object validates strictly: KubeRay CRs against the official CRD schemas
(v1.7.0, v1.5.0 and v1.4.2), core objects with kubernetes-validate for Kubernetes 1.30 and the newest."""

from __future__ import annotations

import copy
from collections.abc import Callable

import kubernetes_validate
import pytest
from helm_render import CI_VALUES_DIR, Render, pod_templates
from strict_schema import KUBERAY_VERSIONS, crd_errors

CR_KINDS = {"RayCluster", "RayJob"}
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Values files that switch on fields newer than KubeRay 1.4 (behind values that are off by default), and
# the oldest of the tested CRD sets that holds them all.
NEEDS_NEWER = {"cpu-newer-kuberay-values.yaml": "v1.7.0", "cpu-kuberay-1.7-values.yaml": "v1.7.0"}
# Each value newer than KubeRay 1.4, the field it renders (a path in the RayJob) and the tested CRD
# sets that hold that field.
NEWER_FIELDS = {
    "rayJob.preRunningDeadlineSeconds": (("spec", "preRunningDeadlineSeconds"), {"v1.7.0"}),
    "rayTokenAuth": (("spec", "rayClusterSpec", "authOptions"), {"v1.7.0"}),
    # 1.5.0's CRD has deletionRules, but its condition requires jobStatus and lacks jobDeploymentStatus.
    "rayJob.deletion": (("spec", "deletionStrategy"), {"v1.7.0"}),
    "historyServer.collector": (("spec", "rayClusterSpec", "historyServerOptions"), {"v1.7.0"}),
}


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.lstrip("v").split("."))


def test_three_kuberay_versions_are_checked() -> None:
    assert KUBERAY_VERSIONS == ("v1.7.0", "v1.5.0", "v1.4.2")


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
def test_ray_objects_validate_strictly_against_the_crds(renders: dict[str, Render], version: str) -> None:
    checked = 0
    for name, r in renders.items():
        if name in NEEDS_NEWER and _version_key(version) < _version_key(NEEDS_NEWER[name]):
            continue
        for doc in r.docs:
            if doc["kind"] in CR_KINDS:
                assert not crd_errors(doc, version), (name, crd_errors(doc, version))
                checked += 1
    assert checked >= len(renders) - len(NEEDS_NEWER)


def _at(doc: dict, path: tuple[str, ...]) -> object:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None  # type: ignore[assignment]
    return doc


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
def test_newer_fields_are_real_and_absent_from_older_crds(renders: dict[str, Render], version: str) -> None:
    """Each opt-in field is rendered by its values file, kept by the CRD sets that have it and an error
    (an unknown field the API server would prune) for the others; no other values file renders one."""
    jobs = {name: renders[name].one("RayJob") for name in NEEDS_NEWER}
    for key, (path, holders) in NEWER_FIELDS.items():
        (name, job), = [(n, j) for n, j in jobs.items() if _at(j, path) is not None]
        errors = [e for e in crd_errors(job, version) if path[-1] in e]
        assert bool(errors) is (version not in holders), (key, version, errors)
    for name, r in renders.items():
        if name not in NEEDS_NEWER:
            for doc in r.docs:
                if doc["kind"] == "RayJob":
                    assert all(_at(doc, path) is None for path, _ in NEWER_FIELDS.values()), name


def test_deletion_rules_replace_shutdown_and_cover_every_ending(renders: dict[str, Render]) -> None:
    """rayJob.deletion renders KubeRay's rules in place of shutdownAfterJobFinishes and the TTL (KubeRay
    refuses both together), each step for SUCCEEDED, FAILED and a failed deployment, workers before the
    cluster (KubeRay's TTL order)."""
    job = renders["cpu-kuberay-1.7-values.yaml"].one("RayJob")["spec"]
    assert "shutdownAfterJobFinishes" not in job and "ttlSecondsAfterFinished" not in job
    rules = job["deletionStrategy"]["deletionRules"]
    endings = [{"jobStatus": "SUCCEEDED"}, {"jobStatus": "FAILED"}, {"jobDeploymentStatus": "Failed"}]
    want = [{"policy": p, "condition": {**c, "ttlSeconds": t}} for c in endings
            for p, t in (("DeleteWorkers", 0), ("DeleteCluster", 600))]
    assert rules == want
    default = renders["default-values.yaml"].one("RayJob")["spec"]
    assert default["shutdownAfterJobFinishes"] is True and default["ttlSecondsAfterFinished"] == 300


def test_history_collector_options(renders: dict[str, Render]) -> None:
    spec = renders["cpu-kuberay-1.7-values.yaml"].one("RayJob")["spec"]["rayClusterSpec"]
    assert spec["historyServerOptions"] == {"collectorOptions": {
        "image": "collector:v1", "imagePullPolicy": "IfNotPresent", "env": [{"name": "STORAGE_BUCKET", "value": "gemma3-ray-ci"}]}}


def test_the_strict_validator_catches_unknown_fields_and_nulls(renders: dict[str, Render]) -> None:
    """The validator itself: an unknown field, a null object and a typo'd key are all errors."""
    job = renders["default-values.yaml"].one("RayJob")
    for mutate, needle in (
        (lambda d: d["spec"].__setitem__("entrypointt", "x"), "entrypointt"),
        (lambda d: d["spec"]["rayClusterSpec"]["headGroupSpec"]["template"].__setitem__("metadata", None), "None"),
        (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].__setitem__("securityContxt", {}), "securityContxt"),
        (lambda d: d["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].__setitem__("replicas", "2"), "'2'"),
    ):
        bad = copy.deepcopy(job)
        mutate(bad)
        for version in KUBERAY_VERSIONS:
            errors = crd_errors(bad, version)
            assert any(needle in e for e in errors), (needle, errors)


def _core_objects(renders: dict[str, Render]) -> list[tuple[str, dict]]:
    out = []
    for name, r in renders.items():
        out += [(name, d) for d in r.docs if d["kind"] not in CR_KINDS]
        # The pod templates inside the CRs validate as Pods too (KubeRay copies them into Pods).
        for doc in r.docs:
            if doc["kind"] in CR_KINDS:
                for role, tpl in pod_templates(doc):
                    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**tpl["metadata"], "name": f"x-{role.split(':')[0]}"}, "spec": tpl["spec"]}
                    out.append((f"{name}:{doc['kind']}:{role}", pod))
            if doc["kind"] == "RayJob":
                tpl = doc["spec"]["submitterPodTemplate"]
                out.append((f"{name}:submitter", {"apiVersion": "v1", "kind": "Pod", "metadata": {**tpl["metadata"], "name": "submitter"}, "spec": tpl["spec"]}))
    return out


@pytest.mark.parametrize("k8s", K8S_VERSIONS)
def test_core_objects_validate_with_kubernetes_validate_strict(renders: dict[str, Render], k8s: str) -> None:
    objects = _core_objects(renders)
    kinds = {d["kind"] for _, d in objects}
    assert {"ServiceAccount", "ConfigMap", "Service", "Pod", "Secret", "NetworkPolicy"} <= kinds, kinds
    for where, doc in objects:
        try:
            kubernetes_validate.validate(doc, k8s, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{where} {doc['kind']}/{doc['metadata']['name']} @ {k8s}: {e.message} at {list(e.path)}") from e


def test_kubernetes_validate_is_strict_here(renders: dict[str, Render]) -> None:
    svc = copy.deepcopy(renders["default-values.yaml"].one("Service"))
    svc["spec"]["clusterIPz"] = "None"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(svc, K8S_VERSIONS[0], strict=True)


def test_ci_values_cover_every_optional_object(render: Callable[..., Render]) -> None:
    kinds = set()
    for f in CI_VALUES_DIR.glob("*.yaml"):
        kinds |= {d["kind"] for d in render(f).docs}
    assert {"RayCluster", "RayJob", "Secret", "NetworkPolicy", "ServiceAccount", "Pod"} <= kinds
