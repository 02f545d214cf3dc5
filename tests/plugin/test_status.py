"""`status`: every part it cannot read is "unknown" with the reason, never an exit 1 half-way
(issue #12 (8)); the newest run under <storage_path>/runs/ (the run-identity contract), on
fake-gcs-server."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.config.deployment import Overrides, resolve
from gemma3_ray.release import status

from tests.plugin.conftest import PROJECT, REGION, storage_client
from tests.plugin.kube_apiserver import kubectl
from tests.plugin.test_down_cluster import _rayjob
from tests.plugin.test_prereqs import _no_credentials

BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]


def test_status_without_a_cluster_or_credentials_reports_unknown(
    gcloud_home, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    _no_credentials(tmp_path, monkeypatch)
    assert cli.main(["status", *BASE, "--kubeconfig", str(tmp_path / "none")]) == 0
    out = capsys.readouterr().out.splitlines()
    by_part = {line.split(":", 1)[0]: line for line in out}
    assert "unknown (No usable kube context" in by_part["RayJob"]
    assert by_part["Newest run"].startswith("Newest run: unknown (Not logged in to Google Cloud")
    assert "gcloud auth application-default login" in by_part["Newest run"]


def test_the_newest_run_its_checkpoint_and_whether_it_finished(fake_gcs_factory) -> None:
    url = fake_gcs_factory(REGION)
    storage = storage_client(url)
    bucket = storage.create_bucket("runs-bucket")
    dep = resolve(Overrides(project=PROJECT, region=REGION, namespace="ml", bucket="runs-bucket"), None, None)
    assert status.run_lines(storage, dep) == [f"Newest run: none yet under gs://runs-bucket/{dep.prefix}/runs/"]
    runs = f"{dep.prefix}/runs"
    for name in ("r1-20261201T090000Z", "r2-20261201T100000Z"):
        for step in (1, 2):
            bucket.blob(f"{runs}/{name}/checkpoint_00000{step}/model.pt").upload_from_string("w")
            time.sleep(0.01)  # distinct write times (the server stamps them)
    bucket.blob(f"{runs}/r1-20261201T090000Z/summary.json").upload_from_string(json.dumps(
        {"completed": True, "global_step": 30, "final_eval_loss": 0.5}))
    time.sleep(0.01)
    bucket.blob("gemma3-ray/other/ml/runs/r9/checkpoint_000009/model.pt").upload_from_string("other release")
    bucket.blob(f"{runs}/r2-20261201T100000Z/metrics.jsonl").upload_from_string("{}\n")  # r2 written last
    head, ckpt = status.run_lines(storage, dep)
    assert head.startswith("Newest run: r2-20261201T100000Z, in progress (no summary.json yet)")
    assert ckpt.startswith(f"Newest checkpoint: gs://runs-bucket/{runs}/r2-20261201T100000Z/checkpoint_000002 (")

    time.sleep(0.01)
    bucket.blob(f"{runs}/r2-20261201T100000Z/summary.json").upload_from_string(json.dumps(
        {"completed": True, "global_step": 40, "final_eval_loss": 0.25}))
    head, _ = status.run_lines(storage, dep)
    assert head.startswith("Newest run: r2-20261201T100000Z, finished at step 40, final eval loss 0.2500")


def test_status_through_the_cli_reads_the_bucket(fake_gcs_factory, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url = fake_gcs_factory(REGION)
    storage = storage_client(url)
    storage.create_bucket("runs-bucket").blob("gemma3-ray/ml/gemma3-ray/runs/r1-x/checkpoint_000001/a").upload_from_string("w")
    rc = cli.main(["status", *BASE, "--bucket", "runs-bucket", "--kubeconfig", str(tmp_path / "none")],
                  Clients(project=PROJECT, storage=storage))
    out = capsys.readouterr().out
    assert rc == 0
    assert "Newest run: r1-x, in progress" in out and "checkpoint_000001" in out


def test_status_reads_where_the_live_job_writes() -> None:
    """A release installed with plain `helm install` uses the chart's own prefix (gemma3-ray/RELEASE);
    status follows the RayJob's --storage_path rather than the plugin's default."""
    job = {"spec": {"entrypoint": "python /home/ray/trainer/vision_train.py --num_workers=16 "
                                  "--storage_path=gs://bkt/gemma3-ray/t --run_name=r1-x"}}
    assert status.storage_of(job) == ("bkt", "gemma3-ray/t")
    quoted = {"spec": {"entrypoint": "python x.py '--storage_path=gs://bkt/team=a/x' --x=1"}}
    assert status.storage_of(quoted) == ("bkt", "team=a/x")
    assert status.storage_of({"spec": {"entrypoint": "python x.py"}}) is None


def test_status_on_a_real_api_server_follows_the_rayjob(kube_apiserver: Path, fake_gcs_factory,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    ns = "status-team"
    kubectl(kube_apiserver, "create", "namespace", ns)
    job = json.loads(_rayjob(ns, "gemma3-ray-abcde"))
    job["spec"]["entrypoint"] += " --storage_path=gs://plain-bucket/gemma3-ray/gemma3-ray"  # plain `helm install`
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=json.dumps(job))
    storage = storage_client(fake_gcs_factory(REGION))
    storage.create_bucket("plain-bucket").blob(
        "gemma3-ray/gemma3-ray/runs/r1-20261201T100000Z/checkpoint_000003/model.pt").upload_from_string("w")
    rc = cli.main(["status", "--project", PROJECT, "--region", REGION, "-n", ns, "--kubeconfig", str(kube_apiserver)],
                  Clients(project=PROJECT, storage=storage))
    out = capsys.readouterr().out
    assert rc == 0
    assert f"RayJob {ns}/gemma3-ray-abcde: deployment New, job PENDING" in out  # no operator: no status yet
    assert "Storage: gs://plain-bucket/gemma3-ray/gemma3-ray/ (the RayJob's --storage_path)" in out
    assert "Newest run: r1-20261201T100000Z, in progress" in out and "checkpoint_000003" in out


def test_following_a_rayjob_ends_with_its_final_state_on_a_real_api_server(kube_apiserver: Path) -> None:
    """`up`'s last step (kube.cluster.follow, through the one connection of config.clients.Kube) on the real
    API server: the state KubeRay writes (set here through the status subresource: no operator runs) ends
    the wait, and each state it saw is said once."""
    from gemma3_ray.config.clients import Kube
    from gemma3_ray.kube import cluster

    ns = "follow-team"
    kubectl(kube_apiserver, "create", "namespace", ns)
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=_rayjob(ns, "gemma3-ray-r1"))
    kubectl(kube_apiserver, "-n", ns, "patch", "rayjob", "gemma3-ray-r1", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"jobStatus": "FAILED", "jobDeploymentStatus": "Failed", "message": "the driver exited 1"}}))
    lines: list[str] = []
    state = cluster.follow(Kube(kubeconfig=str(kube_apiserver)).get_custom(), ns, "gemma3-ray", lines.append)
    assert (state.name, state.job_status, state.deployment_status) == ("gemma3-ray-r1", "FAILED", "Failed")
    assert len(lines) == 1 and re.fullmatch(r"RayJob gemma3-ray-r1: Failed / FAILED the driver exited 1 \[\d+ s\]", lines[0])


def test_status_says_what_to_wait_for_while_a_replaced_rayjob_is_deleted(
        kube_apiserver: Path, fake_gcs_factory, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #31 (7): right after an upgrade the previous revision's RayJob is being deleted (KubeRay's finalizer:
    it stops the Ray job first) and Helm refuses to roll back to it; status names it and the wait, as NOTES and the
    chart README do."""
    ns = "status-rollback"
    kubectl(kube_apiserver, "create", "namespace", ns)
    old = json.loads(_rayjob(ns, "gemma3-ray-r1"))
    old["metadata"]["finalizers"] = ["ray.io/rayjob-finalizer"]  # held, as KubeRay holds it while it stops the job
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=json.dumps(old))
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=_rayjob(ns, "gemma3-ray-r2"))
    kubectl(kube_apiserver, "-n", ns, "delete", "rayjob", "gemma3-ray-r1", "--wait=false")
    try:
        rc = cli.main(["status", "--project", PROJECT, "--region", REGION, "-n", ns, "--kubeconfig",
                       str(kube_apiserver)], Clients(project=PROJECT, storage=storage_client(fake_gcs_factory(REGION))))
        out = capsys.readouterr().out
        assert rc == 0
        assert (f"RayJob {ns}/gemma3-ray-r1 is being deleted (KubeRay stops its Ray job first): to roll back to its "
                f"revision, wait until it is gone: kubectl -n {ns} wait rayjob/gemma3-ray-r1 "
                "--for=delete --timeout=300s") in out
        assert "gemma3-ray-r2 is being deleted" not in out
    finally:
        kubectl(kube_apiserver, "-n", ns, "patch", "rayjob", "gemma3-ray-r1", "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}')


def _pod(ns: str, name: str, kind: str, cluster: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "namespace": ns, "labels": {"ray.io/cluster": cluster, "ray.io/node-type": kind}},
        "spec": {"containers": [{"name": "ray", "image": "r/w:1"}]}})


def _unschedulable(kube: Path, ns: str, name: str, message: str) -> None:
    kubectl(kube, "-n", ns, "patch", "pod", name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": {
        "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": message}]}}))


def test_status_says_in_one_sentence_which_pods_the_scheduler_cannot_place_and_what_to_change(
        kube_apiserver: Path, fake_gcs_factory, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue #43: a values file one node short of its pool (the fleet group's `cannot fit` case): status quotes the
    scheduler's own PodScheduled=False/Unschedulable message per node type, with the fix; a Pending pod the scheduler
    has not refused (pulling its image, not yet looked at) is not named. The conditions are set through the status
    subresource: no scheduler runs on this API server."""
    ns, cluster = "status-unplaceable", "gemma3-ray-r1-raycluster-x"
    kubectl(kube_apiserver, "create", "namespace", ns)
    kubectl(kube_apiserver, "-n", ns, "create", "serviceaccount", "default")  # no controller-manager here
    kubectl(kube_apiserver, "apply", "-f", "-", stdin=_rayjob(ns, "gemma3-ray-r1"))
    kubectl(kube_apiserver, "-n", ns, "patch", "rayjob", "gemma3-ray-r1", "--subresource=status", "--type=merge", "-p",
            json.dumps({"status": {"rayClusterName": cluster, "jobDeploymentStatus": "Initializing"}}))
    for name, kind in (("head-0", "head"), ("w-0", "worker"), ("w-1", "worker"), ("w-2", "worker")):
        kubectl(kube_apiserver, "apply", "-f", "-", stdin=_pod(ns, name, kind, cluster))
    gpu = "0/5 nodes are available: 1 Insufficient nvidia.com/gpu, 4 node(s) had untolerated taint {x: y}."
    _unschedulable(kube_apiserver, ns, "w-1", gpu)
    _unschedulable(kube_apiserver, ns, "w-2", gpu)
    rc = cli.main(["status", "--project", PROJECT, "--region", REGION, "-n", ns, "--kubeconfig", str(kube_apiserver)],
                  Clients(project=PROJECT, storage=storage_client(fake_gcs_factory(REGION))))
    out = capsys.readouterr().out
    assert rc == 0
    said = [line for line in out.splitlines() if "cannot be placed" in line]
    assert said == [f"2 of 3 worker pods of {cluster} cannot be placed: the scheduler says \"{gpu}\": too few free "
                    "GPUs in the pool: add nodes to it (or free them) or lower workers.replicas"], out
    # the head refused for its selector: its own sentence, with its own fix
    _unschedulable(kube_apiserver, ns, "head-0", "0/5 nodes are available: 5 node(s) didn't match Pod's node "
                                                 "affinity/selector.")
    cli.main(["status", "--project", PROJECT, "--region", REGION, "-n", ns, "--kubeconfig", str(kube_apiserver)],
             Clients(project=PROJECT, storage=storage_client(fake_gcs_factory(REGION))))
    out = capsys.readouterr().out
    assert f"1 of 1 head pod of {cluster} cannot be placed" in out and "no node has the labels" in out
