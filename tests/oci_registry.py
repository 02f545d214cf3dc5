"""A real OCI registry for a test (its signing key: e2e/support/signing_key.py): what `gemma3-ray release` pushes to and signs with.

The registry is distribution's `registry` (the e2e's part, built once by `e2e/build/parts.sh build registry` into
the parts cache), serving plain HTTP on a free 127.0.0.1 port with its blobs in the test's own folder, stopped on
every exit of the ``with``. A test calls ``skip_unless_built()`` first: without the part it is skipped, naming
the command that builds it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ROOT / "e2e" / "build" / "parts.sh"
BUILD = "e2e/build/parts.sh build registry"
READY_S = 20.0


def registry_binary() -> Path | None:
    """The cached registry binary, or None when the part is not built."""
    folder = subprocess.run([str(PARTS), "path", "registry"], capture_output=True, text=True, timeout=60, check=True)
    bin_dir = Path(folder.stdout.strip())
    return bin_dir / "registry" if (bin_dir / ".built").is_file() and (bin_dir / "registry").is_file() else None


def skip_unless_built() -> Path:
    binary = registry_binary()
    if binary is None:
        pytest.skip(f"the OCI registry part (distribution) is not built: run `{BUILD}` (once; cached)")
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running(folder: Path, readonly: bool = False) -> Iterator[str]:
    """The registry serving ``127.0.0.1:PORT`` (yielded), its blobs under ``folder``; stopped on every exit. With
    ``readonly`` it serves pulls and refuses pushes (distribution's maintenance mode)."""
    binary = skip_unless_built()
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "config.yml"
    config.write_text(f"version: 0.1\nlog: {{level: warn}}\nstorage:\n  filesystem: {{rootdirectory: {folder / 'blobs'}}}\n"
                      + ("  maintenance: {readonly: {enabled: true}}\n" if readonly else "")
                      + f"http:\n  addr: 127.0.0.1:{port}\n")
    with (folder / "registry.log").open("wb") as log:
        proc = subprocess.Popen([str(binary), "serve", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2):
                    break
            except OSError as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log_tail = (folder / "registry.log").read_text()[-800:]
                    raise RuntimeError(f"the registry did not answer: {log_tail}") from exc
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
