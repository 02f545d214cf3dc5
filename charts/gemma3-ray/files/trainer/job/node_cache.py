"""Node-local copies of gs:// objects: each object is fetched once per node (whatever the number of
workers, epochs or restarts) and read from the node's disk after that; a dataset prefix brings only its
data files, never the images beside them (rows fetch those one by one, through the same cache)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Fetches of different objects run in parallel; the same object is fetched by one process of the node.
LOCK_STRIPES = 64
OBJECTS_DIR = "gcs-objects"
PREFIXES_DIR = "gcs-prefixes"
COMPLETE_MARKER = ".complete"

# (uri) -> (pyarrow filesystem, path without the scheme): the caller's storage settings (emulator, auth).
FilesystemFor = Callable[[str], tuple]
# One GCS client per process and setting: made on first use (a forked data-loader process makes its own).
_FILESYSTEMS: dict[tuple[int, str], Any] = {}


def per_process(setting: str, make: Callable[[], Any]) -> FilesystemFor:
    """A FilesystemFor over one filesystem per process for `setting` (e.g. the emulator address)."""

    def fs_for(uri: str) -> tuple:
        slot = (os.getpid(), setting)
        if slot not in _FILESYSTEMS:
            _FILESYSTEMS[slot] = make()
        return _FILESYSTEMS[slot], uri.removeprefix("gs://")

    return fs_for


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@contextlib.contextmanager
def node_lock(cache: Path, name: str) -> Iterator[None]:
    """An exclusive lock shared by every process of this node that uses `cache`."""
    lock = cache / "locks" / f"{_digest(name)[:16]}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _stripe_lock(cache: Path, key: str) -> contextlib.AbstractContextManager[None]:
    """The node lock of one of LOCK_STRIPES stripes, chosen by `key`."""
    return node_lock(cache, f"gcs-stripe-{int(_digest(key)[:8], 16) % LOCK_STRIPES:02d}")


def object_path(cache: Path, uri: str) -> Path:
    """Where `uri` lives in the node cache (content-addressed by the URI)."""
    h = _digest(uri)
    return cache / OBJECTS_DIR / h[:2] / f"{h}{Path(uri).suffix}"


def fetch_object(uri: str, cache: Path, fs_for: FilesystemFor) -> Path:
    """The node-local copy of the gs:// object `uri`, downloaded on first use by one process of the node.

    Raises FileNotFoundError when the object does not exist.
    """
    dest = object_path(cache, uri)
    if dest.is_file():
        return dest
    with _stripe_lock(cache, uri):
        if dest.is_file():  # another process of the node fetched it while this one waited
            return dest
        fs, path = fs_for(uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        try:
            with fs.open_input_stream(path) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(tmp, dest)  # readers never see a partial file
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def read_object(uri: str, cache: Path, fs_for: FilesystemFor) -> bytes | None:
    """The bytes of the gs:// object `uri` through the node cache; None when it does not exist."""
    try:
        return fetch_object(uri, cache, fs_for).read_bytes()
    except (FileNotFoundError, OSError):
        return None


def copy_data_files(uri: str, cache: Path, fs_for: FilesystemFor, suffixes: set[str], version: str = "") -> Path:
    """A local mirror of the files under the gs:// prefix (or the one file) `uri` whose suffix is in
    `suffixes`, made once per node and `version` (the objects' generations: changed data is copied again);
    files with other suffixes (images) are left in the bucket."""
    import pyarrow.fs as pafs

    dest = cache / PREFIXES_DIR / _digest(f"{uri}#{version}" if version else uri)[:16]
    with _stripe_lock(cache, f"prefix:{uri}"):
        if not (dest / COMPLETE_MARKER).exists():
            fs, path = fs_for(uri)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise FileNotFoundError(uri)
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            if info.type == pafs.FileType.File:
                entries = [(info.path, Path(info.path).name)]
            else:
                listing = fs.get_file_info(pafs.FileSelector(path, recursive=True))
                entries = [(i.path, i.path[len(path.rstrip("/")) + 1 :]) for i in listing
                           if i.type == pafs.FileType.File and Path(i.path).suffix in suffixes]
            for src, rel in entries:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with fs.open_input_stream(src) as stream, open(target, "wb") as out:
                    shutil.copyfileobj(stream, out)
            (dest / COMPLETE_MARKER).touch()
    single = dest / Path(uri).name
    return single if single.is_file() else dest
