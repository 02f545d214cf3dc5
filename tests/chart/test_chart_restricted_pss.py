"""The restricted Pod Security Standard admits every pod the chart makes (#18), on the real API server.

The session's kube-apiserver (v1.32, ../shared/kube-apiserver) runs its built-in PodSecurity admission
plugin. A namespace labelled `pod-security.kubernetes.io/enforce: restricted` gets, as Pods created
server-side with dryRun=All (admission runs, nothing is stored), every pod template the chart renders:
the head and worker templates of the ephemeral RayJob's rayClusterSpec and of the persistent
RayCluster, the RayJob's submitterPodTemplate and the helm test pod. values/shared-cluster.yaml and
the defaults must be admitted; the same chart with privilege escalation, root or an added capability
must be refused, naming the rule (the controls that keep this test able to fail).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helm_render import CI_VALUES_DIR, RELEASE, VALUES_DIR, Render, pod_templates

from tests.lifecycle.kube_api import ApiError, ApiServer, connect

NAMESPACE = "pss-restricted"
SHARED = VALUES_DIR / "shared-cluster.yaml"
CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
SERVICE_ACCOUNT = f"{RELEASE}-gemma3-ray"
# The PriorityClasses values/shared-cluster.yaml names: the Priority admission plugin refuses a pod
# whose class does not exist, as a platform team's cluster would.
PRIORITY_CLASSES = {"ml-training-head": 100000, "ml-training": 90000}


def as_pods(r: Render) -> list[tuple[str, dict[str, Any]]]:
    """Every pod the render makes, as a Pod for NAMESPACE: (where, Pod)."""
    assert r.returncode == 0, r.stderr
    out: list[tuple[str, dict[str, Any]]] = []
    for doc in r.docs:
        templates: list[tuple[str, dict[str, Any]]] = []
        if doc["kind"] in ("RayCluster", "RayJob"):
            templates += [(f"{doc['kind']}:{role}", tpl) for role, tpl in pod_templates(doc)]
        if doc["kind"] == "RayJob":
            templates.append(("RayJob:submitter", doc["spec"]["submitterPodTemplate"]))
        if doc["kind"] == "Pod":
            templates.append(("helm-test", {"metadata": doc["metadata"], "spec": doc["spec"]}))
        for where, tpl in templates:
            name = where.lower().replace(":", "-").replace("_", "-")
            meta = {**tpl["metadata"], "name": name, "namespace": NAMESPACE}
            out.append((where, {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": tpl["spec"]}))
    return out


def create(api: ApiServer, pod: dict[str, Any]) -> dict[str, Any]:
    """Server-side create, dryRun=All: every admission plugin runs, nothing is persisted."""
    return api.admin.create(f"/api/v1/namespaces/{NAMESPACE}/pods?dryRun=All&fieldValidation=Strict", pod)


@pytest.fixture(scope="module")
def api(kube_apiserver: Path) -> Iterator[ApiServer]:
    server = connect(kube_apiserver)
    server.admin.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted",
                                      "pod-security.kubernetes.io/enforce-version": "latest"}}})
    for sa in ("default", SERVICE_ACCOUNT):
        server.admin.create(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}})
    made = []
    for name, value in PRIORITY_CLASSES.items():
        try:
            server.admin.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value})
            made.append(name)
        except ApiError as e:
            if e.code != 409:
                raise
    try:
        yield server
    finally:
        for name in made:
            server.admin.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
        server.admin.delete(f"/api/v1/namespaces/{NAMESPACE}")


ADMITTED = [
    ("shared-cluster, ephemeral", (SHARED,), {}),
    # Kueue does not queue a RayJob on an existing cluster: the persistent variant drops the queue.
    ("shared-cluster, persistent", (SHARED,), {"mode": "persistent", "kueue.queueName": "", "kueue.priorityClass": ""}),
    ("defaults, ephemeral", (CI_DEFAULT,), {}),
    ("defaults, persistent", (CI_DEFAULT,), {"mode": "persistent"}),
    ("per-group overrides", (CI_VALUES_DIR / "policy-values.yaml",), {}),
]


@pytest.mark.parametrize(("case", "files", "sets"), ADMITTED, ids=[c[0] for c in ADMITTED])
def test_every_pod_template_is_admitted_by_restricted(api: ApiServer, render: Callable[..., Render], case: str,
                                                      files: tuple[Path, ...], sets: dict[str, object]) -> None:
    pods = as_pods(render(*files, sets=sets))
    roles = {where.split(":", 1)[-1].split(":")[0] for where, _ in pods}
    assert roles == {"head", "worker", "submitter", "helm-test"}, roles
    persistent = sets.get("mode") == "persistent"
    assert {w.split(":")[0] for w, _ in pods if w.endswith(("head",))} == {"RayCluster" if persistent else "RayJob"}
    for where, pod in pods:
        created = create(api, pod)
        assert created["metadata"]["namespace"] == NAMESPACE and created["spec"]["containers"], (case, where)
        if files == (SHARED,):
            # What admission kept is what the chart asked for: read-only root, and the priority resolved.
            assert created["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True, where
            if where.endswith(("head", "gpu-workers")):
                assert created["spec"]["priority"] in PRIORITY_CLASSES.values(), where


REFUSED = [
    # privileged: true itself never reaches PodSecurity here: this API server runs without
    # --allow-privileged, so Pod validation refuses it first (422, "disallowed by cluster policy").
    ("privilege escalation", {"containerSecurityContext.allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
    ("root", {"podSecurityContext.runAsNonRoot": False, "podSecurityContext.runAsUser": 0,
              "containerSecurityContext.runAsNonRoot": False, "containerSecurityContext.runAsUser": 0}, "runAsNonRoot"),
    ("an added capability", {"containerSecurityContext.capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}, "capabilities"),
]


@pytest.mark.parametrize(("case", "sets", "rule"), REFUSED, ids=[c[0] for c in REFUSED])
def test_the_same_pods_made_unsafe_are_refused(api: ApiServer, render: Callable[..., Render], case: str,
                                               sets: dict[str, object], rule: str) -> None:
    pods = as_pods(render(SHARED, sets=sets))
    assert len(pods) == 4
    for where, pod in pods:
        with pytest.raises(ApiError) as refused:
            create(api, pod)
        assert refused.value.code == 403, (case, where, refused.value)
        message = str(refused.value)
        assert 'violates PodSecurity "restricted:latest"' in message and rule in message, (case, where, message)


def test_one_groups_override_refuses_only_that_group(api: ApiServer, render: Callable[..., Render]) -> None:
    """The per-group overlay reaches the API server: only the workers lose the restricted profile."""
    pods = as_pods(render(SHARED, sets={"workers.podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}))
    for where, pod in pods:
        if ":worker:" in where:
            with pytest.raises(ApiError) as refused:
                create(api, pod)
            assert "seccompProfile" in str(refused.value), where
        else:
            create(api, pod)


def with_autoscaler_sidecar(head: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The head Pod as KubeRay makes it with autoscaling on: its autoscaler container
    (ray-operator/controllers/ray/common/pod.go BuildAutoscalerContainer, then mergeAutoscalerOverrides:
    the head's image, autoscalerOptions' resources, securityContext and volumeMounts) sharing /tmp/ray
    through the "ray-logs" volume (addEmptyDir reuses the volume of that name)."""
    spec = head["spec"]
    sidecar = {"name": "autoscaler", "image": spec["containers"][0]["image"], "imagePullPolicy": "IfNotPresent",
               "command": ["/bin/bash", "-lc", "--"],
               "args": ["ray kuberay-autoscaler --cluster-name $(RAY_CLUSTER_NAME) --cluster-namespace $(RAY_CLUSTER_NAMESPACE)"],
               "resources": options["resources"], "securityContext": options["securityContext"],
               "volumeMounts": [{"name": "ray-logs", "mountPath": "/tmp/ray"}, *options.get("volumeMounts", [])]}
    return {**head, "spec": {**spec, "containers": [*spec["containers"], sidecar]}}


def test_the_autoscaler_sidecar_is_admitted_too(api: ApiServer, render: Callable[..., Render]) -> None:
    # Kueue refuses autoscaling and persistent mode: this variant drops the queue.
    r = render(SHARED, CI_VALUES_DIR / "spot-autoscaling-values.yaml", sets={"kueue.queueName": "", "kueue.priorityClass": ""})
    options = r.one("RayCluster")["spec"]["autoscalerOptions"]
    assert options["securityContext"]["readOnlyRootFilesystem"] is True
    (head,) = [pod for where, pod in as_pods(r) if where == "RayCluster:head"]
    volumes = {v["name"] for v in head["spec"]["volumes"]}
    assert {"ray-logs", "tmp"} <= volumes and all(m["name"] in volumes for m in options["volumeMounts"])
    created = create(api, with_autoscaler_sidecar(head, options))
    assert [c["name"] for c in created["spec"]["containers"]] == ["ray-head", "autoscaler"]
    unsafe = {**options, "securityContext": {**options["securityContext"], "allowPrivilegeEscalation": True}}
    with pytest.raises(ApiError) as refused:
        create(api, with_autoscaler_sidecar(head, unsafe))
    assert 'violates PodSecurity "restricted:latest"' in str(refused.value) and "autoscaler" in str(refused.value)
