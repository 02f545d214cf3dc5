"""Vendorable under policy (#18): labels and annotations on every object and pod, security contexts
overridable per group, the read-only root filesystem's writable dirs, scheduling per group, image
registry and digest, namespaceOverride."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CI_VALUES_DIR, NAMESPACE, RELEASE, VALUES_DIR, Render, helm_template, pod_templates

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
SHARED = VALUES_DIR / "shared-cluster.yaml"
PARALLEL_HELM = 4
COMMON = {"commonLabels": {"team": "vision", "example.com/cost-center": "ml-4711"},
          "commonAnnotations": {"example.com/owner": "vision-team@example.com"}}
DIGEST = "sha256:" + "0123456789abcdef" * 4
WORKER_DIGEST = "sha256:" + "fedcba9876543210" * 4


def pods(r: Render) -> list[tuple[str, dict[str, Any]]]:
    """(where, pod template or Pod) of every pod the render makes."""
    out: list[tuple[str, dict[str, Any]]] = []
    for doc in r.docs:
        if doc["kind"] in ("RayCluster", "RayJob"):
            out += [(f"{doc['kind']}:{role}", tpl) for role, tpl in pod_templates(doc)]
        if doc["kind"] == "RayJob":
            out.append(("submitter", doc["spec"]["submitterPodTemplate"]))
        if doc["kind"] == "Pod":
            out.append(("test", doc))
    return out


def role_of(where: str) -> str:
    """"RayJob:head" -> head, "RayCluster:worker:gpu-workers" -> worker, "submitter", "test"."""
    return where.split(":")[1] if ":" in where else where


def by_role(r: Render, role: str) -> dict[str, Any]:
    found = [tpl for where, tpl in pods(r) if role_of(where) == role]
    assert found, (role, [w for w, _ in pods(r)])
    return found[0]


def mounts(pod: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0].get("volumeMounts", [])}


def volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in pod["spec"].get("volumes", [])}


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Render]:
    """Every ci/ and values/ file with commonLabels/commonAnnotations laid over it."""
    extra = tmp_path_factory.mktemp("policy") / "common.yaml"
    extra.write_text(yaml.safe_dump(COMMON))
    files = sorted(CI_VALUES_DIR.glob("*.yaml")) + sorted(VALUES_DIR.glob("*.yaml"))
    with ThreadPoolExecutor(PARALLEL_HELM) as pool:
        results = list(pool.map(lambda f: helm_template([f, extra]), files))
    out = {f.name: r for f, r in zip(files, results, strict=True)}
    assert not {n: r.stderr for n, r in out.items() if r.returncode}
    return out


# ---------------------------------------------------------------- labels and annotations


def test_common_labels_and_annotations_land_on_every_object_and_pod(labelled: dict[str, Render]) -> None:
    assert len(labelled) >= 12
    for name, r in labelled.items():
        assert r.docs, name
        for doc in r.docs:
            meta = doc["metadata"]
            where = (name, doc["kind"], meta["name"])
            assert COMMON["commonLabels"].items() <= meta.get("labels", {}).items(), where
            assert COMMON["commonAnnotations"].items() <= meta.get("annotations", {}).items(), where
            assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE, where
        for where, pod in pods(r):
            assert COMMON["commonLabels"].items() <= pod["metadata"]["labels"].items(), (name, where)
            assert COMMON["commonAnnotations"].items() <= pod["metadata"]["annotations"].items(), (name, where)


def test_without_common_labels_nothing_is_added(renders: dict[str, Render]) -> None:
    """The control: the same renders without the values carry none of the keys."""
    r = renders["default-values.yaml"]
    for doc in r.docs:
        assert "team" not in doc["metadata"].get("labels", {}), doc["kind"]
        assert "example.com/owner" not in doc["metadata"].get("annotations", {}), doc["kind"]


def test_an_objects_own_labels_and_the_charts_win(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={**COMMON, "commonLabels": {"team": "common", "tier": "common"},
                                 "workers.podLabels": {"team": "workers"}, "head.podAnnotations": {"example.com/owner": "head"},
                                 "rayJob.labels": {"tier": "job"}})
    assert r.returncode == 0, r.stderr
    assert by_role(r, "worker")["metadata"]["labels"]["team"] == "workers"
    assert by_role(r, "head")["metadata"]["labels"]["team"] == "common"
    assert by_role(r, "head")["metadata"]["annotations"]["example.com/owner"] == "head"
    assert r.one("RayJob")["metadata"]["labels"]["tier"] == "job"
    assert r.one("Service")["metadata"]["labels"]["tier"] == "common"
    # The Service still selects the head pods: selectors are the chart's alone.
    head_labels = by_role(r, "head")["metadata"]["labels"]
    assert r.one("Service")["spec"]["selector"].items() <= head_labels.items()
    assert by_role(r, "test")["metadata"]["annotations"]["helm.sh/hook"] == "test"


# ---------------------------------------------------------------- security contexts


def test_group_keys_replace_global_keys_whole(render: Callable[..., Render], tmp_path: Path) -> None:
    f = tmp_path / "sc.yaml"
    f.write_text(yaml.safe_dump({
        "podSecurityContext": {"fsGroupChangePolicy": None, "supplementalGroups": [4242]},
        "workers": {"podSecurityContext": {"runAsUser": 2000},
                    "containerSecurityContext": {"runAsUser": 2000, "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}},
        "rayJob": {"submitterContainerSecurityContext": {"readOnlyRootFilesystem": True}},
        "tests": {"containerSecurityContext": {"allowPrivilegeEscalation": False, "privileged": False}},
    }))
    r = render(CI_DEFAULT, f)
    assert r.returncode == 0, r.stderr
    for where, pod in pods(r):
        psc = pod["spec"]["securityContext"]
        assert "fsGroupChangePolicy" not in psc and psc["supplementalGroups"] == [4242], where
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, where
    worker = by_role(r, "worker")
    assert worker["spec"]["securityContext"]["runAsUser"] == 2000
    wsc = worker["spec"]["containers"][0]["securityContext"]
    assert wsc["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]} and wsc["runAsUser"] == 2000
    head = by_role(r, "head")
    assert head["spec"]["securityContext"]["runAsUser"] == 1000
    assert head["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    sub = by_role(r, "submitter")["spec"]["containers"][0]["securityContext"]
    assert sub["readOnlyRootFilesystem"] is True and head["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_a_group_can_turn_a_global_true_off(render: Callable[..., Render]) -> None:
    """false in a group wins over true globally (no merge that skips falsy values)."""
    r = render(CI_DEFAULT, sets={"containerSecurityContext.readOnlyRootFilesystem": True,
                                 "head.containerSecurityContext": {"readOnlyRootFilesystem": False}})
    assert r.returncode == 0, r.stderr
    assert by_role(r, "head")["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert "/tmp" not in mounts(by_role(r, "head"))
    assert by_role(r, "worker")["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert "/tmp" in mounts(by_role(r, "worker"))


# ---------------------------------------------------------------- read-only root filesystem

RAY_WRITABLE = {"/tmp/ray": "ray-logs", "/tmp": "tmp", "/home/ray/.cache": "home-cache",
                "/home/ray/.triton": "home-triton", "/home/ray/.config": "home-config"}


def test_ray_pods_always_mount_tmp_ray_as_kubernetes_ray_logs(renders: dict[str, Render]) -> None:
    for name, r in renders.items():
        for where, pod in pods(r):
            if where.startswith(("RayCluster", "RayJob")):
                assert mounts(pod)["/tmp/ray"] == "ray-logs", (name, where)
                assert volumes(pod)["ray-logs"] == {"name": "ray-logs", "emptyDir": {}}, (name, where)
                ro = pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"]
                assert ("/tmp" in mounts(pod)) is ro, (name, where)


def test_read_only_root_gets_every_writable_dir(renders: dict[str, Render]) -> None:
    r = renders["shared-cluster.yaml"]
    for where, pod in pods(r):
        c = pod["spec"]["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        want = RAY_WRITABLE if where.startswith(("RayCluster", "RayJob")) else {"/tmp": "tmp"}
        got = {p: n for p, n in mounts(pod).items() if n in set(RAY_WRITABLE.values())}
        assert got == want, (where, got)
        for n in want.values():
            assert volumes(pod)[n]["emptyDir"] == {}, (where, n)
    # The submitter still mounts the trainer ConfigMap read-only.
    assert mounts(by_role(r, "submitter"))["/home/ray/trainer"] == "trainer"


def test_the_autoscaler_sidecar_takes_the_heads_context_and_tmp(render: Callable[..., Render]) -> None:
    r = render(CI_VALUES_DIR / "spot-autoscaling-values.yaml", sets={"head.containerSecurityContext": {"readOnlyRootFilesystem": True}})
    assert r.returncode == 0, r.stderr
    spec = r.one("RayCluster")["spec"]
    head_sc = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert spec["autoscalerOptions"]["securityContext"] == head_sc and head_sc["readOnlyRootFilesystem"] is True
    assert spec["autoscalerOptions"]["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    plain = render(CI_VALUES_DIR / "spot-autoscaling-values.yaml").one("RayCluster")["spec"]["autoscalerOptions"]
    assert "volumeMounts" not in plain


# ---------------------------------------------------------------- scheduling


def test_priority_classes_spread_and_pod_placement(render: Callable[..., Render]) -> None:
    spread = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "DoNotSchedule",
               "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "ray-worker"}}}]
    tol = [{"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}]
    r = render(CI_DEFAULT, sets={"head.priorityClassName": "ml-training-head", "workers.priorityClassName": "ml-training",
                                 "workers.topologySpreadConstraints": spread, "head.topologySpreadConstraints": spread[:0],
                                 "rayJob.submitterNodeSelector": {"pool": "cpu"}, "rayJob.submitterTolerations": tol,
                                 "tests.nodeSelector": {"pool": "ci"}, "tests.tolerations": tol})
    assert r.returncode == 0, r.stderr
    head, worker = by_role(r, "head")["spec"], by_role(r, "worker")["spec"]
    assert head["priorityClassName"] == "ml-training-head" and worker["priorityClassName"] == "ml-training"
    assert worker["topologySpreadConstraints"] == spread and "topologySpreadConstraints" not in head
    sub, test = by_role(r, "submitter")["spec"], by_role(r, "test")["spec"]
    assert sub["nodeSelector"] == {"pool": "cpu"} and sub["tolerations"] == tol
    assert test["nodeSelector"] == {"pool": "ci"} and test["tolerations"] == tol
    plain = render(CI_DEFAULT)
    for where, pod in pods(plain):
        assert not {"priorityClassName", "topologySpreadConstraints"} & set(pod["spec"]), where
        if where in ("submitter", "test"):
            assert not {"nodeSelector", "tolerations"} & set(pod["spec"]), where


# ---------------------------------------------------------------- images


def images(r: Render) -> dict[str, str]:
    return {role_of(where): pod["spec"]["containers"][0]["image"] for where, pod in pods(r)}


def test_a_digest_renders_as_a_digest_and_wins_over_the_tag(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"image.registry": "us-docker.pkg.dev/my-project/mirror", "head.image.digest": DIGEST,
                                 "head.image.tag": "ignored", "workers.image.digest": WORKER_DIGEST})
    assert r.returncode == 0, r.stderr
    got = images(r)
    head = f"us-docker.pkg.dev/my-project/mirror/rayproject/ray@{DIGEST}"
    assert got["head"] == got["submitter"] == got["test"] == head
    assert got["worker"] == f"us-docker.pkg.dev/my-project/mirror/rayproject/ray@{WORKER_DIGEST}"
    assert ":ignored" not in r.stdout and "@sha256" not in render(CI_DEFAULT).stdout


def test_registry_prefixes_only_repositories_without_one(render: Callable[..., Render]) -> None:
    trainer = "us-docker.pkg.dev/p/r/gemma3-ray-trainer"
    r = render(CI_VALUES_DIR / "training-image-values.yaml", sets={"image.registry": "mirror.example.com:5000",
                                                                  "workers.image.digest": WORKER_DIGEST})
    assert r.returncode == 0, r.stderr
    got = images(r)
    assert got["head"].startswith("mirror.example.com:5000/rayproject/ray:")
    assert got["worker"] == f"us-docker.pkg.dev/example-project/gemma3-ray/gemma3-ray-trainer@{WORKER_DIGEST}"
    local = render(CI_DEFAULT, sets={"image.registry": "mirror.example.com", "head.image.repository": "localhost/ray",
                                     "workers.image.repository": trainer, "workers.image.registry": "other.example.com"})
    got = images(local)
    assert got["head"].startswith("localhost/ray:") and got["worker"].startswith(trainer + ":")


def test_dependencies_image_accepts_a_digest_instead_of_a_tag(render: Callable[..., Render]) -> None:
    r = render(CI_DEFAULT, sets={"dependencies": "image", "workers.image.repository": "us-docker.pkg.dev/p/r/trainer",
                                 "workers.image.digest": WORKER_DIGEST})
    assert r.returncode == 0, r.stderr
    assert images(r)["worker"] == f"us-docker.pkg.dev/p/r/trainer@{WORKER_DIGEST}"
    bare = render(CI_DEFAULT, sets={"dependencies": "image", "workers.image.repository": "us-docker.pkg.dev/p/r/trainer"})
    assert bare.returncode != 0 and "workers.image.digest" in bare.stderr


# ---------------------------------------------------------------- namespace


def test_namespace_override_moves_every_namespaced_object(render: Callable[..., Render]) -> None:
    r = render(CI_VALUES_DIR / "token-extras-values.yaml", sets={"namespaceOverride": "team-vision", "networkPolicy.enabled": True})
    assert r.returncode == 0, r.stderr
    assert {d["kind"] for d in r.docs} >= {"ConfigMap", "Service", "RayJob", "Secret", "NetworkPolicy", "Pod"}
    for doc in r.docs:
        assert doc["metadata"]["namespace"] == "team-vision", doc["kind"]
    env = {e["name"]: e["value"] for e in by_role(r, "test")["spec"]["containers"][0]["env"]}
    assert env["RAY_DASHBOARD_URL"] == "http://demo-gemma3-ray-head.team-vision.svc:8265"
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in render(CI_DEFAULT).docs)
