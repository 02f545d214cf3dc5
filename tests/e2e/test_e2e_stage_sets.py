"""The values a stage sets over values/e2e.yaml pass the chart's schema as the harness hands them to Helm.

Seen through KUBECONFIG (28 stages green before it): the stage 'streaming' set training.streaming to the text
"true", which `helm install` refused on the schema ('/training/streaming': got string, want boolean) after 62 s
of sharding. These render each stage's sets with the real helm and the harness's own flags, in a second."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from e2e.stages.streaming import chart_sets
from e2e.support.harness import set_args

ROOT = Path(__file__).resolve().parents[2]


def _helm() -> str:
    helm = os.environ.get("HELM") or shutil.which("helm") or str(ROOT / ".tools" / "bin" / "helm")
    if not Path(helm).exists() and not shutil.which(helm):
        pytest.fail("helm not found: run the tests through make test (it puts .tools/bin on PATH)")
    return helm


def _template(sets: dict) -> subprocess.CompletedProcess[str]:
    argv = [_helm(), "template", "e2e-stream", str(ROOT / "charts" / "gemma3-ray"), "-n", "ns",
            "-f", str(ROOT / "values" / "e2e.yaml"), *set_args(sets)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_set_args_types_values_as_helm_reads_them() -> None:
    assert set_args({"a": True, "b": False, "c": 2, "d": 0.25, "e": "0.10", "f": "true"}) == [
        "--set", "a=true", "--set", "b=false", "--set", "c=2", "--set", "d=0.25",
        "--set-string", "e=0.10", "--set-string", "f=true"]


def test_the_streaming_stages_values_pass_the_schema_and_reach_the_trainer() -> None:
    out = _template(chart_sets("gs://gemma3-ray-e2e/inputs/streamed-products"))
    assert out.returncode == 0, out.stderr
    text = "\n".join(yaml.safe_dump(d) for d in yaml.safe_load_all(out.stdout) if d)
    assert "--streaming=true" in text or "streaming: true" in text or '"streaming": true' in text, text[:2000]


def test_the_check_fails_on_the_defect_it_was_written_for() -> None:
    """The same render with the text "true" is refused: this test can fail."""
    sets = {**chart_sets("gs://b/d"), "training.streaming": "true"}
    out = _template(sets)
    assert out.returncode != 0 and "/training/streaming" in out.stderr, out.stderr


def test_the_streaming_stage_fails_an_epoch_cut_short_or_with_rows_left_out() -> None:
    """#44: the stage's claim is every row once: a summary whose epoch was cut short by max_steps, or that left rows
    out (the equal split's drop) fails it, however many rows it trained."""
    from e2e.stages.streaming import ROWS, epoch_problem

    steps = 32
    epoch = {"epoch": 0, "rows_trained": ROWS, "rows_trained_twice": 0, "rows_left_out": 0, "rows_left_out_ids": []}

    def summary(**over):
        return {"global_step": steps, "streaming": {"epochs": [{**epoch, **over}]}}

    assert epoch_problem(summary(), steps) is None
    cut = {k: v for k, v in epoch.items() if not k.startswith("rows_left_out")}
    assert "not one whole epoch" in epoch_problem(
        {"global_step": steps, "streaming": {"epochs": [{**cut, "cut_short_by_max_steps": True}]}}, steps)
    assert "3 left out" in epoch_problem(summary(rows_left_out=3, rows_left_out_ids=[1, 2, 3]), steps)
    assert "1 twice" in epoch_problem(summary(rows_trained_twice=1), steps)
    assert "not one whole epoch" in epoch_problem({"global_step": steps}, steps)
