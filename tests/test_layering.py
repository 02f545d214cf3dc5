"""The house's layering, from one table (``HOUSE``) and one import reader (tests/layering.py): every top-level
folder with Python in it is a row; the rows' order is layered (no two folders import each other, directly or
round about) and every import between folders follows it; nothing imports the tests; in every package each
folder imports only the folders its ``__init__`` names under "May import" (a folder's folders and modules at any
depth are its own; the package's top-level modules sit above every folder) and no module is in an import cycle.
Each rule is shown to fail on a planted bad import (the ``test_*_fails_on_*`` tests below).

A package's own rules beyond these stay with it: tests/trainer/test_layering.py (the light driver),
tests/plugin/test_layering.py (the CLI, the Kubernetes seam)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.layering import ROOT, Package, cycles, read_imports

ABOVE_ALL = "tests"  # the tests: above every folder, may import any; nothing imports them


@dataclass(frozen=True)
class Room:
    """A top-level folder of the house: the package it holds and the top-level folders it may import."""

    folder: Path
    package: Package
    may_import: frozenset[str]
    why: str


def room(folder: str, package: str, may_import: set[str], why: str, root: Path = ROOT) -> Room:
    """The row of ``root/folder``, whose package imports as ``package`` (the folder itself, or one inside it)."""
    source = root / folder if package == folder else root / folder / package
    return Room(root / folder, Package(source, package), frozenset(may_import), why)


# The one table: each top-level folder, the name its package imports as, and the folders it may import.
HOUSE: dict[str, Room] = {
    "trainer": room("trainer", "trainer", set(), "ships alone: the chart's ConfigMap carries it to the Ray cluster"),
    "plugin": room("plugin", "gemma3_ray", set(), "installed alone, as the Helm plugin or `pip install .`"),
    "localkit": room("localkit", "localkit", set(), "this machine's stand-ins for the cluster, below all that uses them"),
    "images": room("images", "images", set(), "build-time checks run inside the image, standard library only"),
    "scripts": room("scripts", "scripts", {"trainer", "plugin"},
                    "the chart's values schema from the trainer's flags; its content digest by the plugin's rule"),
    "bench": room("bench", "bench", {"trainer", "localkit"}, "the trainer's own path, on the local kit's model"),
    "demo": room("demo", "demo", {"localkit", "plugin"}, "the chart's job on the local kit; `data shard` as the plugin"),
    "e2e": room("e2e", "e2e", {"localkit", "plugin"}, "the chart on a real cluster, with the kit's model and data"),
}
# Top-level folders with Python that are no row, and why.
NOT_ROOMS = {
    ABOVE_ALL: "the tests: above every folder",
    "charts": "charts/gemma3-ray/files/trainer is the trainer's one copy, read as trainer/ (a link to it)",
}


def ignored(root: Path, name: str) -> bool:
    """A folder git ignores (run outputs such as e2e-output/, caches): not part of the house."""
    import subprocess

    return subprocess.run(["git", "-C", str(root), "check-ignore", "-q", name], capture_output=True).returncode == 0


def house_folders(root: Path) -> set[str]:
    """The top-level folders of ``root`` that hold Python (hidden ones, virtualenvs and what git ignores left out)."""
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")
            and not (p / "pyvenv.cfg").exists() and next(p.rglob("*.py"), None) is not None
            and not ignored(root, p.name)}


def unplaced_folders(house: dict[str, Room], root: Path = ROOT) -> list[str]:
    return sorted(house_folders(root) - set(house) - set(NOT_ROOMS))


def table_problems(house: dict[str, Room]) -> list[str]:
    """The table itself: each row may import only rows, and the rows form layers (no circle)."""
    out = [f"{name}/ may import {sorted(r.may_import - set(house))}, which are no rows"
           for name, r in sorted(house.items()) if r.may_import - set(house)]
    return out + [f"the rows {c} may import each other" for c in cycles({n: set(r.may_import) for n, r in house.items()})]


def order_violations(house: dict[str, Room]) -> list[str]:
    """Every import from one top-level folder into another that its row does not allow, and every import of the
    tests outside them."""
    by_package = {r.package.name: name for name, r in house.items()}
    out = []
    for name, r in sorted(house.items()):
        pkg = r.package
        for local, path in pkg.files().items():
            module = f"{pkg.name}.{local}" if local else pkg.name
            for imp in read_imports(path.read_text(encoding="utf-8"), module, path.name == "__init__.py"):
                top = imp.name.split(".")[0]
                there = ABOVE_ALL if top == ABOVE_ALL else by_package.get(top)
                if there and there != name and there not in r.may_import:
                    out.append(f"{path.relative_to(r.folder.parent).as_posix()}:{imp.line} imports {imp.name} "
                               f"({name}/ may import: {', '.join(sorted(r.may_import)) or 'nothing'})")
    return out


def folder_violations(pkg: Package) -> list[str]:
    """A package's folders: each "May import" names folders of the package, the lines form layers, and every
    import between folders follows them."""
    allowed = pkg.may_import()
    out = [f"{pkg.name}/{folder}/ may import folders that do not exist: {sorted(deps - set(allowed))}"
           for folder, deps in sorted(allowed.items()) if deps - set(allowed)]
    out += [f"{pkg.name}: the folders {c} name each other under 'May import'" for c in cycles(allowed)]
    return out + pkg.layer_violations(pkg.graph(), allowed)


def package_cycles(pkg: Package) -> list[str]:
    return [f"{pkg.name}: " + " <-> ".join(c) for c in cycles(pkg.graph())]


# The house as it is.

def test_every_top_level_folder_with_python_is_a_row() -> None:
    assert unplaced_folders(HOUSE) == [], "add the folder to HOUSE (what it may import) or to NOT_ROOMS (why not)"
    for name, r in HOUSE.items():
        assert r.why and r.package.files(), f"{name}: a row names its reason and a folder that holds Python"


def test_the_table_is_layered() -> None:
    assert table_problems(HOUSE) == []


def test_the_top_level_folders_import_in_order() -> None:
    assert order_violations(HOUSE) == []


@pytest.mark.parametrize("name", sorted(HOUSE))
def test_each_folder_of_a_package_imports_as_its_init_says(name: str) -> None:
    assert folder_violations(HOUSE[name].package) == []


@pytest.mark.parametrize("name", sorted(HOUSE))
def test_no_import_cycle_in_a_package(name: str) -> None:
    assert package_cycles(HOUSE[name].package) == []


def test_the_reader_reads_every_kind_of_import() -> None:
    src = ("import a.b\nfrom c import d, e\nfrom . import f\nfrom .g import h\nfrom ..i import j\n"
           "def k():\n    import l\n    def inner():\n        from m import n\n")
    got = [(i.line, i.name, i.function) for i in read_imports(src, "pkg.sub.mod")]
    assert got == [(1, "a.b", ""), (2, "c.d", ""), (2, "c.e", ""), (3, "pkg.sub.f", ""), (4, "pkg.sub.g.h", ""),
                   (5, "pkg.i.j", ""), (7, "l", "k"), (9, "m.n", "k")]
    assert [i.name for i in read_imports("from . import x\nfrom .. import y\n", "pkg.sub", is_package=True)] == [
        "pkg.sub.x", "pkg.y"]


def test_the_real_graph_is_read() -> None:
    bench = HOUSE["bench"].package
    assert {"scenario_table", "report"} <= bench.graph()["call"]  # call -> report, never back
    assert "call" not in bench.graph()["report"]
    assert set(bench.folders()) == {"kernels", "cpu"} and bench.folder_of("kernels.fp8_linear") == "kernels"
    violations = order_violations({**HOUSE, "bench": Room(ROOT / "bench", bench, frozenset({"trainer"}), "planted")})
    assert any("bench/bench.py" in v and "imports localkit.tiny_model" in v for v in violations)


# Each rule fails on a planted bad import.

def plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


FOLDERS = {"pkg/__init__.py": '"""pkg."""\n',
           "pkg/low/__init__.py": '"""low: the bottom.\n\nMay import: nothing.\n"""\n',
           "pkg/low/base.py": "",
           "pkg/high/__init__.py": '"""high: above low.\n\nMay import: low (its base).\n"""\n',
           "pkg/high/top.py": "from pkg.low import base\n",
           "pkg/loose/script.py": "import pkg.high.top\n",  # a folder without __init__: above the folders
           "pkg/main.py": "from pkg.high import top\n"}


def test_the_folder_rule_fails_on_a_planted_import_up(tmp_path: Path) -> None:
    pkg = Package(plant(tmp_path, FOLDERS) / "pkg", "pkg")
    assert folder_violations(pkg) == []
    plant(tmp_path, {"pkg/low/base.py": "def f():\n    from ..high import top\n"})  # relative and lazy
    assert folder_violations(pkg) == ["pkg.low.base imports pkg.high.top (low/ may import: nothing)"]
    plant(tmp_path, {"pkg/low/base.py": "import pkg.main\n"})  # up to the package's top level
    assert folder_violations(pkg) == ["pkg.low.base imports pkg.main (low/ may import: nothing)"]


def test_the_folder_rule_fails_on_a_may_import_of_no_folder_or_in_a_circle(tmp_path: Path) -> None:
    pkg = Package(plant(tmp_path, FOLDERS) / "pkg", "pkg")
    plant(tmp_path, {"pkg/low/__init__.py": '"""low.\n\nMay import: high, attic.\n"""\n'})
    assert folder_violations(pkg) == ["pkg/low/ may import folders that do not exist: ['attic']",
                                      "pkg: the folders ['high', 'low'] name each other under 'May import'"]
    plant(tmp_path, {"pkg/low/__init__.py": '"""low: no paragraph."""\n'})
    with pytest.raises(AssertionError, match="lacks the 'May import: ...' paragraph"):
        folder_violations(pkg)


def test_the_cycle_rule_fails_on_a_planted_circle(tmp_path: Path) -> None:
    pkg = Package(plant(tmp_path, FOLDERS) / "pkg", "pkg")
    assert package_cycles(pkg) == []
    plant(tmp_path, {"pkg/low/other.py": "from . import base\n", "pkg/low/base.py": "def f():\n    import pkg.low.other\n"})
    assert package_cycles(pkg) == ["pkg: low.base <-> low.other"]


def tiny_house(root: Path) -> dict[str, Room]:
    plant(root, {"kit/__init__.py": "", "kit/model.py": "", "app/__init__.py": "", "app/run.py": "from kit import model\n",
                 "tools/x/__init__.py": "", "tools/x/cli.py": ""})
    return {"kit": room("kit", "kit", set(), "bottom", root), "app": room("app", "app", {"kit"}, "top", root),
            "tools": room("tools", "x", set(), "a folder holding the package x", root)}


def test_the_order_rule_fails_on_a_planted_import_up(tmp_path: Path) -> None:
    house = tiny_house(tmp_path)
    assert order_violations(house) == [] and unplaced_folders(house, tmp_path) == []
    plant(tmp_path, {"kit/model.py": "def f():\n    from app.run import g\n"})
    assert order_violations(house) == ["kit/model.py:2 imports app.run.g (kit/ may import: nothing)"]
    plant(tmp_path, {"kit/model.py": "import x.cli\n"})  # the package of another folder, by its own name
    assert order_violations(house) == ["kit/model.py:1 imports x.cli (kit/ may import: nothing)"]


def test_the_order_rule_fails_on_an_import_of_the_tests(tmp_path: Path) -> None:
    house = tiny_house(tmp_path)
    plant(tmp_path, {"app/run.py": "from kit import model\nfrom tests.layering import ROOT\n"})
    assert order_violations(house) == ["app/run.py:2 imports tests.layering.ROOT (app/ may import: kit)"]


def test_the_table_rule_fails_on_a_folder_of_no_row(tmp_path: Path) -> None:
    house = tiny_house(tmp_path)
    plant(tmp_path, {"attic/old.py": "", ".hidden/x.py": ""})
    assert unplaced_folders(house, tmp_path) == ["attic"]


def test_the_table_rule_fails_on_rows_in_a_circle(tmp_path: Path) -> None:
    house = tiny_house(tmp_path)
    assert table_problems(house) == []
    house["kit"] = room("kit", "kit", {"app", "attic"}, "planted", tmp_path)
    assert table_problems(house) == ["kit/ may import ['attic'], which are no rows",
                                     "the rows ['app', 'kit'] may import each other"]
