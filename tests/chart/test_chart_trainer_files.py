"""The trainer ships whole, at any depth of its folders (#41 item 5).

The reference is a walk of the package (tests/chart/trainer_package.py), not the template's patterns:
the rendered ConfigMap, put back by the submitter's volume items, must hold exactly those bytes at
trainer/<path>. A module planted three folders deep must ship too, and a folder name holding a dot
(its key would map back to the wrong folder) is refused in one sentence. Real helm, both versions.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helm_render import CHART, CI_VALUES_DIR, ROOT, VALUES_DIR, helm_template
from trainer_package import configmap_key, shipped, trainer_files

CHART_TRAINER = CHART / "files" / "trainer"
# The trainer's documentation: .helmignore keeps it out of the package and the ConfigMap leaves it out.
DOCS = ("README.md", "docs/")


def expected(folder: Path) -> dict[str, bytes]:
    return {f"trainer/{path}": data for path, data in trainer_files(folder).items()}


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
@pytest.mark.parametrize("values", [VALUES_DIR / "tutorial.yaml", CI_VALUES_DIR / "default-values.yaml"])
def test_the_configmap_ships_the_trainer_package_byte_for_byte(values: Path, helm: str) -> None:
    r = helm_template([values], helm=helm)
    assert r.returncode == 0, r.stderr
    files = expected(CHART_TRAINER)
    assert any(p.count("/") >= 2 for p in files), "the package has folders: the walk must find their modules"
    assert shipped(r.one("ConfigMap"), r.one("RayJob")) == files


def test_every_tracked_trainer_file_ships_or_is_documentation() -> None:
    """Nothing git tracks in the trainer folder is left behind but its README and docs/."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", str(CHART_TRAINER.relative_to(ROOT))],
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    tracked = {Path(p).relative_to(CHART_TRAINER.relative_to(ROOT)).as_posix() for p in out}
    assert "job/flags.py" in tracked
    left = {p for p in tracked - set(trainer_files(CHART_TRAINER)) if not p.startswith(DOCS)}
    assert not left, f"tracked in files/trainer but not shipped to the job: {sorted(left)}"


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_a_module_at_any_depth_ships(tmp_path: Path, helm: str) -> None:
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart)
    deep = chart / "files" / "trainer" / "a" / "b"
    deep.mkdir(parents=True)
    (deep.parent / "__init__.py").write_text('"""A folder of the package."""\n')
    (deep / "__init__.py").write_text('"""A folder in a folder."""\n')
    (deep / "c.py").write_text("DEPTH = 3\n")
    r = helm_template([CI_VALUES_DIR / "default-values.yaml"], chart=chart, helm=helm)
    assert r.returncode == 0, r.stderr
    files = shipped(r.one("ConfigMap"), r.one("RayJob"))
    assert files["trainer/a/b/c.py"] == b"DEPTH = 3\n"
    assert r.one("ConfigMap")["data"][configmap_key("a/b/c.py")] == "DEPTH = 3\n"
    assert files == expected(chart / "files" / "trainer")


@pytest.mark.parametrize("rel", ["a.b/c.py", "job/odd.name.py"])
def test_a_path_with_a_second_dot_is_refused_in_one_sentence(tmp_path: Path, rel: str) -> None:
    """Its key would map back to the wrong folder (a.b/c.py -> a.b.c.py -> a/b/c.py): the chart says so instead."""
    chart = tmp_path / "gemma3-ray"
    shutil.copytree(CHART, chart)
    planted = chart / "files" / "trainer" / rel
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text("# a module path cannot hold a dot\n")
    r = helm_template([CI_VALUES_DIR / "default-values.yaml"], chart=chart)
    assert r.returncode != 0
    assert f"files/trainer/{rel}: a trainer file's path holds one dot, before its extension" in r.stderr, r.stderr
