"""The plugin's module graph, read from its source: no module imports the CLI, and no import cycle
(imports inside functions count: a lazy import hides a cycle, it does not remove it)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "gemma3_ray"
SOURCE = Path(__file__).resolve().parents[2] / "plugin" / PACKAGE
ENTRY_POINTS = {"cli", "__main__"}  # the CLI itself, and `python -m gemma3_ray` which runs it


def _modules() -> set[str]:
    return {p.stem for p in SOURCE.glob("*.py") if p.stem != "__init__"}


def imports(module: str) -> set[str]:
    """The package's modules that ``module`` imports, anywhere in its source."""
    known = _modules()
    found: set[str] = set()
    for node in ast.walk(ast.parse((SOURCE / f"{module}.py").read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) > 1 and parts[1] in known:
                found.add(parts[1])
    return found - {module}


def graph() -> dict[str, set[str]]:
    return {m: imports(m) for m in sorted(_modules())}


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
    assert {"commands", "gke_commands", "run_reports"} <= set(g["cli"])  # the CLI registers them
    assert "errors" in g["prereqs"]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_the_cli() -> None:
    offenders = sorted(m for m, deps in graph().items() if "cli" in deps and m not in ENTRY_POINTS)
    assert offenders == [], f"these plugin modules import gemma3_ray.cli: {offenders}"


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []
