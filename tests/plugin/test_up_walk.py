"""`up`'s walk, read from its source (#35): the flow enters each module it uses once.

The walk of a function is the order in which its code calls into the plugin's modules: its statements
in evaluation order (a call's receiver and arguments before the call), each call resolved to the module
it enters — through the module's imports (``helm_release.template``, an imported name), or through the
type a parameter is annotated with (``clients: Clients`` -> ``config.clients``) or a local was assigned
from. A call to a function of the same module is walked where it is called (it is the flow's own
code); a nested function or lambda where it is defined (the flow prepares it there: `up`'s install is
prepared in the chart's stretch and runs in its turn). Both sides of a branch are walked: a module the
plan calls in one branch and the apply in the other is entered twice. ``utils/`` is the floor every
module stands on and is not counted; consecutive calls into one module are one entry.

Rooms: the distinct modules entered; a module is entered twice when another comes between two of its
calls; a climb back up is an entry into a module on a higher floor than the one before (the layer order
of plugin/README.md: cli, release, kueue, gcp, gke|kube, config, utils).
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from tests.plugin.test_layering import PACKAGE, SOURCE

FLOORS = {"cli": 0, "release": 1, "kueue": 2, "gcp": 3, "gke": 4, "kube": 4, "config": 5, "utils": 6}
# `up`'s walk (release/up.py's docstring says the same order).
UP_WALK = ["config.kube_context", "gcp.image_build", "config.render", "kube.helm_release", "config.clients",
           "kube.kuberay_crd", "release.down", "release.prereqs", "kube.cluster"]


def files_of(source: Path) -> dict[str, Path]:
    out = {}
    for p in sorted(source.rglob("*.py")):
        parts = list(p.relative_to(source).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


class Walker:
    """The walk of one module's functions (its imports read once). A local assigned from a call into a module,
    or from a name of a known type, counts as that module's: an over-count can only add entries, never hide one."""

    def __init__(self, source: Path, module: str) -> None:
        self.files = files_of(source)
        self.module = module
        self.tree = ast.parse(self.files[module].read_text(encoding="utf-8"))
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}
        self.names: dict[str, str] = {}  # local name -> the plugin module it is, or comes from
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == PACKAGE:
                base = node.module.split(".", 1)[1] if "." in node.module else ""
                for a in node.names:
                    full = f"{base}.{a.name}" if base else a.name
                    self.names[a.asname or a.name] = full if full in self.files else base
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == PACKAGE and a.asname:
                        self.names[a.asname] = a.name.split(".", 1)[1]
        self.steps: list[str] = []

    def _root(self, node: ast.AST) -> ast.AST:
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            node = node.value if not isinstance(node, ast.Call) else node.func
        return node

    def _type_of(self, annotation: ast.AST | None) -> str | None:
        if annotation is None:
            return None
        text = annotation.value if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) else ast.unparse(annotation)
        for part in text.replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split():
            root = part.split(".")[0]
            if root in self.names:
                return self.names[root]
        return None

    def walk(self, function: str) -> list[str]:
        self.steps = []
        self._function(self.functions[function], {}, [function])
        out: list[str] = []
        for m in self.steps:
            if not out or out[-1] != m:
                out.append(m)
        return out

    def _function(self, fn: ast.FunctionDef | ast.Lambda, types: dict[str, str], stack: list[str]) -> None:
        types = dict(types)
        args = fn.args
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            t = self._type_of(getattr(a, "annotation", None))
            if t:
                types[a.arg] = t
            else:
                types.pop(a.arg, None)
        for d in [*args.defaults, *args.kw_defaults]:
            if d is not None:
                self._visit(d, types, stack)
        body = fn.body if isinstance(fn.body, list) else [fn.body]
        for stmt in body:
            self._visit(stmt, types, stack)

    def _record(self, module: str | None) -> None:
        if module and module != self.module and module.split(".")[0] != "utils":
            self.steps.append(module)

    def _visit(self, node: ast.AST, types: dict[str, str], stack: list[str]) -> None:
        if isinstance(node, ast.Call):
            self._visit(node.func, types, stack)
            for a in node.args:
                self._visit(a, types, stack)
            for k in node.keywords:
                self._visit(k.value, types, stack)
            f = node.func
            if isinstance(f, ast.Name) and f.id in self.functions and f.id not in stack:
                self._function(self.functions[f.id], {}, [*stack, f.id])
                return
            root = self._root(f)
            if isinstance(root, ast.Name):
                self._record(self.names.get(root.id) or types.get(root.id))
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            self._function(node, types, stack)  # walked where it is defined
            return
        if isinstance(node, ast.Assign):
            self._visit(node.value, types, stack)
            root = self._root(node.value)
            t = None
            if isinstance(root, ast.Name):
                t = types.get(root.id) or (self.names.get(root.id) if isinstance(node.value, (ast.Call, ast.Attribute)) else None)
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        if t and isinstance(target, ast.Name):
                            types[n.id] = t
                        else:
                            types.pop(n.id, None)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for g in node.generators:
                self._visit(g.iter, types, stack)
                for c in g.ifs:
                    self._visit(c, types, stack)
            for part in ([node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]):
                self._visit(part, types, stack)
            return
        for child in ast.iter_child_nodes(node):
            self._visit(child, types, stack)


def walk(module: str, function: str, source: Path = SOURCE) -> list[str]:
    return Walker(source, module).walk(function)


def climbs(steps: list[str]) -> int:
    floors = [FLOORS[m.split(".")[0]] for m in steps]
    return sum(b < a for a, b in zip(floors, floors[1:], strict=False))


def entered_twice(steps: list[str]) -> list[str]:
    return sorted({m for m in steps if steps.count(m) > 1})


def _package(tmp_path: Path, modules: dict[str, str]) -> Path:
    for name, text in modules.items():
        path = tmp_path.joinpath(*name.split(".")).with_suffix(".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_walk_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The shape `up` had (a room left and entered again, a helper of its own, a typed client) is measured as
    such, and the same work prepared in one stretch per room is not."""
    src = _package(tmp_path, {
        "config.clients": "class Clients:\n    def kube(self): ...\n",
        "config.render": "def load(p): ...\ndef render(d): ...\n",
        "gcp.image": "def values(d): ...\n",
        "kube.helm": "def template(v): ...\ndef install(v): ...\n",
        "release.prereqs": "def run(d): ...\n",
        "release.old": """
            from gemma3_ray.config import render
            from gemma3_ray.config.clients import Clients
            from gemma3_ray.gcp import image
            from gemma3_ray.kube import helm
            from gemma3_ray.release.prereqs import run as prereqs
            from gemma3_ray.utils import tokens

            def _values(dep):
                return render.render(render.load(dep), image.values(dep))

            def up(dep, clients: Clients, apply):
                values = _values(dep)
                helm.template(values)
                k = clients.kube()
                if not apply:
                    prereqs(dep)
                    return tokens.shown(dep)
                prereqs(dep)
                helm.install(values)
                k.kube()
            """,
        "release.new": """
            from gemma3_ray.config import render
            from gemma3_ray.config.clients import Clients
            from gemma3_ray.gcp import image
            from gemma3_ray.kube import helm
            from gemma3_ray.release import prereqs

            def up(dep, clients: Clients, apply):
                extra = image.values(dep)
                values = render.render(render.load(dep), extra)
                helm.template(values)
                install = lambda: helm.install(values)
                clients.kube()
                prereqs.run(dep)
                if apply:
                    install()
            """,
    })
    old = walk("release.old", "up", src)
    assert old == ["config.render", "gcp.image", "config.render", "kube.helm", "config.clients", "release.prereqs",
                   "kube.helm", "config.clients"]
    assert entered_twice(old) == ["config.clients", "config.render", "kube.helm"] and climbs(old) == 3
    new = walk("release.new", "up", src)
    assert new == ["gcp.image", "config.render", "kube.helm", "config.clients", "release.prereqs"]
    assert entered_twice(new) == []


def test_up_enters_no_module_twice() -> None:
    steps = walk("release.up", "run")
    assert entered_twice(steps) == [], steps
    assert steps == UP_WALK  # every room `up` needs is seen (a walk that resolved nothing would pass the line above)


def test_up_says_its_walk() -> None:
    """release/up.py's docstring names the modules its flow enters in the order the walk finds them."""
    files = files_of(SOURCE)
    doc = ast.get_docstring(ast.parse(files["release.up"].read_text(encoding="utf-8"))) or ""
    named = [m for m in re.findall(r"``([a-z_]+\.[a-z_]+)``", doc) if m in files]
    assert named == walk("release.up", "run")


def test_the_cli_only_parses_up() -> None:
    """`gemma3-ray up`'s handler reads its flags, resolves the Deployment (cli.common) and hands over to release.up."""
    assert walk("cli.release_commands", "cmd_up") == ["cli.apply_flag", "cli.common", "release.up"]
