"""Names from the user reach the API server as the strings they are, and never collide (#27 item 8).

- YAML reads `no`, `on`, `yes`, `true`, `off`, `y`, `null`, `1e3`, `0x10`, `123` as booleans, numbers or
  null: a release name, namespace, name override or any other name-like value the chart renders must
  stay a string. Every render is sent to the session's real v1.32 API server by `kubectl create
  --dry-run=server --validate=strict` (kubectl's YAML decoding, the API types, the KubeRay CRD schemas),
  which refuses a label that decoded as a bool ("cannot unmarshal bool into ... labels").
- Two release names sharing their first 40 characters get different object names (the full name is
  shortened with a hash of the whole name), so the second `helm install` in a namespace does not fail
  with "cannot be imported into the current release"; both install on the real API server.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CI_VALUES_DIR, Render, helm_bin, helm_template

from tests.lifecycle.kube_api import ApiError, ApiServer, connect

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
KUBERAY_MAX_RAYJOB_NAME = 47
FULLNAME_MAX = 40
# Strings YAML 1.1 (kubectl's and Helm's decoder) reads as another type, each a valid DNS label.
TYPED_WORDS = ["no", "on", "yes", "true", "off", "y", "n", "null", "false"]
NAME_LIKE_SETS = {  # every name-like value of the chart, set to a word YAML would retype
    "nameOverride": "yes",
    "serviceAccount.name": "off",
    "hfToken.existingSecret": "y",
    "hfToken.secretKey": "true",
    "image.pullSecrets[0]": "null",
    "workers.groupName": "n",
    "networkPolicy.operatorNamespaces[0]": "false",
    "rayJob.runId": "1e3",
    "commonLabels.team": "no",
    "head.podLabels.tier": "on",
    "workers.podLabels.tier": "yes",
    "rayJob.labels.cost": "off",
    "kueue.queueName": "true",
    "commonAnnotations.owner": "no",
    "head.podAnnotations.note": "0x10",
    "storage.prefix": "no",
}
# (release, namespace, extra --set-string): release names that are YAML numbers must use fullnameOverride
# (the chart's names start with a letter, as KubeRay requires).
RELEASES = [
    ("no", "on", NAME_LIKE_SETS),
    ("on", "no", {}),
    ("true", "off", {"fullnameOverride": "yes"}),
    ("1e3", "on", {"fullnameOverride": "off"}),
    ("0x10", "no", {"fullnameOverride": "null"}),
    ("123", "off", {"fullnameOverride": "n"}),
]


@pytest.fixture(scope="module")
def api(kube_apiserver: Path) -> Iterator[ApiServer]:
    server = connect(kube_apiserver)
    for ns in sorted({ns for _, ns, _ in RELEASES} | {"collide"}):
        try:
            server.namespace(ns)
        except ApiError as e:
            if e.code != 409:
                raise
    yield server


def _render(release: str, namespace: str, sets: dict[str, str], helm: str = "HELM") -> Render:
    args = ["--set", "networkPolicy.enabled=true"]  # every optional object the chart makes, to be checked too
    for key, value in sets.items():
        args += ["--set-string", f"{key}={value}"]
    return helm_template([CI_DEFAULT], release=release, namespace=namespace, helm=helm, extra_args=tuple(args))


def _string_maps(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of every labels/annotations/matchLabels/selector entry in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{path}.{key}"
            if key in ("labels", "annotations", "matchLabels", "nodeSelector") and isinstance(value, dict):
                for k, v in value.items():
                    yield f"{here}.{k}", v
            else:
                yield from _string_maps(value, here)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _string_maps(item, f"{path}[{i}]")


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
@pytest.mark.parametrize(("release", "namespace", "sets"), RELEASES, ids=[r for r, _, _ in RELEASES])
def test_yaml_typed_names_reach_the_api_server_as_strings(api: ApiServer, helm: str, release: str,
                                                          namespace: str, sets: dict[str, str]) -> None:
    r = _render(release, namespace, sets, helm)
    assert r.returncode == 0, r.stderr
    # Every map the API types as map[string]string holds strings only (YAML 1.1 as PyYAML reads it).
    typed = [(d["kind"], p, v) for d in r.docs for p, v in _string_maps(d) if not isinstance(v, str)]
    assert typed == []
    for doc in r.docs:
        assert isinstance(doc["metadata"]["name"], str) and isinstance(doc["metadata"].get("namespace", ""), str)
    # The real decoder and API server accept every object (a retyped value fails the whole create).
    created = subprocess.run(["kubectl", "create", "--dry-run=server", "--validate=strict", "-o", "json", "-f", "-"],
                             input=r.stdout, capture_output=True, text=True, env=api.env(), timeout=120)
    assert created.returncode == 0, created.stderr
    items, text, at = [], created.stdout, 0
    while text[at:].strip():  # one JSON object per created document
        item, at = json.JSONDecoder().raw_decode(text, len(text) - len(text[at:].lstrip()))
        items.append(item)
    assert len(items) == len(r.docs)
    for item in items:
        labels = item["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == release, item["kind"]
        assert item["metadata"]["namespace"] == namespace
    if sets is NAME_LIKE_SETS:
        by_kind = {i["kind"]: i for i in items}
        assert by_kind["ServiceAccount"]["metadata"]["name"] == "off"
        assert by_kind["RayJob"]["metadata"]["labels"]["app.kubernetes.io/name"] == "yes"
        assert by_kind["RayJob"]["metadata"]["labels"]["team"] == "no"
        assert by_kind["RayJob"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "true"
        assert by_kind["RayJob"]["metadata"]["name"].endswith("-1e3")
        pod = by_kind["RayJob"]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]
        assert pod["metadata"]["labels"]["tier"] == "on" and pod["metadata"]["annotations"]["note"] == "0x10"
        assert pod["spec"]["imagePullSecrets"] == [{"name": "null"}]
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "y", "key": "true"}
        netpol = by_kind["NetworkPolicy"]["spec"]["ingress"]
        assert {"kubernetes.io/metadata.name": "false"} in [
            f.get("namespaceSelector", {}).get("matchLabels") for rule in netpol for f in rule.get("from", [])]
    else:
        assert all(i["metadata"]["name"].startswith(sets.get("fullnameOverride", release)) for i in items)


def _names(r: Render) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in r.docs}


LONG_A = "team-vision-sweep-2026-12-01-lr1e4-bs64-" + "first"
LONG_B = "team-vision-sweep-2026-12-01-lr1e4-bs64-" + "other"


@pytest.mark.parametrize("run_id", ["", "nightly-2026-12-01-lr1e4"])
def test_release_names_sharing_their_first_40_characters_do_not_collide(run_id: str) -> None:
    assert LONG_A[:FULLNAME_MAX] == LONG_B[:FULLNAME_MAX] and len(LONG_A) <= 53
    sets = {"rayJob.runId": run_id} if run_id else {}
    a, b = _render(LONG_A, "collide", sets), _render(LONG_B, "collide", sets)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert _names(a).isdisjoint(_names(b)), sorted(_names(a) & _names(b))
    for r in (a, b):
        job = r.one("RayJob")["metadata"]["name"]
        assert len(job) <= KUBERAY_MAX_RAYJOB_NAME and job.endswith(f"-{run_id or 'r1'}"), job
        for kind, name in _names(r):
            assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), (kind, name)
        sa = r.one("ServiceAccount")["metadata"]["name"]
        assert len(sa) <= FULLNAME_MAX and sa.startswith(LONG_A[:30]), sa
    # Short names keep their plain form (no hash): upgrades of existing releases keep their objects.
    short = _render("team-vision", "collide", {})
    assert short.one("ServiceAccount")["metadata"]["name"] == "team-vision-gemma3-ray"


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_both_long_releases_install_in_one_namespace(api: ApiServer, helm: str) -> None:
    """The symptom itself, on the real API server: the second install used to fail with Helm's
    "cannot be imported into the current release"."""
    ns = f"collide-{helm.lower()}"
    try:
        api.namespace(ns)
    except ApiError as e:
        if e.code != 409:
            raise
    done = []
    try:
        for release in (LONG_A, LONG_B):
            p = subprocess.run([helm_bin(helm), "install", release, str(CI_DEFAULT.parents[1]), "-n", ns, "-f",
                                str(CI_DEFAULT), "--set", "tests.enabled=false"],
                               capture_output=True, text=True, env=api.env(), timeout=180)
            assert p.returncode == 0, p.stderr
            done.append(release)
        jobs = api.admin.items(f"/apis/ray.io/v1/namespaces/{ns}/rayjobs")
        assert len({j["metadata"]["name"] for j in jobs}) == 2
    finally:
        for release in done:
            subprocess.run([helm_bin(helm), "uninstall", release, "-n", ns], capture_output=True, env=api.env(),
                           timeout=180)


def test_typed_words_are_all_checked() -> None:
    """The list covers the words both decoders retype (kept honest: each really loads as non-string in
    YAML 1.1 or Go's YAML, which also reads y/n as booleans and 1e3/0x10 as numbers)."""
    py_typed = [w for w in TYPED_WORDS if not isinstance(yaml.safe_load(f"k: {w}")["k"], str)]
    assert set(py_typed) >= {"no", "on", "yes", "true", "off", "null", "false"}
