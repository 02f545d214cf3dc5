"""The house's one import reader: each package's modules by import name, what each imports (imports inside
functions count: a lazy import hides an arrow, it does not remove it; relative imports are resolved), a
package's folders and each folder's "May import:" paragraph, the imports that break them, and import cycles.

tests/test_layering.py checks the house with it (every package's folders, no cycle in any package, the order
between the top-level folders); tests/plugin/test_layering.py and tests/trainer/test_layering.py check their
package's own rules with the same reader.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Import:
    line: int
    name: str  # the absolute dotted name it asks for: a module, or a module's attribute
    function: str  # the outermost function it sits in, "" at the module's top level


def module_name(source: Path, package: str, path: Path) -> str:
    """``job/flags.py`` of the package ``trainer`` -> ``trainer.job.flags``; a folder's ``__init__.py`` -> the
    folder's name."""
    parts = [package, *path.relative_to(source).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_imports(source: str, module: str, is_package: bool = False) -> list[Import]:
    """Every import of one module's source, at any depth, as absolute dotted names: ``from a.b import c`` asks
    for ``a.b.c`` (the module ``a.b.c`` if there is one, else the name ``c`` of ``a.b``); ``from ..x import y``
    is resolved against ``module`` (``is_package``: the module is a folder's ``__init__``)."""
    found: list[Import] = []

    def walk(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = function or (child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else "")
            if isinstance(child, ast.Import):
                found.extend(Import(child.lineno, a.name, inner) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    up = here[: len(here) - (child.level - 1)] if child.level - 1 <= len(here) else []
                    base = ".".join([*up, *([child.module] if child.module else [])])
                found.extend(Import(child.lineno, f"{base}.{a.name}" if base else a.name, inner) for a in child.names)
            walk(child, inner)

    walk(ast.parse(source), "")
    return found


def owner(name: str, modules: set[str] | dict[str, Path]) -> str:
    """The module a dotted name lives in: the longest prefix of it that is a module ("" if none is)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


@dataclass(frozen=True)
class Package:
    """A package of the house: its folder (``source``) and its import name (``name``: trainer, gemma3_ray, ...).
    Its modules go by their names inside it (``job.flags``; its own ``__init__``: ``""``)."""

    source: Path
    name: str

    def files(self) -> dict[str, Path]:
        paths = sorted(p for p in self.source.rglob("*.py") if "__pycache__" not in p.parts)
        return {module_name(self.source, self.name, p).removeprefix(self.name).removeprefix("."): p for p in paths}

    def imports(self, module: str, files: dict[str, Path] | None = None) -> list[tuple[Import, str | None]]:
        """Each import of ``module``, with the module of this package it reaches ("": its own ``__init__``, or
        None: another package's)."""
        files = files if files is not None else self.files()
        path = files[module]
        absolute = f"{self.name}.{module}" if module else self.name
        out = []
        for imp in read_imports(path.read_text(encoding="utf-8"), absolute, path.name == "__init__.py"):
            inside = imp.name == self.name or imp.name.startswith(self.name + ".")
            out.append((imp, owner(imp.name.removeprefix(self.name).removeprefix("."), files) if inside else None))
        return out

    def graph(self) -> dict[str, set[str]]:
        """Each module -> the modules of the package it imports (itself and the package's ``__init__`` left out)."""
        files = self.files()
        return {m: {dep for _, dep in self.imports(m, files) if dep} - {m} for m in sorted(files) if m}

    def folders(self) -> list[str]:
        """The folders that carry rules: those with an ``__init__.py`` (a folder of loose scripts has none)."""
        return sorted(p.parent.name for p in self.source.glob("*/__init__.py"))

    def folder_of(self, module: str) -> str:
        """The folder a module lives in, at any depth below it ("": above every folder: the package's top-level
        modules, and loose scripts in a folder without ``__init__``)."""
        first = module.split(".")[0]
        return first if first in self.folders() else ""

    def may_import(self) -> dict[str, set[str]]:
        """Each folder's allowed folders, as its ``__init__`` docstring says ("May import: a, b" or "nothing")."""
        return {folder: may_import_of(self.source / folder / "__init__.py") for folder in self.folders()}

    def layer_violations(self, g: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
        """Every import from a folder into another folder, or up into the package's top-level modules, that its
        ``__init__`` does not allow (the top-level modules sit above every folder and may import any)."""
        out = []
        for module, deps in sorted(g.items()):
            here = self.folder_of(module)
            if not here:
                continue
            for dep in sorted(deps):
                there = self.folder_of(dep)
                if there != here and there not in allowed.get(here, set()):
                    out.append(f"{self.name}.{module} imports {self.name}.{dep} ({here}/ may import: "
                               f"{', '.join(sorted(allowed.get(here, ()))) or 'nothing'})")
        return out


def may_import_of(init: Path) -> set[str]:
    """The names of a folder's "May import: a, b" paragraph (``nothing``: none); a note in parentheses says why."""
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    m = re.search(r"^May import: (.+?)(?:\n\n|\Z)", doc, re.M | re.S)
    assert m, f"{init.relative_to(ROOT) if init.is_relative_to(ROOT) else init}: its docstring lacks the " \
              "'May import: ...' paragraph"
    text = re.sub(r"\([^)]*\)", "", m[1])
    return set() if text.startswith("nothing") else {w.strip(" .\n") for w in text.split(",")}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One sorted list of modules per strongly connected component that holds a cycle (Tarjan)."""
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
