"""`doctor` with several values files checks what Helm would install from them (#27 item 8): they are merged as
`helm -f a -f b` merges them (maps key by key, the later file winning), never "the last one only"; the chart
renders the same objects from the merged values as from the files given to helm one by one."""

from __future__ import annotations

from pathlib import Path

import pytest
from gemma3_ray import cli
from gemma3_ray.config import render
from gemma3_ray.config.clients import Clients
from gemma3_ray.kube import helm_release

from tests.plugin.conftest import PROJECT, REGION

BASE = ["--project", PROJECT, "--region", REGION, "--no-kube-context", "-n", "ml"]


def _files(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("mode: ephemeral\nstorage:\n  bucket: team-bucket\nkueue:\n  queueName: team-a\nworkers:\n  replicas: 2\ncommonLabels:\n  team: a\n  tier: gold\nrayJob:\n  runId: fixed-1\n")
    b.write_text("kueue:\n  priorityClass: batch-high\ncommonLabels:\n  team: b\ntraining:\n  max_steps: 7\n")
    return a, b


@pytest.mark.parametrize("flag", ["--values", "-f"])
def test_doctor_checks_both_files_not_the_last_one(flag: str, tmp_path: Path, gcloud_home,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-credentials.json"))
    a, b = _files(tmp_path)
    cli.main(["doctor", *BASE, flag, str(a), flag, str(b)], Clients(project=PROJECT))
    out = capsys.readouterr().out
    # The first file names the queue: doctor's Kueue group is there (without a cluster it cannot pass).
    assert any(line.startswith("[FAIL] Kueue: no cluster connection") for line in out.splitlines()), out


def test_the_merge_is_helms(tmp_path: Path) -> None:
    a, b = _files(tmp_path)
    merged = render.load_values([a, b])
    assert merged["kueue"] == {"queueName": "team-a", "priorityClass": "batch-high"}
    assert merged["commonLabels"] == {"team": "b", "tier": "gold"} and merged["workers"] == {"replicas": 2}
    helm = helm_release.client(None, None)
    one_by_one = helm_release.template(helm, "r", helm_release.chart_path(None),
                                       [render.load_plain(a), render.load_plain(b)], "ml")
    as_one = helm_release.template(helm, "r", helm_release.chart_path(None), [merged], "ml")
    assert as_one == one_by_one
