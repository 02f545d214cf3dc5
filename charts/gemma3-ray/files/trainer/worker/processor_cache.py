"""The model's processor, loaded from its files once per node and from a node-local copy after that.

``AutoProcessor.from_pretrained`` on Gemma 3 reads its 33 MB ``tokenizer.json`` three times (a Python
``json.load``, the Rust parser, and a deep copy of the parsed tokenizer): 4.5-5.5 s of one core, measured on
an idle 2-core machine, in every worker of every job and every restart. Unpickling the same processor takes
1.3 s. So the first process of a node that needs a processor loads it from the files, under the node lock,
and keeps a pickle of it in the node cache; every later worker on the node (the other ranks, the next job,
a restart) loads that.

The copy is named by everything the processor is made of: the model directory's path, the name and bytes of
every file in it but the weights, and the versions of Python, transformers and tokenizers. A changed file or
an upgrade is a new name; a copy that does not load is set aside and the files are read again.

A pickle runs code when it loads, so a copy is loaded only where no one but this user could have put it there.
The ``processors/`` directory is opened without following a link (``O_NOFOLLOW | O_DIRECTORY``) and its
descriptor checked (``fstat``): this user's (the effective uid), writable by no group or other (anyone who may
write a directory may rename a file into it), else no copy is read or written there. The copy is opened through
that descriptor (``dir_fd``), again without following a link, and what was opened is checked, not its path: a
plain file of this user, writable by no one else, with one link (no second name outside the directory). A swap
between a check and the open cannot happen: there is no check before the open.

What this cannot prove: that a file this uid wrote was written by this job. Any process of the same uid may
write the directory, so the cache must sit on a path only this uid (and only trusted processes of it) write:
the node cache of one Ray cluster's pods, never a volume shared with other tenants that run as the same uid.
The parent directories of ``processors/`` are the node cache's (``cache_dir``), taken as configured.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import stat
import sys
from pathlib import Path
from typing import Any

from trainer.job.node_cache import node_lock

CACHE_DIR = "processors"
# Files that are weights, never part of a processor: not read for the copy's name (they are most of the bytes).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")


def cache_key(model_dir: Path) -> str:
    """A name for the processor of `model_dir`: its path, every non-weight file's name and bytes, the versions."""
    import tokenizers
    import transformers

    h = hashlib.sha256()
    for part in (str(model_dir.resolve()), sys.version, transformers.__version__, tokenizers.__version__):
        h.update(part.encode() + b"\0")
    for path in sorted(model_dir.iterdir()):
        if path.is_file() and not path.name.endswith(WEIGHT_SUFFIXES):
            h.update(path.name.encode() + b"\0")
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            h.update(b"\0")
    return h.hexdigest()


def _private(st: os.stat_result, kind: int) -> bool:
    """Whether what `st` describes is of `kind` (S_IFREG, S_IFDIR), this user's and writable by no one else."""
    return (stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _open_dir(cache: Path) -> int | None:
    """A descriptor of `cache/processors` (made 0700 if absent), or None where it is not this user's alone: a link, not
    a directory, another user's, or writable by group or others (anyone who may write it may rename a file in)."""
    path = cache / CACHE_DIR
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # a link (ELOOP), not a directory, absent (no room): no copy
        return None
    if not _private(os.fstat(fd), stat.S_IFDIR):
        os.close(fd)
        return None
    return fd


def _read(dir_fd: int, name: str) -> Any | None:
    """The processor pickled at `name` in the directory `dir_fd`, or None (absent, not trusted, or it does not load:
    then set aside). What is checked is what was opened (fstat of the descriptor, never the path again): a plain
    file, not a link, of this user, writable by no one else, with no other name (one link)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not _private(st, stat.S_IFREG) or st.st_nlink != 1:
            return None
        try:
            return pickle.load(fh)
        except Exception:  # a torn or stale copy: read the files instead, and write a new one
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            return None


def _write(dir_fd: int, name: str, processor: Any) -> None:
    """`processor` pickled at `name` in the directory `dir_fd`, mode 0600, put in place whole (or not)."""
    tmp = f".tmp-{os.getpid()}-{name}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(processor, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except Exception:  # no room, a processor that does not pickle: the run goes on without a copy
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)


def load_processor(model_dir: Path, cache: Path) -> Any:
    """The processor of `model_dir`: from the node's copy when there is one, else from the files (then copied). No
    copy is read or written where `cache/processors` is not this user's alone."""
    name = f"{cache_key(model_dir)}.pkl"
    dir_fd = _open_dir(cache)
    try:
        processor = _read(dir_fd, name) if dir_fd is not None else None
        if processor is not None:
            return processor
        with node_lock(cache, f"processor:{name}"):
            processor = _read(dir_fd, name) if dir_fd is not None else None  # another process made it meanwhile
            if processor is None:
                from transformers import AutoProcessor

                processor = AutoProcessor.from_pretrained(str(model_dir))
                if dir_fd is not None:
                    _write(dir_fd, name, processor)
        return processor
    finally:
        if dir_fd is not None:
            os.close(dir_fd)
