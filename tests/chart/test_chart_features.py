"""Modes, capacity, autoscaling, security, Secrets, NetworkPolicy, hooks, NOTES, helm test."""

from __future__ import annotations

import base64
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, CI_VALUES_DIR, NAMESPACE, RELEASE, VALUES_DIR, Render, helm_bin, pod_templates

CI = CI_VALUES_DIR
TOKEN_VALUE = "hf_ci_dummy_token_not_a_secret"
HOOK = "helm.sh/hook"
FULLNAME = f"{RELEASE}-gemma3-ray"
HELM_TIMEOUT_S = 120


def all_pod_specs(r: Render) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for doc in r.docs:
        if doc["kind"] in ("RayCluster", "RayJob"):
            out += [(f"{doc['kind']}:{role}", tpl["spec"]) for role, tpl in pod_templates(doc)]
        if doc["kind"] == "RayJob":
            out.append(("submitter", doc["spec"]["submitterPodTemplate"]["spec"]))
        if doc["kind"] == "Pod":
            out.append(("test", doc["spec"]))
    return out


def worker_spec(r: Render) -> dict[str, Any]:
    doc = r.kinds("RayCluster")[0] if r.kinds("RayCluster") else r.one("RayJob")
    return [tpl for role, tpl in pod_templates(doc) if role.startswith("worker")][0]["spec"]


def notes(values: Path, **sets: str) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (Helm 4 needs no cluster for that)."""
    cmd = [helm_bin("HELM"), "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values), "--dry-run=client"]
    for k, v in sets.items():
        cmd += ["--set-string", f"{k}={v}"]
    env = {**os.environ, "KUBECONFIG": os.devnull}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("\nNOTES:\n", 1)[1]


# ---------------------------------------------------------------- modes


def test_persistent_mode_is_the_tutorial(renders: dict[str, Render]) -> None:
    r = renders["tutorial.yaml"]
    cluster = r.one("RayCluster")
    job = r.one("RayJob")
    assert HOOK not in cluster["metadata"].get("annotations", {}), "the RayCluster is a release resource"
    assert job["spec"]["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    for absent in ("rayClusterSpec", "shutdownAfterJobFinishes", "backoffLimit", "ttlSecondsAfterFinished"):
        assert absent not in job["spec"], absent


def test_ephemeral_mode_inlines_the_same_cluster_and_releases_gpus(renders: dict[str, Render], render: Callable[..., Render]) -> None:
    eph = renders["default-values.yaml"]
    assert not eph.kinds("RayCluster")
    spec = eph.one("RayJob")["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == 300
    assert spec["backoffLimit"] == 0
    assert "clusterSelector" not in spec
    # One set of pod templates: the inline spec equals the persistent RayCluster's spec.
    per = render(CI / "default-values.yaml", sets={"mode": "persistent"})
    assert spec["rayClusterSpec"] == per.one("RayCluster")["spec"]


def test_ephemeral_is_the_default_mode() -> None:
    assert yaml.safe_load((CHART / "values.yaml").read_text())["mode"] == "ephemeral"
    assert yaml.safe_load((VALUES_DIR / "tutorial.yaml").read_text())["mode"] == "persistent"


def test_rayjob_is_a_release_resource_named_after_the_revision(renders: dict[str, Render]) -> None:
    """Not a hook (issue #19, failure 4): Helm creates each revision's RayJob, deletes the previous one
    (a new name each revision), re-applies an old revision's on rollback and deletes it on uninstall,
    with no pod. `helm template` renders revision 1."""
    for name, r in renders.items():
        job = r.one("RayJob")
        assert HOOK not in job["metadata"].get("annotations", {}), name
        assert job["metadata"]["name"] == f"{FULLNAME}-r1", name
        spec = job["spec"]
        assert spec["submissionMode"] == "K8sJobMode" and spec["activeDeadlineSeconds"] >= 1
        assert spec["submitterConfig"]["backoffLimit"] >= 0
        assert spec["submitterPodTemplate"]["spec"]["containers"][0]["resources"]["limits"]


KUBERAY_MAX_RAYJOB_NAME = 47  # ValidateRayJobMetadata: MaxRayJobNameLength = 53 - 6 (v1.4.2 and v1.7.0)


@pytest.mark.parametrize("run_id", ["", "a", "lr-1e4-sweep-0123456789ab"[:24]])
def test_rayjob_name_fits_kuberay_keeping_its_suffix(render: Callable[..., Render], run_id: str) -> None:
    """The longest full name (40) with the longest runId (24): the base is shortened, never the suffix;
    with runId the run name is deterministic (no time or random part)."""
    sets = {"fullnameOverride": "f" * 39 + "x"}
    if run_id:
        sets["rayJob.runId"] = run_id
    r = render(CI / "default-values.yaml", sets=sets)
    job = r.one("RayJob")
    name, suffix = job["metadata"]["name"], run_id or "r1"
    assert len(name) <= KUBERAY_MAX_RAYJOB_NAME and name.endswith(f"-{suffix}"), name
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name
    base, room = name[: -len(suffix) - 1], KUBERAY_MAX_RAYJOB_NAME - 1 - len(suffix)
    full = sets["fullnameOverride"]
    # The full name if it fits, else its start and a hash of all of it (two names sharing a start differ).
    assert base == full if len(full) <= room else re.fullmatch(rf"f{{{room - 6}}}-[0-9a-f]{{5}}", base), name
    if run_id:
        assert f"--run_name=r1-{run_id}" in job["spec"]["entrypoint"]
        again = render(CI / "default-values.yaml", sets=sets).one("RayJob")
        assert again == job, "with rayJob.runId the RayJob renders the same every time (GitOps)"


def test_the_only_hook_is_the_helm_test_pod(renders: dict[str, Render]) -> None:
    """No lifecycle step runs a pod: the only hook is `helm test`'s, deleted by its own policy (a failed
    one is left for inspection; NOTES give its command). NOTES give the one-line escape for a RayJob
    held by KubeRay's finalizer."""
    for name, r in renders.items():
        for doc in r.docs:
            ann = doc["metadata"].get("annotations", {})
            assert "helm.sh/resource-policy" not in ann, (name, doc["kind"])
        hooks = {(d["kind"], d["metadata"]["annotations"][HOOK]) for d in r.docs
                 if HOOK in d["metadata"].get("annotations", {})}
        assert hooks <= {("Pod", "test")}, (name, hooks)
        assert not r.kinds("Job") and not r.kinds("Role") and not r.kinds("RoleBinding"), name
    text = notes(VALUES_DIR / "tutorial.yaml")
    assert "delete rayjob" not in text, "NOTES must not ask for a manual RayJob deletion"
    assert (f"kubectl -n {NAMESPACE} patch rayjob {FULLNAME}-r1 --type=merge "
            """-p '{"metadata":{"finalizers":null}}'""") in text
    assert f"kubectl -n {NAMESPACE} delete pod {FULLNAME}-test-head" in text
    assert f"helm uninstall {RELEASE} -n {NAMESPACE}" in text


# ---------------------------------------------------------------- the tutorial's shape


def test_tutorial_values_reproduce_the_tutorial_shape(renders: dict[str, Render]) -> None:
    r = renders["tutorial.yaml"]
    spec = r.one("RayCluster")["spec"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "dashboard-port": "8265"}
    assert head["serviceType"] == "ClusterIP"
    (hc,) = head["template"]["spec"]["containers"]
    assert hc["resources"]["requests"] == {"cpu": "24", "memory": "64Gi", "ephemeral-storage": "9Gi"}
    assert {p["name"]: p["containerPort"] for p in hc["ports"]} == {"gcs-server": 6379, "dashboard": 8265, "client": 10001}
    (group,) = spec["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    (wc,) = group["template"]["spec"]["containers"]
    assert wc["resources"]["limits"] == {"cpu": "80", "memory": "320Gi", "nvidia.com/gpu": 8}
    assert group["template"]["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-b200",
        "cloud.google.com/gke-gpu-driver-version": "latest",
        "cloud.google.com/reservation-name": "my-b200-reservation",
        "cloud.google.com/reservation-affinity": "specific",
    }
    (sa,) = [s for s in r.kinds("ServiceAccount") if s["metadata"]["name"] == FULLNAME]
    assert sa["metadata"]["annotations"] == {"iam.gke.io/gcp-service-account": "gemma3-ray@my-project.iam.gserviceaccount.com"}
    assert sorted(d["kind"] for d in r.docs) == ["ConfigMap", "Pod", "RayCluster", "RayJob", "Service", "ServiceAccount"]


# ---------------------------------------------------------------- capacity


def test_shared_reservation_path_becomes_name_and_project(renders: dict[str, Render]) -> None:
    sel = worker_spec(renders["persistent-shared-reservation-values.yaml"])["nodeSelector"]
    assert sel["cloud.google.com/reservation-name"] == "b200-pool"
    assert sel["cloud.google.com/reservation-project"] == "shared-gpu-project"
    assert sel["cloud.google.com/reservation-affinity"] == "specific"
    assert "cloud.google.com/gke-spot" not in sel


def test_spot_capacity_selects_and_tolerates_spot(renders: dict[str, Render]) -> None:
    spec = worker_spec(renders["spot-autoscaling-values.yaml"])
    assert spec["nodeSelector"]["cloud.google.com/gke-spot"] == "true"
    assert not any(k.startswith("cloud.google.com/reservation") for k in spec["nodeSelector"])
    assert {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"} in spec["tolerations"]


def test_no_capacity_choice_adds_nothing(renders: dict[str, Render]) -> None:
    spec = worker_spec(renders["default-values.yaml"])
    assert set(spec["nodeSelector"]) == {"cloud.google.com/gke-accelerator", "cloud.google.com/gke-gpu-driver-version"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_cpu_only_workers_request_no_gpu(renders: dict[str, Render]) -> None:
    r = renders["local.yaml"]
    spec = worker_spec(r)
    assert "nodeSelector" not in spec and "tolerations" not in spec
    (c,) = spec["containers"]
    assert "nvidia.com/gpu" not in c["resources"]["limits"]
    assert not c["image"].endswith("-gpu")


def test_scheduling_passthrough(renders: dict[str, Render]) -> None:
    r = renders["token-extras-values.yaml"]
    spec = worker_spec(r)
    assert spec["nodeSelector"]["cloud.google.com/compute-class"] == "gpu-pool"
    assert spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1
    assert {"name": "datasets", "mountPath": "/data", "readOnly": True} in spec["containers"][0]["volumeMounts"]
    head = [tpl for role, tpl in pod_templates(r.one("RayJob")) if role == "head"][0]["spec"]
    assert head["tolerations"][0]["key"] == "dedicated"
    assert head["nodeSelector"] == {"cloud.google.com/machine-family": "n2"}
    assert head["imagePullSecrets"] == [{"name": "mirror-pull"}]


# ---------------------------------------------------------------- autoscaling


def test_autoscaling_works_end_to_end_in_the_spec(renders: dict[str, Render]) -> None:
    r = renders["spot-autoscaling-values.yaml"]
    spec = r.one("RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    opts = spec["autoscalerOptions"]
    assert opts["idleTimeoutSeconds"] == 300 and opts["securityContext"]["allowPrivilegeEscalation"] is False
    (group,) = spec["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 3)
    head = spec["headGroupSpec"]["template"]["spec"]
    assert head["automountServiceAccountToken"] is True, "the autoscaler sidecar needs the API"
    assert group["template"]["spec"]["automountServiceAccountToken"] is False


def test_without_autoscaling_the_autoscaler_is_absent(renders: dict[str, Render]) -> None:
    spec = renders["tutorial.yaml"].one("RayCluster")["spec"]
    assert "enableInTreeAutoscaling" not in spec and "autoscalerOptions" not in spec


# ---------------------------------------------------------------- security


def test_security_defaults_on_every_pod(renders: dict[str, Render]) -> None:
    for name, r in renders.items():
        for where, spec in all_pod_specs(r):
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 1000, (name, where)
            assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, (name, where)
            autoscaling_head = where.endswith("head") and "enableInTreeAutoscaling" in str(r.docs)
            if not autoscaling_head:
                assert spec["automountServiceAccountToken"] is False, (name, where)
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, (name, where)
                assert sc["capabilities"] == {"drop": ["ALL"]}, (name, where)
                assert c["resources"]["limits"] and c["resources"]["requests"], (name, where)
        for sa in r.kinds("ServiceAccount"):
            assert sa["automountServiceAccountToken"] is False


def test_dashboard_is_only_on_a_cluster_ip_service(renders: dict[str, Render]) -> None:
    for name, r in renders.items():
        for svc in r.kinds("Service"):
            assert svc["spec"]["type"] == "ClusterIP", name
            assert svc["spec"]["selector"] == {"app.kubernetes.io/instance": RELEASE, "app.kubernetes.io/component": "ray-head"}
        for doc in r.docs:
            if doc["kind"] in ("RayCluster", "RayJob"):
                spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"].get("rayClusterSpec")
                if spec:
                    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
                    assert "enableIngress" not in spec["headGroupSpec"]


def test_head_pods_match_the_service_selector(renders: dict[str, Render]) -> None:
    r = renders["default-values.yaml"]
    sel = r.one("Service")["spec"]["selector"]
    head = [tpl for role, tpl in pod_templates(r.one("RayJob")) if role == "head"][0]
    assert sel.items() <= head["metadata"]["labels"].items()
    worker = [tpl for role, tpl in pod_templates(r.one("RayJob")) if role != "head"][0]
    assert not sel.items() <= worker["metadata"]["labels"].items()


def test_network_policy_limits_the_head_to_the_release(renders: dict[str, Render]) -> None:
    assert not renders["default-values.yaml"].kinds("NetworkPolicy"), "optional, off by default"
    r = renders["spot-autoscaling-values.yaml"]
    np = r.one("NetworkPolicy")["spec"]
    assert np["podSelector"]["matchLabels"] == r.one("Service")["spec"]["selector"]
    assert np["policyTypes"] == ["Ingress"]
    own, operator = np["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE}}}]}
    assert operator["ports"] == [{"port": 8265, "protocol": "TCP"}]
    assert operator["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kuberay-system"}}}]
    # Every pod of the release carries the label the policy admits.
    for doc in r.docs:
        if doc["kind"] in ("RayCluster", "RayJob"):
            for _, tpl in pod_templates(doc):
                assert tpl["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert r.one("RayJob")["spec"]["submitterPodTemplate"]["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


# ---------------------------------------------------------------- the Hugging Face token


def test_token_reaches_pods_only_through_a_secret_key_ref(renders: dict[str, Render]) -> None:
    for name, r in renders.items():
        secret_name = None
        for where, spec in all_pod_specs(r):
            for c in spec["containers"]:
                env = {e["name"]: e for e in c.get("env", [])}
                if where.startswith(("RayCluster", "RayJob")) and "HF_TOKEN" in env:
                    ref = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
                    assert "value" not in env["HF_TOKEN"]
                    secret_name = ref["name"]
        values = yaml.safe_load((VALUES_DIR / name if (VALUES_DIR / name).exists() else CI / name).read_text())
        token = values.get("hfToken", {})
        if token.get("value"):
            assert secret_name == f"{FULLNAME}-hf-token"
        elif token.get("existingSecret", "hf-secret"):
            assert secret_name == token.get("existingSecret", "hf-secret"), name
        else:
            assert secret_name is None, name


def test_token_value_lands_only_in_the_secret(renders: dict[str, Render]) -> None:
    r = renders["token-extras-values.yaml"]
    secret = r.one("Secret")
    assert secret["metadata"]["name"] == f"{FULLNAME}-hf-token"
    assert base64.b64decode(secret["data"]["hf_api_token"]).decode() == TOKEN_VALUE
    others = yaml.safe_dump_all([d for d in r.docs if d["kind"] != "Secret"])
    assert TOKEN_VALUE not in others and base64.b64encode(TOKEN_VALUE.encode()).decode() not in others
    text = notes(CI / "token-extras-values.yaml")
    assert TOKEN_VALUE not in text and f"{FULLNAME}-hf-token" in text


def test_existing_service_account_is_used_not_created(renders: dict[str, Render]) -> None:
    r = renders["token-extras-values.yaml"]
    assert r.kinds("ServiceAccount") == []
    for where, spec in all_pod_specs(r):
        if where != "test":
            assert spec["serviceAccountName"] == "existing-training-sa", where


# ---------------------------------------------------------------- NOTES and helm test


def test_notes_tell_how_to_follow_open_find_and_clean(renders: dict[str, Render]) -> None:
    text = notes(VALUES_DIR / "tutorial.yaml")
    assert f"kubectl -n {NAMESPACE} get rayjob {FULLNAME}-r1 -w" in text
    assert f"kubectl -n {NAMESPACE} port-forward svc/{FULLNAME}-head 8265:8265" in text
    assert "gs://my-gemma3-ray-bucket/gemma3-vision" in text
    assert "stays up (and keeps its GPUs)" in text
    assert "16 Ray Train worker(s) (8 x nvidia-b200 per node)" in text
    eph = notes(CI / "default-values.yaml")
    assert "deletes it 300s after the job ends" in eph


def test_helm_test_pod_checks_the_head_with_the_head_image(renders: dict[str, Render]) -> None:
    r = renders["tutorial.yaml"]
    (pod,) = r.kinds("Pod")
    assert pod["metadata"]["annotations"][HOOK] == "test"
    (c,) = pod["spec"]["containers"]
    head_image = r.one("RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert c["image"] == head_image
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["RAY_DASHBOARD_URL"] == f"http://{FULLNAME}-head.{NAMESPACE}.svc:8265"
    assert pod["spec"]["restartPolicy"] == "Never"
    compile(c["command"][2], "helm-test", "exec")
    assert not renders["cpu-newer-kuberay-values.yaml"].kinds("Pod"), "tests.enabled=false drops it"


@pytest.mark.parametrize("release", ["a" * 53, "x"])
def test_names_fit_kuberay_limits(release: str) -> None:
    from helm_render import helm_template

    r = helm_template([CI / "default-values.yaml"], release=release)
    assert r.returncode == 0, r.stderr
    job = r.one("RayJob")["metadata"]["name"]
    assert len(job) <= KUBERAY_MAX_RAYJOB_NAME and job[0].isalpha() and job.endswith("-r1")


def test_notes_name_the_requested_token_auth_and_how_to_verify_it() -> None:
    """KubeRay before 1.5.1 prunes authOptions without an error (issue #19, failure 5): NOTES never say it
    is on, they say it was requested and give the command that reads it back from the live object."""
    eph = notes(CI / "cpu-newer-kuberay-values.yaml")
    per = notes(CI / "cpu-newer-kuberay-values.yaml", mode="persistent")
    for text in (eph, per):
        assert "Token authentication is on" not in text and "Requested: Ray token authentication" in text
    assert (f"kubectl -n {NAMESPACE} get rayjob {FULLNAME}-r1 -o jsonpath='{{.spec.rayClusterSpec.authOptions.mode}}'"
            in eph)
    assert f"kubectl -n {NAMESPACE} get raycluster {FULLNAME} -o jsonpath='{{.spec.authOptions.mode}}'" in per
    assert "Requested: Ray token authentication" not in notes(CI / "default-values.yaml")


def test_notes_say_what_the_deletion_rules_delete_and_when() -> None:
    """With rayJob.deletion NOTES say the workers go first and the cluster later (#34), never the TTL the rules
    replace; without it the TTL sentence as before."""
    text = notes(CI / "cpu-kuberay-1.7-values.yaml")
    assert "deletes its workers 0s after, keeping the head for its logs, and\ndeletes the cluster 600s after" in text
    assert "deletes it 300s after the job ends" not in text
    assert "deletes it 300s after the job ends" in notes(CI / "cpu-node-values.yaml")
