"""Signals for `make e2e`: ^C, SIGTERM and SIGHUP end the run with its clean-up finished.

The harness turns SIGTERM and SIGHUP into `Interrupted` (a KeyboardInterrupt, as ^C is), and runs each
project script (e2e/cluster/cluster.sh, e2e/build/image.sh, e2e/cluster/registry.sh) in a session of its own, so that the
signal reaches the script once, from here, and the script finishes its own clean-up: it is waited for,
never killed after subprocess.run's 0.25 s. While the clean-up runs, further signals are noted and
ignored ("a second ^C after the clean-up").
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long a script gets to finish its clean-up after the signal (cluster.sh stop takes 5-15 s here;
# image.sh stops a build step and unmounts within a minute).
CHILD_CLEANUP_S = 300.0


class Interrupted(KeyboardInterrupt):
    """A signal ended the run (^C, SIGTERM, SIGHUP); signum says which."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def install() -> None:
    """^C, SIGTERM, SIGHUP -> Interrupted in the main thread."""
    for s in HANDLED:
        signal.signal(s, _raise)


@contextmanager
def shielded(say=print) -> Iterator[list[int]]:
    """The clean-up: signals arriving meanwhile are listed (and said once), not acted on."""
    got: list[int] = []

    def note(signum: int, frame: object) -> None:
        got.append(signum)
        with suppress(OSError):
            say(f"[e2e] {signal.Signals(signum).name}: the clean-up is running; it finishes first")

    old = {s: signal.signal(s, note) for s in HANDLED}
    try:
        yield got
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class _Tee:
    """The child's stdout and stderr read a line at a time as they come: each line appended to the log at once
    (a timeout, ^C or a kill of make e2e keeps what the script said so far) and kept for the caller."""

    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.lock = threading.Lock()
        self.log = open(log, "a", encoding="utf-8")  # noqa: SIM115 - closed in join()
        self.threads = [threading.Thread(target=self._read, args=(pipe, keep), daemon=True)
                        for pipe, keep in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for t in self.threads:
            t.start()

    def _read(self, pipe: IO[str], keep: list[str]) -> None:
        for line in pipe:
            keep.append(line)
            with self.lock:
                self.log.write(line)
                self.log.flush()

    def join(self) -> tuple[str, str]:
        for t in self.threads:
            t.join(timeout=30)  # the pipes close when the child (and what holds them) ends
        with self.lock:
            self.log.close()
        return "".join(self.out), "".join(self.err)


def run_child(argv: list[str], *, timeout: float, cwd=None, env=None,
              log: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv to its end, output captured (and, with log, appended to it line by line as it comes). On a
    signal here: the same signal to the child, then wait (up to CHILD_CLEANUP_S) for it to finish its clean-up,
    then re-raise. On timeout: SIGTERM, the same wait, then subprocess.TimeoutExpired."""
    # A signal while Popen runs (the script may already run its first lines: seen under load, a ^C right after
    # the script's first output never reached it) is held until the child is known, then acted on as usual.
    held: list[int] = []
    outer = {s: signal.signal(s, lambda signum, frame: held.append(signum)) for s in HANDLED}
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                                start_new_session=True)
    except BaseException:
        _restore(outer)
        raise
    tee = _Tee(proc, log) if log is not None else None
    try:
        _restore(outer)
        for signum in held:  # again, to the handler in force (Interrupted; in a clean-up, noted only)
            signal.raise_signal(signum)
        if tee is None:
            out, err = proc.communicate(timeout=timeout)
        else:
            proc.wait(timeout=timeout)
            out, err = tee.join()
    except subprocess.TimeoutExpired:
        _finish(proc, signal.SIGTERM, tee is None)
        if tee is not None:
            tee.join()
        raise
    except KeyboardInterrupt as e:
        _finish(proc, getattr(e, "signum", signal.SIGINT), tee is None)
        if tee is not None:
            tee.join()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _restore(handlers: dict) -> None:
    for s, h in handlers.items():
        signal.signal(s, h)


def _finish(proc: subprocess.Popen, signum: int, drain: bool = True) -> None:
    """Send signum to the child (its own session: nothing else sent it) and wait for it to end (drain: reading
    its pipes here; else a _Tee reads them)."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            proc.send_signal(signum)
    deadline = time.monotonic() + CHILD_CLEANUP_S
    with shielded(lambda m: None):
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if drain:
                    proc.communicate(timeout=1)
                else:
                    proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                continue
            except ValueError:  # pipes already closed by an earlier communicate
                time.sleep(0.2)
        if proc.poll() is None:  # a child that ignores its clean-up limit: only now SIGKILL
            proc.kill()
            proc.wait()
