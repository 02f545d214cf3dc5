"""A worker's scratch directory: made when the worker function starts, removed on every way out of it.

The scratch holds the SFTTrainer's output_dir (its local checkpoints), TensorBoard's event files and the
metrics copy: hundreds of MB a run. It lives in the tempfile directory, which on the chart's pods is an
emptyDir that outlives the worker process (a retried attempt runs in the same pod), and on a local cluster
is the machine's /tmp: nothing there may outlive the worker. A worker killed outright (SIGKILL, out of
memory) cannot remove its own; the next worker on the node removes the scratch of every worker whose
process is gone (the process id is in the name).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "gemma3-ray-rank"
_NAME = re.compile(rf"^{PREFIX}\d+-pid(\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def sweep(root: Path) -> list[Path]:
    """Remove the scratch directories under `root` whose worker process is gone; the ones removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in root.iterdir():
            m = _NAME.match(entry.name)
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))) and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


@contextlib.contextmanager
def scratch_dir(rank: int) -> Iterator[Path]:
    """A fresh scratch directory for this worker (after removing dead workers' ones), removed on exit:
    return, exception or interrupt."""
    root = Path(tempfile.gettempdir())
    sweep(root)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{rank}-pid{os.getpid()}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
