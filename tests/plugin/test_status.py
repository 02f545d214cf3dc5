"""`status`: every part it cannot read is "unknown" with the reason, never an exit 1 half-way
(issue #12 (8)); the newest run under <storage_path>/runs/ (the run-identity contract), on
fake-gcs-server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gemma3_ray import cli, status
from gemma3_ray.deployment import Overrides, resolve
from gemma3_ray.gcp_clients import Clients

from tests.plugin.conftest import PROJECT, REGION, storage_client
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
