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

from trainer.job import stored

MANIFEST_FILE = "manifest.json"
FORMAT = 1
HASH_CHUNK = 1 << 20
TRAINER_STATE_FILE = "trainer_state.json"  # what a resume reads its step from: every manifest lists it


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


def _plain_name(name: str) -> bool:
    """A file directly in the checkpoint's directory: no path, nothing outside it, not the manifest itself."""
    return (bool(name) and name not in (".", "..", MANIFEST_FILE) and "/" not in name and "\\" not in name
            and "\0" not in name)


def _hex(n: int) -> stored.Check:
    return stored.where(lambda v: len(v) == n and all(c in "0123456789abcdef" for c in v), f"{n} hex digits",
                        stored.TEXT)


def _md5_b64(value: str) -> bool:
    try:
        return len(base64.b64decode(value, validate=True)) == 16
    except (ValueError, TypeError):
        return False


ENTRY = stored.fields({"size": stored.COUNT, "sha256": _hex(64),
                       "md5": stored.where(_md5_b64, "a base64 md5", stored.TEXT)})
SHAPE = stored.fields({
    "format": stored.where(lambda v: v == FORMAT, f"format {FORMAT} (this trainer's)", stored.is_a(int, "an integer")),
    "step": stored.COUNT,
    "files": stored.both(
        stored.mapping(stored.where(_plain_name, "a file name in the checkpoint's own directory", stored.TEXT), ENTRY),
        lambda files, at: None if TRAINER_STATE_FILE in files else f"{at}: does not list {TRAINER_STATE_FILE}"),
}, {"workers": stored.COUNT})


TRAINER_STATE = stored.fields({"global_step": stored.COUNT})


def state_step(raw: bytes, step: int | None = None) -> int:
    """The optimizer step in a checkpoint's trainer_state.json, checked (and equal to `step`, its manifest's,
    when given); stored.Unusable otherwise."""
    found = stored.parse(raw, TRAINER_STATE_FILE, TRAINER_STATE)["global_step"]
    if step is not None and found != step:
        raise stored.Unusable(f"{TRAINER_STATE_FILE}: global_step {found}, its manifest says step {step}")
    return found


def _listed(raw: bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """The manifest, checked as a whole (every entry's keys and types, names inside the checkpoint)."""
    if raw is None:
        return None, f"no {MANIFEST_FILE} (a checkpoint is intact only when its manifest verifies)"
    try:
        return stored.parse(raw, MANIFEST_FILE, SHAPE), None
    except stored.Unusable as e:
        return None, str(e)


def _state_problem(raw: bytes, step: int) -> str | None:
    try:
        state_step(raw, step)
    except stored.Unusable as e:
        return str(e)
    return None


def local_problem(directory: Path) -> str | None:
    """Why the checkpoint in the local `directory` does not verify against its manifest, or None."""
    manifest_path = directory / MANIFEST_FILE
    manifest, problem = _listed(manifest_path.read_bytes() if manifest_path.is_file() else None)
    if problem:
        return problem
    for name, want in sorted(manifest["files"].items()):
        path = directory / name
        if not path.is_file():
            return f"{name}: missing (its manifest lists it)"
        if path.stat().st_size != want["size"]:
            return f"{name}: {path.stat().st_size} bytes, its manifest says {want['size']}"
        with open(path, "rb") as fh:
            sha, _ = _hashes(_read(fh))
        if sha != want["sha256"]:
            return f"{name}: its sha256 differs from its manifest's (the file changed after it was saved)"
    return _state_problem((directory / TRAINER_STATE_FILE).read_bytes(), manifest["step"])


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
    manifest, problem = _listed(raw)
    if problem:
        return problem
    found = {Path(i.path).name: i for i in fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))}
    for name, want in sorted(manifest["files"].items()):
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
    with fs.open_input_stream(found[TRAINER_STATE_FILE].path) as src:  # small: the step it resumes at
        return _state_problem(src.read(), manifest["step"])
