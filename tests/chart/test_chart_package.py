"""The chart is self-contained: the trainer's code lives in it (trainer/ is a symlink to
files/trainer, one copy), and a packaged archive renders from a directory with no trainer/ beside it.
The package's folders travel in one ConfigMap with flat keys, put back in place by the volume's items."""

from __future__ import annotations

import shlex
import subprocess
import tarfile
from pathlib import Path

import yaml
from helm_render import CHART, CI_VALUES_DIR, ROOT, VALUES_DIR, helm_bin, helm_template, same_but_run_name
from trainer_package import configmap_key, trainer_files

TRAINER = ROOT / "trainer"
CHART_TRAINER = CHART / "files" / "trainer"
HELM_TIMEOUT_S = 120


def test_trainer_is_the_charts_trainer() -> None:
    """One copy of the trainer's code: editing trainer/ edits what the chart ships."""
    assert TRAINER.is_symlink() and TRAINER.resolve() == CHART_TRAINER.resolve(), (
        "trainer/ must be a symlink to charts/gemma3-ray/files/trainer (the chart ships those bytes)")
    files = trainer_files(CHART_TRAINER)
    assert {"requirements.txt", "vision_train.py", "__init__.py", "job/flags.py", "worker/worker.py"} <= set(files)


def test_the_volume_items_put_every_file_back_in_its_folder() -> None:
    """The ConfigMap holds every file once under its flat key; the submitter's volume maps each key to
    trainer/<its path>, so the job's working_dir holds the package as the repository does."""
    for helm in ("HELM", "HELM3"):
        r = helm_template([CI_VALUES_DIR / "default-values.yaml"], helm=helm)
        assert r.returncode == 0, r.stderr
        files = trainer_files(TRAINER)
        assert r.one("ConfigMap")["data"] == {configmap_key(p): b.decode() for p, b in files.items()}
        pod = r.one("RayJob")["spec"]["submitterPodTemplate"]["spec"]
        (volume,) = [v["configMap"] for v in pod["volumes"] if v["name"] == "trainer"]
        assert volume["items"] == [{"key": configmap_key(p), "path": f"trainer/{p}"}
                                   for p in sorted(files, key=configmap_key)]
        assert shlex.split(r.one("RayJob")["spec"]["entrypoint"])[:3] == ["python", "-m", "trainer.vision_train"]


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
        shipped = sorted(n.removeprefix("gemma3-ray/files/trainer/") for n in names
                         if "/files/trainer/" in n and (unpacked / n).is_file())
        assert shipped == sorted(trainer_files(CHART_TRAINER)), "only the code and its pins: no docs, no caches"
        assert "gemma3-ray/values.schema.json" in names
        assert not any("/ci/" in n and n.endswith(".tgz") for n in names)
        vendored = unpacked / "gemma3-ray"
        for values in (VALUES_DIR / "tutorial.yaml", CI_VALUES_DIR / "default-values.yaml"):
            from_archive = helm_template([values], chart=vendored, helm=helm)
            assert from_archive.returncode == 0, from_archive.stderr
            assert same_but_run_name(from_archive.docs) == same_but_run_name(helm_template([values], helm=helm).docs)
            cm = from_archive.one("ConfigMap")
            assert cm["data"] == {configmap_key(k): v.decode() for k, v in trainer_files(TRAINER).items()}
