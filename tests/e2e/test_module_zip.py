"""e2e/build/module_zip.py: the module zip e2e/build/parts.sh serves from a file:// proxy for a version the proxy refuses whole
(ray-operator v1.7.0). The go command checks the zip against the checksum database; these tests hold the file
set the go command's zip rules give, so a wrong set fails here with a name, not there with a hash."""

import json
import os
import zipfile
from pathlib import Path

import pytest

from e2e.build.module_zip import escape, module_files, write

MOD = "github.com/Example/op"


def _module(root: Path) -> Path:
    src = root / "op"
    for rel, text in {"go.mod": f"module {MOD}\n\ngo 1.26\n", "main.go": "package main\n", "LICENSE": "L\n",
                      "pkg/a.go": "package pkg\n", "config/crd/x.yaml": "x: 1\n",
                      "nested/go.mod": "module other\n", "nested/b.go": "package b\n",  # another module
                      "vendor/v/v.go": "package v\n", "pkg/vendor/w.go": "package w\n",
                      ".git/config": "[core]\n", "pkg/.hg/x": "y\n"}.items():
        p = src / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    os.symlink(src / "main.go", src / "link.go")
    return src


def test_the_file_set_follows_the_go_commands_zip_rules(tmp_path: Path) -> None:
    files = {p.as_posix() for p in module_files(_module(tmp_path))}
    assert files == {"go.mod", "main.go", "LICENSE", "pkg/a.go", "config/crd/x.yaml"}, files


def test_the_proxy_layout_names_the_module_at_its_version(tmp_path: Path) -> None:
    z = write(_module(tmp_path), MOD, "v1.7.0", tmp_path / "proxy")
    d = tmp_path / "proxy" / "github.com" / "!example" / "op" / "@v"
    assert z == d / "v1.7.0.zip"
    names = set(zipfile.ZipFile(z).namelist())
    assert f"{MOD}@v1.7.0/go.mod" in names and all(n.startswith(f"{MOD}@v1.7.0/") for n in names)
    assert (d / "v1.7.0.mod").read_text().startswith(f"module {MOD}")
    assert json.loads((d / "v1.7.0.info").read_text()) == {"Version": "v1.7.0"}
    assert (d / "list").read_text() == "v1.7.0\n"


def test_another_modules_folder_is_refused_with_a_sentence(tmp_path: Path) -> None:
    src = _module(tmp_path)
    with pytest.raises(SystemExit) as e:
        write(src / "nested", MOD, "v1.7.0", tmp_path / "proxy")
    assert "declares module other, not github.com/Example/op" in str(e.value)
    with pytest.raises(SystemExit) as e:
        write(src / "pkg", MOD, "v1.7.0", tmp_path / "proxy")
    assert "has no go.mod" in str(e.value)


def test_case_encoding() -> None:
    assert escape("github.com/Azure/Go-AutoRest") == "github.com/!azure/!go-!auto!rest"
