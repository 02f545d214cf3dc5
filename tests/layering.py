"""What the layering tests of the plugin (tests/plugin/test_layering.py) and of the trainer
(tests/trainer/test_layering.py) read the same way: a package's modules and folders, each folder's
"May import:" line, the imports that break it, and import cycles. What counts as an import is each
test's own (the trainer's counts imports inside functions too)."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Package:
    source: Path  # the package's folder

    def name(self, path: Path) -> str:
        """``job/flags.py`` -> ``job.flags``; a folder's ``__init__.py`` -> the folder; the package's own -> ``""``."""
        parts = list(path.relative_to(self.source).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    def files(self) -> dict[str, Path]:
        return {self.name(p): p for p in sorted(self.source.rglob("*.py")) if "__pycache__" not in p.parts}

    def folders(self) -> list[str]:
        return sorted(p.parent.name for p in self.source.glob("*/__init__.py"))

    def folder_of(self, module: str) -> str:
        """The folder a module lives in (``""``: the package's top level)."""
        return module.split(".")[0] if "." in module or module in self.folders() else ""

    def may_import(self) -> dict[str, set[str]]:
        """Each folder's allowed folders, as its ``__init__`` docstring says ("May import: a, b" or "nothing")."""
        allowed: dict[str, set[str]] = {}
        for folder in self.folders():
            doc = ast.get_docstring(ast.parse((self.source / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
            m = re.search(r"^May import: (.+?)(?:\n\n|\Z)", doc, re.M | re.S)
            assert m, f"{folder}/__init__.py: its docstring lacks the 'May import: ...' paragraph"
            text = re.sub(r"\([^)]*\)", "", m[1])  # a note in parentheses says why
            allowed[folder] = set() if text.startswith("nothing") else {w.strip(" .\n") for w in text.split(",")}
        return allowed

    def layer_violations(self, g: dict[str, set[str]], allowed: dict[str, set[str]]) -> list[str]:
        """Every import from one folder into another its ``__init__`` does not allow (the package's top-level
        modules sit above every folder: each test checks them on its own)."""
        out = []
        for module, deps in sorted(g.items()):
            here = self.folder_of(module)
            if not here:
                continue
            for dep in sorted(deps):
                there = self.folder_of(dep)
                if there != here and there not in allowed.get(here, set()):
                    out.append(f"{module} imports {dep} ({here}/ may import: "
                               f"{', '.join(sorted(allowed.get(here, ()))) or 'nothing'})")
        return out


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
