"""The plugin's own rules, read with the house's import reader (tests/layering.py; its folders' "May import"
lines and the absence of cycles are checked house-wide by tests/test_layering.py): each folder says what it
owns, nothing imports the CLI, every module opens with a one-line docstring and stays under 450 lines. Below
the CLI nothing sees the command line (no argparse, no ``Namespace``, no parameter called ``args``); one
function constructs a Kubernetes client (the seam in ``config/clients.py``); one module words a plan's "Dry
run" epilogue (``utils/plan.py``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.layering import Package

PACKAGE = "gemma3_ray"
SOURCE = Path(__file__).resolve().parents[2] / "plugin" / PACKAGE
ENTRY_POINTS = {"__main__"}  # `python -m gemma3_ray`, which runs the CLI
MAX_LINES = 450
KUBE_SEAM = ("config.clients", "connect")  # the one function that makes a Kubernetes connection
EPILOGUE = "utils.plan"  # the one module that words "Dry run: ..."
# What makes a Kubernetes client: a connection (ApiClient, a kubeconfig or in-cluster loader) or an API class on one.
KUBE_CONSTRUCTORS = re.compile(r"^(ApiClient|load_kube_config|new_client_from_config|load_incluster_config|"
                               r"CustomObjectsApi|\w+V\d\w*Api)$")


LAYERS = Package(SOURCE, PACKAGE)
_files, folders, folder_of, graph, may_import = LAYERS.files, LAYERS.folders, LAYERS.folder_of, LAYERS.graph, LAYERS.may_import


def test_the_graph_is_read_from_the_source() -> None:
    g = graph()
    assert {"cli.release_commands", "cli.cluster_commands", "cli.report_command", "cli.kueue_command"} <= g["cli.entry"]
    assert "utils.errors" in g["release.prereqs"]
    assert "utils.plan" in g["gke.cluster"]  # `from gemma3_ray.utils.plan import Action, Plan`: the module, not the names
    assert g["__main__"] == {"cli"}  # a name the folder's __init__ exports
    assert set(folders()) == {"cli", "config", "gcp", "gke", "kube", "kueue", "release", "utils"}


def test_each_folder_says_what_it_owns() -> None:
    for folder in may_import():
        doc = ast.get_docstring(ast.parse((SOURCE / folder / "__init__.py").read_text(encoding="utf-8"))) or ""
        assert doc.startswith(f"{folder}: ") and "\nOwns: " in doc, f"{folder}/__init__.py: '{folder}: ...', then 'Owns: ...'"


def test_no_module_imports_the_cli() -> None:
    offenders = sorted(m for m, deps in graph().items()
                       if folder_of(m) != "cli" and m not in ENTRY_POINTS and any(folder_of(d) == "cli" for d in deps))
    assert offenders == [], f"these plugin modules import gemma3_ray.cli: {offenders}"


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


def _parse(module: str, files: dict[str, Path]) -> ast.Module:
    return ast.parse(files[module].read_text(encoding="utf-8"))


def command_line_uses(tree: ast.Module) -> list[str]:
    """Where a module sees the command line: imports argparse, names ``Namespace``, takes a parameter ``args``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            found.append(f"line {node.lineno}: import argparse")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            found.append(f"line {node.lineno}: from argparse import ...")
        elif isinstance(node, ast.Name) and node.id == "Namespace" or isinstance(node, ast.Attribute) and node.attr == "Namespace":
            found.append(f"line {node.lineno}: Namespace")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            found += [f"line {a.lineno}: parameter args" for a in params if a.arg == "args"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "argparse.Namespace" in node.value:
            found.append(f"line {node.lineno}: an annotation naming argparse.Namespace")
    return found


def kube_constructions(tree: ast.Module) -> list[tuple[str, str]]:
    """(function, what) for every call that makes a Kubernetes client; function "" at the module's top level."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else where
            if isinstance(child, ast.Call):
                f = child.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                if KUBE_CONSTRUCTORS.match(name):
                    found.append((where, name))
            visit(child, inner)

    visit(tree, "")
    return found


def dry_run_wordings(tree: ast.Module) -> list[int]:
    """The lines whose string constants (f-string parts included) word a "Dry run" epilogue."""
    return sorted({n.lineno for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                   and "Dry run" in n.value})


def test_the_new_checks_find_what_they_look_for() -> None:
    cli_shaped = ast.parse("import argparse\n"
                           "def run(args: 'argparse.Namespace', dep): return args.apply\n"
                           "def go(ns: argparse.Namespace): pass\n")
    assert len(command_line_uses(cli_shaped)) == 4  # the import, the parameter, its annotation, the Namespace
    assert command_line_uses(ast.parse("def run(dep, *, apply: bool, **kwargs): return apply\n")) == []
    built = ast.parse("from kubernetes import client, config\n"
                      "def status(kubeconfig):\n"
                      "    config.load_kube_config(config_file=kubeconfig)\n"
                      "    return client.CustomObjectsApi(), client.CoreV1Api(), client.ApiextensionsV1Api()\n")
    assert kube_constructions(built) == [("status", "load_kube_config"), ("status", "CustomObjectsApi"),
                                         ("status", "CoreV1Api"), ("status", "ApiextensionsV1Api")]
    assert kube_constructions(ast.parse("def f(kube): return kube.get_custom().list_cluster_custom_object()")) == []
    assert dry_run_wordings(ast.parse("def f(out, n):\n    out(f'Dry run: nothing changed ({n} planned).')\n")) == [2]


def test_below_the_cli_nothing_sees_the_command_line() -> None:
    files = _files()
    bad = {m: uses for m in sorted(files) if m and folder_of(m) not in {"cli", ""}
           for uses in [command_line_uses(_parse(m, files))] if uses}
    assert bad == {}, "below cli/, functions take what they need (the CLI turns its flags into values): " + repr(bad)


def test_one_function_constructs_the_kubernetes_clients() -> None:
    files = _files()
    where = {(m, fn) for m in files if m for fn, _ in kube_constructions(_parse(m, files))}
    module, function = KUBE_SEAM
    assert where - {(module, function), (module, "get_core"), (module, "get_custom"), (module, "get_api_ext")} == set(), \
        f"a Kubernetes client is made outside {module}.Kube (get one from clients.kube): {sorted(where)}"
    assert {(module, function), (module, "get_core"), (module, "get_custom"), (module, "get_api_ext")} <= where  # seen
    seam = _parse(module, files)
    calls = [n for n in ast.walk(seam) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == function]
    assert len(calls) == 1, f"{module}.{function} is called from one place (Kube.api_client, which keeps the connection)"


def test_one_module_words_a_plans_epilogue() -> None:
    files = _files()
    where = {m: lines for m in sorted(files) if m for lines in [dry_run_wordings(_parse(m, files))] if lines}
    assert set(where) == {EPILOGUE}, f"say a plan's 'Dry run' epilogue through {EPILOGUE}.dry_run/offline: {where}"
