"""`gemma3-ray report`: the newest run's report.html from the bucket (fake-gcs-server), downloaded and opened."""

from __future__ import annotations

import stat
import time
import webbrowser
from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config.clients import Clients
from gemma3_ray.gcp import run_reports

from tests.plugin.conftest import PROJECT, REGION, storage_client

BUCKET = "reports-bucket"
RELEASE = "tune1"
PREFIX = f"gemma3-ray/ml/{RELEASE}"  # the plugin's default prefix for the release in namespace ml
BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml", "--bucket", BUCKET]


@pytest.fixture
def bucket(fake_gcs_factory):
    storage = storage_client(fake_gcs_factory(REGION))
    b = storage.create_bucket(BUCKET)
    return storage, b


def _write_runs(b) -> None:
    b.blob(f"{PREFIX}/runs/r1-20261201-090000/summary.json").upload_from_string("{}")
    for run in ("r1-20261201-090000", "r2-20261201-100000"):
        b.blob(f"{PREFIX}/runs/{run}/report.html").upload_from_string(f"<html>{run}</html>")
        time.sleep(0.01)  # distinct write times (the server stamps them)
    b.blob(f"{PREFIX}/runs/r2-20261201-100000/checkpoints/report.html").upload_from_string("not a run report")
    b.blob("gemma3-ray/other/runs/r9/report.html").upload_from_string("another release's")


def test_status_line_names_the_newest_report(bucket) -> None:
    storage, b = bucket
    assert run_reports.status_line(storage, BUCKET, PREFIX) == (
        f"Run report: none yet under gs://{BUCKET}/{PREFIX}/runs/")
    _write_runs(b)
    line = run_reports.status_line(storage, BUCKET, PREFIX)
    assert line.startswith(f"Run report: gs://{BUCKET}/{PREFIX}/runs/r2-20261201-100000/report.html (run r2-")


def test_report_downloads_the_newest_and_says_where_without_a_display(
    bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    storage, b = bucket
    _write_runs(b)
    for var in run_reports.DISPLAY_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", RELEASE, *BASE], Clients(project=PROJECT, storage=storage)) == 0
    dest = tmp_path / f"{RELEASE}-r2-20261201-100000-report.html"
    assert dest.read_text() == "<html>r2-20261201-100000</html>"
    out = capsys.readouterr().out
    assert f"{dest} in a browser" in out and "opened" not in out

    named = tmp_path / "old.html"
    assert cli.main(["report", RELEASE, *BASE, "--run", "r1-20261201-090000", "-o", str(named)],
                    Clients(project=PROJECT, storage=storage)) == 0
    assert named.read_text() == "<html>r1-20261201-090000</html>"


def test_report_opens_the_browser_where_there_is_a_display(
    bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    storage, b = bucket
    _write_runs(b)
    opened = tmp_path / "opened.txt"
    fake_browser = tmp_path / "browser.sh"  # a real program on $BROWSER, as webbrowser documents
    fake_browser.write_text(f'#!/bin/sh\necho "$1" > {opened}\n')
    fake_browser.chmod(fake_browser.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("DISPLAY", ":0")
    monkeypatch.setenv("BROWSER", str(fake_browser))
    monkeypatch.setattr(webbrowser, "_tryorder", None)  # re-read $BROWSER
    monkeypatch.setattr(webbrowser, "_browsers", {})
    dest = tmp_path / "r.html"
    assert cli.main(["report", RELEASE, *BASE, "-o", str(dest)], Clients(project=PROJECT, storage=storage)) == 0
    for _ in range(100):
        if opened.exists() and opened.read_text().strip():
            break
        time.sleep(0.05)
    assert opened.read_text().strip() == dest.resolve().as_uri()
    assert "opened in your browser" in capsys.readouterr().out


def test_report_of_an_unknown_run_lists_the_runs(bucket, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage, b = bucket
    _write_runs(b)
    rc = cli.main(["report", RELEASE, *BASE, "--run", "r7", "-o", str(tmp_path / "x.html")],
                  Clients(project=PROJECT, storage=storage))
    err = capsys.readouterr().err
    assert rc != 0 and "--run r7" in err and "r2-20261201-100000, r1-20261201-090000" in err
    assert not (tmp_path / "x.html").exists()


def test_report_before_any_run_says_so(bucket, capsys: pytest.CaptureFixture[str]) -> None:
    storage, _ = bucket
    assert cli.main(["report", RELEASE, *BASE, "--no-open"], Clients(project=PROJECT, storage=storage)) == 1
    assert f"No run report yet under gs://{BUCKET}/{PREFIX}/runs/" in capsys.readouterr().out
