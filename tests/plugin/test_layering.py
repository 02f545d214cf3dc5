"""The plugin's module graph and shape, read from its source: folders import one way (each only the folders
its ``__init__`` names under "May import"), nothing imports the CLI, no import cycle (imports inside
functions count: a lazy import hides a cycle, it does not remove it), every module opens with a one-line
docstring and stays under 450 lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = "gemma3_ray"
SOURCE = Path(__file__).resolve().parents[2] / "plugin" / PACKAGE
ENTRY_POINTS = {"__main__"}  # `python -m gemma3_ray`, which runs the CLI
MAX_LINES = 450


def _name(path: Path) -> str:
    """``cli/entry.py`` -> ``cli.entry``; a folder's ``__init__.py`` -> the folder; the package's own -> ``""``."""
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _files() -> dict[str, Path]:
    return {_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def folders() -> list[str]:
    return sorted(p.parent.name for p in SOURCE.glob("*/__init__.py"))


def folder_of(module: str) -> str:
    """The folder a module lives in (``""``: the package's top level)."""
    return module.split(".")[0] if "." in module or module in folders() else ""


def imports(module: str, files: dict[str, Path] | None = None) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source (a name imported from a folder
    is that folder's module if it is one, else the folder's ``__init__``)."""
    files = files or _files()
    found: set[str] = set()
    for node in ast.walk(ast.parse(files[module].read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != PACKAGE:
                continue
            dotted = ".".join(parts[1:])
            while dotted and dotted not in files:  # a symbol: the module it comes from
                dotted = dotted.rpartition(".")[0]
            if dotted:
                found.add(dotted)
    return found - {module, ""}


def graph() -> dict[str, set[str]]:
    files = _files()
    return {m: imports(m, files) for m in sorted(files) if m}


def may_import() -> dict[str, set[str]]:
    """Each folder's allowed folders, as its ``__init__`` docstring says ("May import: a, b" or "nothing")."""
    allowed: dict[str, set[str]] = {}
    for folder in folders():
        doc = ast.get_docstring(ast.parse((SOURCE / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        m = re.search(r"^May import: (.+?)(?:\n\n|\Z)", doc, re.M | re.S)
        assert m, f"{folder}/__init__.py: its docstring lacks the 'May import: ...' paragraph"
        text = re.sub(r"\([^)]*\)", "", m[1])  # a note in parentheses says why
        allowed[folder] = set() if text.startswith("nothing") else {w.strip(" .\n") for w in text.split(",")}
    return allowed


def layer_violations(g: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
    """Every import from one folder into another its ``__init__`` does not allow."""
    out = []
    for module, deps in sorted(g.items()):
        here = folder_of(module)
        if not here:  # the package's own __init__/__main__ sit above every folder
            continue
        for dep in sorted(deps):
            there = folder_of(dep)
            if there != here and there not in allowed.get(here, set()):
                out.append(f"{module} imports {dep} ({here}/ may import: {', '.join(sorted(allowed.get(here, ()))) or 'nothing'})")
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read_from_the_source() -> None:
    g = graph()
    assert {"cli.release_commands", "cli.cluster_commands", "cli.report_command", "cli.kueue_command"} <= g["cli.entry"]
    assert "utils.errors" in g["release.prereqs"]
    assert "utils.plan" in g["gke.cluster"]  # `from gemma3_ray.utils.plan import Action, Plan`: the module, not the names
    assert g["__main__"] == {"cli"}  # a name the folder's __init__ exports
    assert set(folders()) == {"cli", "config", "gcp", "gke", "kube", "kueue", "release", "utils"}


def test_the_checks_find_what_they_look_for() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    upward = {"utils.names": {"config.deployment"}, "config.deployment": {"utils.names"}}
    assert layer_violations(upward, {"utils": set(), "config": {"utils"}}) == [
        "utils.names imports config.deployment (utils/ may import: nothing)"]


def test_each_folder_says_what_it_owns_and_its_layers_go_one_way() -> None:
    allowed = may_import()
    for folder, deps in allowed.items():
        doc = ast.get_docstring(ast.parse((SOURCE / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert doc.startswith(f"{folder}: ") and "\nOwns: " in doc, f"{folder}/__init__.py: '{folder}: ...', then 'Owns: ...'"
        assert deps <= set(allowed), f"{folder}/ may import folders that do not exist: {deps - set(allowed)}"
    assert cycles(allowed) == [], "the folders' 'May import' lines must form layers (no two folders import each other)"


def test_every_import_goes_down_the_layers() -> None:
    assert layer_violations(graph(), may_import()) == []


def test_no_module_imports_the_cli() -> None:
    offenders = sorted(m for m, deps in graph().items()
                       if folder_of(m) != "cli" and m not in ENTRY_POINTS and any(folder_of(d) == "cli" for d in deps))
    assert offenders == [], f"these plugin modules import gemma3_ray.cli: {offenders}"


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []


def test_every_module_opens_with_a_one_line_docstring_and_stays_short() -> None:
    bad = []
    for path in _files().values():
        text = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(text), clean=False) or ""
        lines = doc.split("\n")
        if not doc or not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
            bad.append(f"{path.relative_to(SOURCE)}: the docstring must open with one line, then a blank line")
        if text.count("\n") > MAX_LINES:
            bad.append(f"{path.relative_to(SOURCE)}: {text.count(chr(10))} lines (at most {MAX_LINES})")
    assert bad == []
