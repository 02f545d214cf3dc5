"""A checkpoint's manifest: the size, sha256 and md5 of every file its workers saved, written by rank 0 into
the checkpoint's directory after every worker's upload (so last). A checkpoint is intact only if its
manifest verifies: every file it lists is there, with its size and checksum (the driver reads md5 from a
gs:// object's metadata, nothing downloaded; a local file, and every file a worker downloads, is hashed).

Standard library and pyarrow only: the driver uses it before anything starts.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST_FILE = "manifest.json"
FORMAT = 1
HASH_CHUNK = 1 << 20


def _hashes(chunks) -> tuple[str, str]:
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    for chunk in chunks:
        sha.update(chunk)
        md5.update(chunk)
    return sha.hexdigest(), base64.b64encode(md5.digest()).decode()  # md5 as GCS writes md5Hash


def _read(fh):
    while chunk := fh.read(HASH_CHUNK):
        yield chunk


def entries(directory: Path) -> dict[str, dict[str, Any]]:
    """{file name: {size, sha256, md5}} of the files directly in `directory` (one worker's checkpoint part)."""
    out = {}
    for path in sorted(p for p in directory.iterdir() if p.is_file()):
        with open(path, "rb") as fh:
            sha, md5 = _hashes(_read(fh))
        out[path.name] = {"size": path.stat().st_size, "sha256": sha, "md5": md5}
    return out


def manifest(parts: list[dict[str, dict[str, Any]]], step: int) -> bytes:
    """The manifest of a checkpoint made of every worker's part (rank order)."""
    files: dict[str, dict[str, Any]] = {}
    for part in parts:
        files.update(part)
    return json.dumps({"format": FORMAT, "step": step, "workers": len(parts), "files": files}, indent=1,
                      sort_keys=True).encode()


def _listed(raw: bytes | None) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    if raw is None:
        return None, f"no {MANIFEST_FILE} (a checkpoint is intact only when its manifest verifies)"
    try:
        files = json.loads(raw)["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files")
    except (ValueError, KeyError, TypeError) as e:
        return None, f"{MANIFEST_FILE}: unreadable ({e})"
    return files, None


def local_problem(directory: Path) -> str | None:
    """Why the checkpoint in the local `directory` does not verify against its manifest, or None."""
    manifest_path = directory / MANIFEST_FILE
    files, problem = _listed(manifest_path.read_bytes() if manifest_path.is_file() else None)
    if problem:
        return problem
    for name, want in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            return f"{name}: missing (its manifest lists it)"
        if path.stat().st_size != want["size"]:
            return f"{name}: {path.stat().st_size} bytes, its manifest says {want['size']}"
        with open(path, "rb") as fh:
            sha, _ = _hashes(_read(fh))
        if sha != want["sha256"]:
            return f"{name}: its sha256 differs from its manifest's (the file changed after it was saved)"
    return None


def remote_problem(fs, base: str, is_gcs: bool) -> str | None:
    """Why the checkpoint at `base` on the pyarrow filesystem `fs` does not verify, or None. On gs:// the
    objects' md5 (their metadata) is compared, locally each file's sha256."""
    import pyarrow.fs as pafs

    if not is_gcs:
        return local_problem(Path(base))
    info = fs.get_file_info(f"{base}/{MANIFEST_FILE}")
    raw = None
    if info.type == pafs.FileType.File:
        with fs.open_input_stream(info.path) as src:
            raw = src.read()
    files, problem = _listed(raw)
    if problem:
        return problem
    found = {Path(i.path).name: i for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))}
    for name, want in sorted(files.items()):
        if name not in found or found[name].type != pafs.FileType.File:
            return f"{name}: missing (its manifest lists it)"
        if found[name].size != want["size"]:
            return f"{name}: {found[name].size} bytes, its manifest says {want['size']}"
        with fs.open_input_file(found[name].path) as fh:
            meta = {(k.decode() if isinstance(k, bytes) else k): v for k, v in dict(fh.metadata() or {}).items()}
        md5 = meta.get("md5Hash", b"")
        md5 = md5.decode() if isinstance(md5, bytes) else str(md5)
        if md5 and md5 != want["md5"]:
            return f"{name}: its md5 differs from its manifest's (the object changed after it was saved)"
        if not md5:  # a composite object has no md5: read it
            with fs.open_input_stream(found[name].path) as src:
                sha, _ = _hashes(_read(src))
            if sha != want["sha256"]:
                return f"{name}: its sha256 differs from its manifest's (the object changed after it was saved)"
    return None
