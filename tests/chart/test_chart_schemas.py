"""Every rendered object validates strictly: KubeRay CRs against the official CRD schemas
(v1.7.0 and v1.4.2), core objects with kubernetes-validate for Kubernetes 1.30 and the newest."""

from __future__ import annotations

import copy
from collections.abc import Callable

import kubernetes_validate
import pytest
from helm_render import CI_VALUES_DIR, Render, pod_templates
from strict_schema import KUBERAY_VERSIONS, crd_errors

CR_KINDS = {"RayCluster", "RayJob"}
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Values files that switch on fields newer than KubeRay 1.4 (behind values that are off by default).
NEEDS_KUBERAY_1_5 = {"cpu-newer-kuberay-values.yaml"}


def test_both_kuberay_versions_are_checked() -> None:
    assert KUBERAY_VERSIONS == ("v1.7.0", "v1.4.2")


@pytest.mark.parametrize("version", KUBERAY_VERSIONS)
def test_ray_objects_validate_strictly_against_the_crds(renders: dict[str, Render], version: str) -> None:
    checked = 0
    for name, r in renders.items():
        if version == "v1.4.2" and name in NEEDS_KUBERAY_1_5:
            continue
        for doc in r.docs:
            if doc["kind"] in CR_KINDS:
                assert not crd_errors(doc, version), (name, crd_errors(doc, version))
                checked += 1
    assert checked >= len(renders)


NEWER_FIELDS = ("preRunningDeadlineSeconds", "authOptions")


def test_newer_fields_are_real_and_absent_from_kuberay_1_4(renders: dict[str, Render]) -> None:
    """The opt-in fields exist in v1.7.0 and are unknown to v1.4.2 (so they stay off by default)."""
    job = renders["cpu-newer-kuberay-values.yaml"].one("RayJob")
    assert job["spec"]["preRunningDeadlineSeconds"] == 1800
    assert job["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    assert not crd_errors(job, "v1.7.0")
    errors = crd_errors(job, "v1.4.2")
    assert {f for f in NEWER_FIELDS if any(f in e for e in errors)} == set(NEWER_FIELDS), errors
    assert all(any(f in e for f in NEWER_FIELDS) for e in errors), errors
    for name, r in renders.items():
        if name not in NEEDS_KUBERAY_1_5:
            text = r.stdout
            assert not any(f in text for f in NEWER_FIELDS), name


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
