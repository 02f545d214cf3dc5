"""A Go module's zip, info and mod files from its source folder, laid out as a `file://` GOPROXY serves them.

For a module version the Go module proxy here refuses whole (ray-operator v1.7.0: its zip answers 403, its .mod
and the checksum database's line are served), e2e/build/parts.sh builds the part from the version's git tag instead:
this writes the zip the proxy would serve, and the go command itself then checks it against the checksum
database (GOSUMDB) when `go get` downloads it: a source that differs from the tag by one byte is refused
("SECURITY ERROR ... checksum mismatch"), so the operator built is the released one.

The file set follows the go command's rules for module zips (golang.org/x/mod/zip): regular files only, no
version-control folders, no vendor folders, nothing below a folder that holds its own go.mod (another module).
The repository root's LICENSE, which the go command adds to a module below the root without one, is the
caller's to copy in (e2e/build/parts.sh does). Standard library only: parts.sh runs it with the machine's python3.

    python3 e2e/build/module_zip.py SRC MODULE VERSION PROXY_DIR
"""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

VCS = {".git", ".hg", ".svn", ".bzr"}


def escape(path: str) -> str:
    """The proxy's case encoding: each upper-case letter as '!' and its lower case (go help goproxy)."""
    return "".join(f"!{c.lower()}" if c.isupper() else c for c in path)


def module_files(src: Path) -> list[Path]:
    """The files of the module rooted at src, relative to it, in the go command's zip rules."""
    files: list[Path] = []
    for p in sorted(src.rglob("*")):
        rel = p.relative_to(src)
        folders = rel.parts[:-1]
        if any(part in VCS or part == "vendor" for part in folders):
            continue
        if p.is_symlink() or not p.is_file():
            continue
        if any((src.joinpath(*folders[:i]) / "go.mod").is_file() for i in range(1, len(folders) + 1)):
            continue  # inside another module
        files.append(rel)
    return files


def write(src: Path, module: str, version: str, proxy: Path) -> Path:
    """Write PROXY/<module>/@v/{list,VERSION.info,VERSION.mod,VERSION.zip}; the zip's path."""
    gomod = src / "go.mod"
    if not gomod.is_file():
        raise SystemExit(f"module_zip: {src} has no go.mod (give the module's own folder)")
    first = next((line.split()[1] for line in gomod.read_text().splitlines() if line.startswith("module ")), "")
    if first != module:
        raise SystemExit(f"module_zip: {gomod} declares module {first or '(none)'}, not {module}")
    d = proxy / escape(module) / "@v"
    d.mkdir(parents=True, exist_ok=True)
    z = d / f"{version}.zip"
    with zipfile.ZipFile(z, "w", zipfile.ZIP_DEFLATED) as out:
        for rel in module_files(src):
            out.write(src / rel, f"{module}@{version}/{rel.as_posix()}")
    (d / f"{version}.mod").write_bytes(gomod.read_bytes())
    (d / f"{version}.info").write_text(json.dumps({"Version": version}) + "\n")
    (d / "list").write_text(f"{version}\n")
    return z


if __name__ == "__main__":
    if len(sys.argv) != 5:
        raise SystemExit("usage: python3 e2e/build/module_zip.py SRC MODULE VERSION PROXY_DIR")
    print(write(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])))
