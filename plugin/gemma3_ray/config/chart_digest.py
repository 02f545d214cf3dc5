"""The chart's content digest and its record per version in CHANGELOG.md: a changed chart needs a new version.

What counts (what a user of one chart version gets; a change to any of it is a new version):
``templates/``, ``values.schema.json``, ``values.yaml``, ``files/`` (the trainer: less what the chart's
``.helmignore`` keeps out of the package — its README, docs/, caches) and ``Chart.yaml`` less its ``version``
field (read as YAML: kubeVersion, appVersion, dependencies, description). What does not: README.md,
CHANGELOG.md, ci/ (test values), checkov-skips.yaml, ``.helmignore`` itself.

Each CHANGELOG.md entry ``## [VERSION] - DATE`` records the digest of that version's contents on a line
``Content digest: `sha256:…```; ``python -m scripts.chart_digest --write`` writes it for the current version.

A released version has its artifact, ``charts/releases/NAME-VERSION.tgz`` (what a registry holds), beside the
chart: its entry is never rewritten, and ``archive_digest`` of the .tgz is the digest its entry records.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import tarfile
import tempfile
from pathlib import Path

from ruamel.yaml import YAML

COUNTED = ("templates", "values.schema.json", "values.yaml", "values-moved.yaml", "files")
CHANGELOG = "CHANGELOG.md"
WRITE = "python -m scripts.chart_digest --write"
_ENTRY = re.compile(r"^## \[([^\]]+)\]", re.MULTILINE)
_RECORD = re.compile(r"^Content digest: `(sha256:[0-9a-f]{64})`", re.MULTILINE)


def _ignore_patterns(chart: Path) -> list[str]:
    path = chart / ".helmignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith(("#", "!"))]


def ignored(rel: str, is_dir: bool, patterns: list[str]) -> bool:
    """Whether Helm's .helmignore rules leave ``rel`` (a path relative to the chart) out of the package: a
    pattern with a slash matches the path from the chart's root, one without matches any name in it; a
    trailing slash matches folders only."""
    for pattern in patterns:
        dirs_only = pattern.endswith("/")
        pat = pattern.rstrip("/")
        if dirs_only and not is_dir:
            continue
        if "/" in pat:
            if fnmatch.fnmatchcase(rel, pat):
                return True
        elif fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pat):
            return True
    return False


def counted_files(chart: Path) -> list[str]:
    """The counted files, as paths relative to the chart, sorted."""
    patterns = _ignore_patterns(chart)
    found: list[str] = []
    for top in COUNTED:
        root = chart / top
        if root.is_file():
            found.append(top)
            continue
        for here, dirs, files in os.walk(root):
            base = Path(here).relative_to(chart).as_posix()
            dirs[:] = [d for d in dirs if not ignored(f"{base}/{d}", True, patterns)]
            found += [f"{base}/{f}" for f in files if not ignored(f"{base}/{f}", False, patterns)]
    return sorted(found)


def content_digest(chart: Path) -> str:
    """``sha256:…`` of the counted files (each path and its bytes' sha256) and Chart.yaml less ``version``."""
    h = hashlib.sha256()
    for rel in counted_files(chart):
        h.update(f"{rel}\0{hashlib.sha256((chart / rel).read_bytes()).hexdigest()}\n".encode())
    meta = YAML(typ="safe").load((chart / "Chart.yaml").read_text(encoding="utf-8")) or {}
    meta.pop("version", None)
    h.update(("Chart.yaml\0" + json.dumps(meta, sort_keys=True, default=str)).encode())
    return f"sha256:{h.hexdigest()}"


def archive_digest(tgz: Path) -> str:
    """The content digest of a packaged chart (``helm package``'s .tgz, or a registry's chart layer): unpacked into
    a temporary folder (regular files and folders only, nothing outside it), then ``content_digest`` of its chart."""
    with tempfile.TemporaryDirectory(prefix="chart-digest-") as tmp, tarfile.open(tgz, "r:gz") as tar:
        members = [m for m in tar.getmembers() if (m.isfile() or m.isdir()) and not Path(m.name).is_absolute()
                   and ".." not in Path(m.name).parts]
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python < 3.10.12: checked above
        tar.extractall(tmp, members=members, **safe)  # noqa: S202 (members checked)
        (top,) = [p for p in Path(tmp).iterdir() if p.is_dir()]
        return content_digest(top)


def releases_folder(chart: Path) -> Path:
    """Where the released artifacts live: ``releases/`` beside the chart's folder (charts/releases)."""
    return chart.parent / "releases"


def released(chart: Path) -> dict[str, Path]:
    """Each released version of the chart and its artifact, ``releases/NAME-VERSION.tgz``."""
    name = (YAML(typ="safe").load((chart / "Chart.yaml").read_text(encoding="utf-8")) or {}).get("name", chart.name)
    found = sorted(releases_folder(chart).glob(f"{name}-*.tgz"))
    return {p.name[len(name) + 1: -len(".tgz")]: p for p in found}


def recorded(chart: Path) -> dict[str, str | None]:
    """Each CHANGELOG.md entry's version and the content digest it records (None: none recorded)."""
    path = chart / CHANGELOG
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    heads = list(_ENTRY.finditer(text))
    out: dict[str, str | None] = {}
    for i, m in enumerate(heads):
        body = text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        rec = _RECORD.search(body)
        out[m.group(1)] = rec.group(1) if rec else None
    return out


def write(chart: Path, version: str, *, rewrite: bool = False) -> tuple[str, str | None]:
    """Record the chart's digest in the entry of ``version`` (after its heading); returns (new, old). A digest
    already recorded for the version is replaced only with ``rewrite`` (a released version never changes);
    raises ValueError with the sentence to show otherwise."""
    path = chart / CHANGELOG
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    head = re.search(rf"^## \[{re.escape(version)}\][^\n]*\n", text, re.MULTILINE)
    if head is None:
        raise ValueError(f"{CHANGELOG} has no entry for version {version}: add `## [{version}] - YYYY-MM-DD` with "
                         "what changed (Keep a Changelog), then run this again.")
    digest = content_digest(chart)
    old = recorded(chart).get(version)
    artifact = released(chart).get(version)
    if old and old != digest and artifact is not None:
        raise ValueError(f"version {version} is released ({artifact.parent.name}/{artifact.name}): its entry never "
                         f"changes, not even with --rewrite; bump `version` in Chart.yaml and add a {CHANGELOG} entry "
                         "for the new one.")
    if old and old != digest and not rewrite:
        raise ValueError(f"version {version} already records {old}: bump `version` in Chart.yaml and add a "
                         f"{CHANGELOG} entry for the new one (pass --rewrite only for a version never released).")
    line = f"Content digest: `{digest}`\n"
    nxt = _ENTRY.search(text, head.end())
    body = text[head.end(): nxt.start() if nxt else len(text)]
    body = _RECORD.sub(line.rstrip("\n"), body, count=1) if _RECORD.search(body) else "\n" + line + body
    path.write_text(text[: head.end()] + body + (text[nxt.start():] if nxt else ""), encoding="utf-8")
    return digest, old
