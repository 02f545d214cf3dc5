"""The job's code as Ray packages it from the submitter pod's ConfigMap mount (issue #10, failure 3).

The kubelet writes a ConfigMap volume with its atomic writer (kubernetes pkg/volume/util/
atomic_writer.go, AtomicWriter.Write): the files in a fresh `..<UTC time>.<random>` directory, a
`..data` symlink to it, and per key a symlink `<key> -> ..data/<key>`. `ray job submit` in the
submitter pod packages the runtime env's working_dir with Ray's own packaging code (what
JobSubmissionClient._upload_working_dir_if_needed calls); the package must hold each key once, by its
own name, with its bytes.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_render import CI_VALUES_DIR, helm_template


def kubelet_configmap_volume(dest: Path, data: dict[str, str], stamp: str = "..2026_12_01_09_00_00.123456789") -> Path:
    dest.mkdir(parents=True)
    real = dest / stamp
    real.mkdir()
    for key, text in data.items():
        (real / key).write_text(text)
        os.chmod(real / key, 0o444)
    os.symlink(stamp, dest / "..data")
    for key in data:
        os.symlink(f"..data/{key}", dest / key)
    return dest


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    r = helm_template([CI_VALUES_DIR / "default-values.yaml"])
    assert r.returncode == 0, r.stderr
    return {"files": r.one("ConfigMap")["data"], "env": yaml.safe_load(r.one("RayJob")["spec"]["runtimeEnvYAML"])}


def package(directory: Path, excludes: list[str], out: Path) -> dict[str, bytes]:
    from ray._private.runtime_env.packaging import create_package

    create_package(str(directory), out, include_gitignore=True, excludes=excludes)
    with zipfile.ZipFile(out) as z:
        return {n: z.read(n) for n in z.namelist()}


def test_the_package_holds_each_trainer_file_once(job: dict[str, Any], tmp_path: Path) -> None:
    mount = kubelet_configmap_volume(tmp_path / "trainer", job["files"])
    files = package(mount, job["env"]["excludes"], tmp_path / "pkg.zip")
    assert sorted(files) == sorted(job["files"])
    for key, text in job["files"].items():
        assert files[key] == text.encode(), key


def test_without_the_excludes_the_kubelet_entries_would_be_packaged_too(job: dict[str, Any], tmp_path: Path) -> None:
    """The layout is the real one: Ray follows the ..data links and the timestamped directory."""
    mount = kubelet_configmap_volume(tmp_path / "trainer", job["files"])
    names = sorted(package(mount, [], tmp_path / "pkg.zip"))
    assert len(names) == 3 * len(job["files"]) and any(n.startswith("..data/") for n in names), names


def test_the_package_name_depends_on_the_files_not_on_the_kubelets_timestamp(job: dict[str, Any], tmp_path: Path) -> None:
    """Ray caches a working_dir by its content hash: the same files under another timestamped
    directory (another pod, another mount) give the same package; a changed file gives another."""
    from ray._private.runtime_env.packaging import get_uri_for_directory

    excludes = job["env"]["excludes"]
    a = kubelet_configmap_volume(tmp_path / "a", job["files"])
    b = kubelet_configmap_volume(tmp_path / "b", job["files"], stamp="..2026_12_02_10_11_12.987654321")
    changed = kubelet_configmap_volume(tmp_path / "c", {**job["files"], "requirements.txt": job["files"]["requirements.txt"] + "\n"})
    plain = tmp_path / "plain"
    plain.mkdir()
    for key, text in job["files"].items():
        (plain / key).write_text(text)
    uri = get_uri_for_directory(str(a), include_gitignore=True, excludes=excludes)
    assert uri == get_uri_for_directory(str(b), include_gitignore=True, excludes=excludes)
    assert uri == get_uri_for_directory(str(plain), include_gitignore=True)
    assert uri != get_uri_for_directory(str(changed), include_gitignore=True, excludes=excludes)
