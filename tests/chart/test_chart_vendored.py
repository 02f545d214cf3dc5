"""The trainer ConfigMap is the same whether the chart is packaged or vendored as a plain directory (#27 item 8).

`helm package` applies the chart's .helmignore; a chart copied into another chart's charts/ folder is
loaded file by file, and Helm does not apply the subchart's .helmignore there. So the ConfigMap takes an
explicit list of the trainer's files (its modules and requirements.txt), never "everything in
files/trainer": the trainer README, editor backups and notes left in the folder never reach it, and its
name (a hash of its files) is the same either way. Real helm, both versions.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CHART, CI_VALUES_DIR, helm_bin, load_docs
from trainer_package import configmap_key, trainer_files

CI_DEFAULT = CI_VALUES_DIR / "default-values.yaml"
# What a working copy of the trainer folder may hold besides the code: none of it may reach the pods.
STRAYS = {"NOTES.md": "my notes\n", "flags.py.orig": "# merge leftover\n", ".flags.py.swp": "swap\n",
          "run.log": "log\n", "scratch.txt": "x\n"}


def _trainer_configmap(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"
             and d["metadata"]["labels"].get("app.kubernetes.io/component") == "trainer-code"]
    return cm


def _template(helm: str, chart: Path, *args: str) -> list[dict[str, Any]]:
    p = subprocess.run([helm_bin(helm), "template", "demo", str(chart), *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return load_docs(p.stdout)


@pytest.mark.parametrize("helm", ["HELM", "HELM3"])
def test_vendored_and_packaged_charts_ship_the_same_trainer_configmap(tmp_path: Path, helm: str) -> None:
    packaged = subprocess.run([helm_bin(helm), "package", str(CHART), "-d", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
    assert packaged.returncode == 0, packaged.stderr
    (tgz,) = tmp_path.glob("gemma3-ray-*.tgz")
    from_package = _trainer_configmap(_template(helm, tgz, "-f", str(CI_DEFAULT)))

    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "platform", "version": "0.1.0"}))
    vendored = parent / "charts" / "gemma3-ray"
    shutil.copytree(CHART, vendored, symlinks=False)  # a plain copy: what `cp -rL` or a git subtree gives
    for folder in (vendored / "files" / "trainer", vendored / "files" / "trainer" / "job"):  # the package and a folder
        (folder / "__pycache__").mkdir(exist_ok=True)
        (folder / "__pycache__" / "flags.cpython-311.pyc").write_bytes(b"\0pyc")
        (folder / "__pycache__" / "stray.py").write_text("# a .py in a hidden-from-git cache\n")
        for name, text in STRAYS.items():
            (folder / name).write_text(text)
    values = tmp_path / "parent-values.yaml"
    values.write_text(yaml.safe_dump({"gemma3-ray": yaml.safe_load(CI_DEFAULT.read_text())}))
    from_vendored = _trainer_configmap(_template(helm, parent, "-f", str(values)))

    assert sorted(from_vendored["data"]) == sorted(from_package["data"])
    assert from_vendored["data"] == from_package["data"]
    assert from_vendored["metadata"]["name"] == from_package["metadata"]["name"], "the code hash differs"
    # Exactly the trainer's code: every module and requirements.txt, nothing else.
    trainer = CHART / "files" / "trainer"
    code = {configmap_key(p) for p in trainer_files(trainer)}
    assert set(from_package["data"]) == code
    assert "README.md" not in from_vendored["data"] and not set(STRAYS) & set(from_vendored["data"])
