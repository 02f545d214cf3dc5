"""The chart is self-contained: the trainer's code lives in it (trainer/ is a symlink to
files/trainer, one copy), and a packaged archive renders from a directory with no trainer/ beside it."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

import yaml
from helm_render import CHART, CI_VALUES_DIR, ROOT, VALUES_DIR, helm_bin, helm_template, same_but_run_name

TRAINER = ROOT / "trainer"
CHART_TRAINER = CHART / "files" / "trainer"
HELM_TIMEOUT_S = 120


def trainer_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.suffix == ".py" or p.name == "requirements.txt"}


def test_trainer_is_the_charts_trainer() -> None:
    """One copy of the trainer's code: editing trainer/ edits what the chart ships."""
    assert TRAINER.is_symlink() and TRAINER.resolve() == CHART_TRAINER.resolve(), (
        "trainer/ must be a symlink to charts/gemma3-ray/files/trainer (the chart ships those bytes)")
    assert "requirements.txt" in trainer_files(CHART_TRAINER) and "vision_train.py" in trainer_files(CHART_TRAINER)


def test_packaged_chart_renders_from_elsewhere(tmp_path: Path) -> None:
    for helm in ("HELM", "HELM3"):
        dest = tmp_path / helm
        dest.mkdir()
        proc = subprocess.run([helm_bin(helm), "package", str(CHART), "-d", str(dest)],
                              capture_output=True, text=True, timeout=HELM_TIMEOUT_S, check=False)
        assert proc.returncode == 0, proc.stderr
        (archive,) = dest.glob("gemma3-ray-*.tgz")
        chart_meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
        assert archive.name == f"gemma3-ray-{chart_meta['version']}.tgz"
        unpacked = tmp_path / f"vendored-{helm}"
        with tarfile.open(archive) as tar:
            names = tar.getnames()
            tar.extractall(unpacked, filter="data")
        assert "gemma3-ray/files/trainer/requirements.txt" in names
        shipped = sorted(n.removeprefix("gemma3-ray/files/trainer/") for n in names if "/files/trainer/" in n)
        assert shipped == sorted(trainer_files(CHART_TRAINER)), "only the code and its pins: no docs, no caches"
        assert "gemma3-ray/values.schema.json" in names
        assert not any("/ci/" in n and n.endswith(".tgz") for n in names)
        vendored = unpacked / "gemma3-ray"
        for values in (VALUES_DIR / "tutorial.yaml", CI_VALUES_DIR / "default-values.yaml"):
            from_archive = helm_template([values], chart=vendored, helm=helm)
            assert from_archive.returncode == 0, from_archive.stderr
            assert same_but_run_name(from_archive.docs) == same_but_run_name(helm_template([values], helm=helm).docs)
            cm = from_archive.one("ConfigMap")
            assert cm["data"] == {k: v.decode() for k, v in trainer_files(TRAINER).items()}
