"""`make demo`'s bad input is one sentence before any work, and the demo's own process stays quiet (#27 item 4).

A missing values file, a `--set` Helm's schema refuses, a `--set` the trainer's own flag checks refuse:
each is one sentence naming what to fix, printed before the tiny model and the sample data are built
and before a run folder is made (the builders below record whether they were called: they stand for the
~50 s of real building the user would otherwise wait through). The demo's process itself prints no Ray
INFO line and no progress bar (the tiny model's save used to show `Writing model shards`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from demo import __main__ as demo_main
from localkit import sample_data, tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Which builder ran (none may, when the input is bad)."""
    calls: list[str] = []
    monkeypatch.setattr(tiny_model, "build_tiny_gemma3", lambda *a, **k: calls.append("model") or Path("/m"))
    monkeypatch.setattr(sample_data, "build_sample_dataset", lambda *a, **k: calls.append("data") or Path("/d"))
    for name in demo_main.USER_CLUSTER_ENV:
        monkeypatch.delenv(name, raising=False)
    return calls


def _fail(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    rc = demo_main.main([f"--output-dir={tmp_path / 'out'}", "--min-free-gib=0", *argv])
    err = capsys.readouterr().err
    assert rc == 1, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("[demo] FAILED: "), err  # one sentence, one line
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("run-*")), "a run folder was made"
    return lines[0]


def test_a_missing_values_file_is_one_sentence_before_any_work(tmp_path: Path, built: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    line = _fail(tmp_path, capsys, f"--values={tmp_path / 'nope.yaml'}")
    assert str(tmp_path / "nope.yaml") in line and "--values" in line
    assert built == []


@pytest.mark.parametrize(("sets", "named"), [
    (["training.learning_rate=-1"], "training.learning_rate"),        # the schema's range
    (["training.max_steps=-5"], "training.max_steps"),
    (["training.learning_rat=0.1"], "learning_rat"),                   # no such flag
    (["workers.replicas=zero"], "workers.replicas"),                   # a wrong type
])
def test_a_set_helm_refuses_is_one_sentence_before_any_work(tmp_path: Path, built: list[str],
                                                            capsys: pytest.CaptureFixture[str],
                                                            sets: list[str], named: str) -> None:
    line = _fail(tmp_path, capsys, *(f"--set={s}" for s in sets))
    assert named in line
    assert built == []


def test_a_set_the_trainer_refuses_is_one_sentence_before_any_work(tmp_path: Path, built: list[str],
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """freeze_vision=true needs lora_target=language-model: only the trainer's own checks know (no schema
    rule spans two flags); the demo runs them on the rendered entry point before building anything."""
    line = _fail(tmp_path, capsys, "--set=training.freeze_vision=true")
    assert "freeze_vision" in line and "lora_target=language-model" in line
    assert built == []


def test_the_demo_process_prints_no_ray_info_and_no_progress_bar(tmp_path: Path) -> None:
    """The demo's own process, configured as main() configures it: the tiny model saved for real (the
    `Writing model shards` bar), and Ray's client loggers (the `Uploading package` INFO line of a job
    submission) with Ray's own handler; a Ray warning still shows."""
    code = (
        "import logging, sys\n"
        "from pathlib import Path\n"
        "from demo.__main__ import _quiet\n"
        "_quiet()\n"
        "from ray.job_submission import JobSubmissionClient  # noqa: F401 - the loggers the demo process uses\n"
        "from ray.dashboard.modules import dashboard_sdk\n"
        "dashboard_sdk.logger.info('Uploading package gcs://_ray_pkg_x.zip.')\n"
        "logging.getLogger('ray.dashboard.modules.job.sdk').warning('a Ray warning')\n"
        "from localkit.tiny_model import build_tiny_gemma3\n"
        "print(build_tiny_gemma3(Path(sys.argv[1])))\n"
    )
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tiny")], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "tiny" / "config.json").is_file()
    out = p.stdout + p.stderr
    assert "Writing model shards" not in out and "it/s]" not in out
    assert "Uploading package" not in out and "\tINFO " not in out
    assert "a Ray warning" in p.stderr
