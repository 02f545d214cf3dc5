"""The e2e package's module graph, read from its source: each folder imports only the folders its ``__init__``
names under "May import" (runner -> stages -> support; cluster/ and build/ nothing), no import cycle (imports
inside functions and relative imports count), and ``e2e/__main__.py`` imports the runner alone."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.layering import Package, cycles

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "e2e"
LAYERS = Package(ROOT / PACKAGE)


def imports_of(module: str, source: str, files: set[str], package: bool = False) -> set[str]:
    """The package's modules that ``module``'s source imports, at any depth, absolute or relative (``package``:
    the source is a folder's ``__init__.py``, the base of its relative imports)."""
    here = module.split(".") if module else []
    base = here if package else here[:-1]
    names: list[list[str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name.split(".") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the module's own package, up level - 1
                start = [PACKAGE, *base[:len(base) - (node.level - 1)]]
                mod = start + (node.module.split(".") if node.module else [])
            else:
                mod = (node.module or "").split(".")
            names += [mod + [a.name] for a in node.names]
    found = set()
    for parts in names:
        if parts[0] != PACKAGE:
            continue
        dotted = ".".join(parts[1:])
        while dotted and dotted not in files:  # a symbol: the module it comes from
            dotted = dotted.rpartition(".")[0]
        found.add(dotted)
    return found - {module, ""}


def graph() -> dict[str, set[str]]:
    files = LAYERS.files()
    return {m: imports_of(m, p.read_text(encoding="utf-8"), set(files), p.name == "__init__.py")
            for m, p in sorted(files.items()) if m}


def test_the_graph_is_read_from_the_source() -> None:
    g = graph()
    assert set(LAYERS.folders()) == {"runner", "stages", "support", "cluster", "build"}
    assert {"runner.table", "runner.cleanup", "support.record"} <= g["runner.cli"]
    assert "support.storage.run_storage" in g["support.storage.bucket"]
    assert "stages.kuberay" in g["stages.setup"]  # an import inside a function counts
    assert g["__main__"] == {"runner.cli"}


def test_the_checks_fail_on_a_planted_bad_import() -> None:
    """A support module that imports the stage table (an arrow up), absolute or relative, and a circle."""
    files = set(LAYERS.files())
    for source in ("from e2e.runner.table import STAGES\n", "def f():\n    from ..runner import table\n"):
        planted = {**graph(), "support.kube": imports_of("support.kube", source, files)}
        assert LAYERS.layer_violations(planted, LAYERS.may_import()) == [
            "support.kube imports runner.table (support/ may import: nothing)"], source
    circle = {**graph(), "support.errors": {"support.record"}}
    assert cycles(circle) == [["support.errors", "support.record"]]


def test_each_folder_says_its_job_and_its_layers_go_one_way() -> None:
    allowed = LAYERS.may_import()
    assert allowed == {"runner": {"stages", "support"}, "stages": {"support"}, "support": set(), "cluster": set(),
                       "build": set()}
    assert cycles(allowed) == []


def test_every_import_goes_down_the_layers_and_there_is_no_circle() -> None:
    g = graph()
    assert LAYERS.layer_violations(g, LAYERS.may_import()) == []
    assert cycles(g) == []


def test_package_inits_import_nothing() -> None:
    for path in LAYERS.files().values():
        if path.name == "__init__.py":
            tree = ast.parse(path.read_text(encoding="utf-8"))
            assert [type(n).__name__ for n in tree.body] == ["Expr"], f"{path}: a docstring only"
