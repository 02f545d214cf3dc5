"""Every repository path a README names exists (#41 item 5).

Every Markdown file of the repository (git's files, tracked or new, so nothing of .venv/, .tools/ or
demo-output/) is read for the paths it names: `inline code` outside fenced blocks, and the targets
of its links and images. Fenced command blocks are tests/test_readme_examples.py's.

What counts as a repository path, so that a name of something else is never mistaken for one:
- inline code: one word of path characters (no space, no `://`, no `~`, `$`, `<...>`, `*`, `…`),
  relative (no leading `/` or `-`), holding a `/`, whose first part is an entry of the repository's
  root or of the README's own folder (`e2e/stages.py`, `job/flags.py` beside trainer/README.md,
  `../demo/`), or a code file (.py, .sh, .tpl) named by its last parts (`config/clients.py` in
  plugin/README.md: some repository path must end so); `gs://b/p`, `~/.cache/x`, `runs/<run id>/`,
  `/home/ray/trainer`, `checkpoints/…` are not; a `:12` or `:12-30` line suffix and a `::test` id
  are cut off first. A bare file name (`summary.json`) is not read: most name a run's outputs;
- a link or image target that is not a URL, a `mailto:` or an `#anchor`: always, from the README's folder.
A path exists when it (symlinks followed) is a file or folder git knows. ALLOWED lists the few names
that look like ours and are not, each with its reason.
"""

from __future__ import annotations

import posixpath
import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (README, path) -> why it is named though it is not a file of this repository.
ALLOWED: dict[tuple[str, str], str] = {
    ("images/trainer/README.md", "ci/ray_ci/docker_container.py"):
        "a file of Ray's own repository (its CI), cited as the source of the CUDA of Ray's images",
    ("charts/gemma3-ray/files/trainer/README.md", "ray/train/torch/config.py"):
        "a module of the installed Ray package, cited for what it imports",
    ("plugin/README.md", "plugin/.venv/bin/python"):
        "an interpreter the launcher tries when a user made that virtual environment (git ignores it)",
}

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
PATH_WORD = re.compile(r"(?:\./|(?:\.\./)+)?[\w.@+-]+(?:/[\w.@+-]+)*/?")
LINE_SUFFIX = re.compile(r"(::[\w\[\].-]+|:\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$")
# A code file named by its last parts, beside no folder of that name (`config/clients.py` of the plugin's
# package, `job/flags.py` of the trainer's): it must be the end of some repository path.
CODE = (".py", ".sh", ".tpl")
NOT_A_FILE_LINK = re.compile(r"^([a-z][a-z0-9+.-]*:|#)", re.I)


@cache
def known() -> frozenset[str]:
    """Git's files (tracked, or new and not ignored) and every folder above them, as repository paths."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    paths: set[str] = set()
    for f in filter(None, out.split("\0")):
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(paths)


def markdown_files() -> list[str]:
    return sorted(p for p in known() if p.endswith(".md") and (ROOT / p).is_file())


def exists(path: str) -> bool:
    """A repository path (relative to the root, normalised) that git knows, its symlinks followed."""
    real = (ROOT / path).resolve()
    try:
        rel = real.relative_to(ROOT).as_posix()
    except ValueError:
        return False
    return rel in known() or rel == "."


def resolve(folder: str, path: str) -> str | None:
    """``path`` seen from the repository folder ``folder``, normalised; None when it leaves the repository."""
    joined = posixpath.normpath(posixpath.join(folder, path))
    return None if joined == ".." or joined.startswith("../") else joined


def _first_part(base: str, path: str) -> bool:
    """Whether the path's first part (after its ./ and ../) is an entry of the repository folder ``base``."""
    prefix = re.match(r"(?:\./)?(?:\.\./)*", path).group(0)
    entry = resolve(base, prefix + path[len(prefix):].split("/")[0])
    return entry is not None and exists(entry)


def code_path(word: str, folder: str) -> str | None:
    """The repository path an inline-code word names, or None when it names something else."""
    word = LINE_SUFFIX.sub("", word.strip())
    if not PATH_WORD.fullmatch(word) or "/" not in word:
        return None
    if any(_first_part(base, word) for base in dict.fromkeys([folder, ""])) or word.endswith(CODE):
        return word
    return None


def somewhere(path: str) -> bool:
    """A code file named by its last parts (`config/clients.py` in plugin/README.md): some file git knows ends so."""
    tail = "/" + path.removeprefix("./")
    return any(("/" + k).endswith(tail) for k in known())


def named_paths(md: str, text: str | None = None) -> list[tuple[str, list[str]]]:
    """(what the README names, the repository paths it may mean) for every path the Markdown file ``md``
    (or ``text`` read as if it were that file) names."""
    folder = posixpath.dirname(md)
    text = FENCE.sub("", (ROOT / md).read_text() if text is None else text)
    found: list[tuple[str, list[str]]] = []
    for word in INLINE.findall(text):
        path = code_path(word, folder)
        if path is not None:
            found.append((f"`{word}`", [p for p in (resolve(folder, path), resolve("", path)) if p] + [f"*/{path}"]))
    for target in [*LINK.findall(text), *REFERENCE.findall(text)]:
        if not NOT_A_FILE_LINK.match(target):
            path = target.split("#", 1)[0]
            found.append((f"link {target}", [p for p in [resolve(folder, path)] if p]))
    return found


def broken(md: str, text: str | None = None) -> list[str]:
    out = []
    for what, candidates in named_paths(md, text):
        name = what.removeprefix("link ").strip("`")
        if (md, LINE_SUFFIX.sub("", name)) in ALLOWED:
            continue
        if not any(somewhere(p[2:]) if p.startswith("*/") else exists(p) for p in candidates):
            out.append(f"{md}: {what}")
    return out


@pytest.mark.parametrize("md", markdown_files())
def test_every_path_a_readme_names_exists(md: str) -> None:
    assert not broken(md), f"paths that do not exist (fix the README, or add to ALLOWED with a reason): {broken(md)}"


def test_the_readmes_are_read_and_name_paths() -> None:
    """The test reads every README (the trainer's through its real folder) and finds paths in them."""
    files = markdown_files()
    assert {"README.md", "e2e/README.md", "charts/gemma3-ray/files/trainer/README.md"} <= set(files)
    assert sum(len(named_paths(md)) for md in files) > 200


@pytest.mark.parametrize("word", [
    "gs://bucket/prefix", "~/.cache/gemma3-ray", "https://github.com/ray-project/kuberay", "runs/<run id>/",
    "/home/ray/trainer", "checkpoints/checkpoint-000040", "demo-output/run-…/gcs", "make demo", "tests/chart/*.py",
    "--values=values/local.yaml", "$HOME/.kube/config", "a/b", "r1-20250101-000000-abcd",
])
def test_what_is_not_a_repository_path_is_not_read_as_one(word: str) -> None:
    assert code_path(word, "") is None and code_path(word, "charts/gemma3-ray") is None


@pytest.mark.parametrize(("word", "folder", "path"), [
    ("e2e/stages.py", "", "e2e/stages.py"), ("job/flags.py", "charts/gemma3-ray/files/trainer", "job/flags.py"),
    ("../demo/README.md", "localkit", "../demo/README.md"), ("trainer/job/flags.py:168", "", "trainer/job/flags.py"),
    ("tests/chart/test_chart_render.py::test_x", "", "tests/chart/test_chart_render.py"), ("e2e/", "", "e2e/"),
    ("e2e/no_such_module.py", "", "e2e/no_such_module.py"),
])
def test_a_repository_path_is_read_and_a_missing_one_fails(word: str, folder: str, path: str) -> None:
    assert code_path(word, folder) == path


def test_a_stale_path_and_a_stale_link_are_caught() -> None:
    """A README naming a file that moved fails: the check can fail."""
    text = ("See `e2e/no_such_module.py`, `localkit/chart_job.py:40` and [the kit](no_such_file.md), "
            "[the demo](../demo/README.md).\n")
    assert broken("localkit/STALE.md", text) == ["localkit/STALE.md: `e2e/no_such_module.py`",
                                                 "localkit/STALE.md: link no_such_file.md"]
