"""The model's processor, loaded from its files once per node and from a node-local copy after that.

``AutoProcessor.from_pretrained`` on Gemma 3 reads its 33 MB ``tokenizer.json`` three times (a Python
``json.load``, the Rust parser, and a deep copy of the parsed tokenizer): 4.5-5.5 s of one core, measured on
an idle 2-core machine, in every worker of every job and every restart. Unpickling the same processor takes
1.3 s. So the first process of a node that needs a processor loads it from the files, under the node lock,
and keeps a pickle of it in the node cache; every later worker on the node (the other ranks, the next job,
a restart) loads that.

The copy is named by everything the processor is made of: the model directory's path, the name and bytes of
every file in it but the weights, and the versions of Python, transformers and tokenizers. A changed file or
an upgrade is a new name; a copy that does not load is set aside and the files are read again. A pickle runs
code when it loads, so only a file this user wrote and no one else may change is loaded: a copy owned by
another user, writable by group or others, or not a plain file is never read (the files are, instead).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
import stat
import sys
import tempfile
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


def _trusted(path: Path) -> bool:
    """Whether `path` is a plain file of this user that no one else may write."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read(path: Path) -> Any | None:
    """The processor pickled at `path`, or None (absent, not trusted, or it does not load: then set aside)."""
    if not _trusted(path):
        return None
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except Exception:  # a torn or stale copy: read the files instead, and write a new one
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def _write(path: Path, processor: Any) -> None:
    """`processor` pickled at `path`, readable and writable by this user only, put in place whole (or not)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(processor, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except Exception:  # no room, a processor that does not pickle: the run goes on without a copy
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def load_processor(model_dir: Path, cache: Path) -> Any:
    """The processor of `model_dir`: from the node's copy when there is one, else from the files (then copied)."""
    path = cache / CACHE_DIR / f"{cache_key(model_dir)}.pkl"
    processor = _read(path)
    if processor is not None:
        return processor
    with node_lock(cache, f"processor:{path.name}"):
        processor = _read(path)  # another process of the node made it while this one waited
        if processor is None:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(str(model_dir))
            _write(path, processor)
    return processor
