"""Processes the local kit started, found and stopped by their ids, on every exit path, interrupts included.

A started server (``ray start --head --block``, fake-gcs-server) leads a session of its own
(``start_new_session``); Ray's daemons inherit it, and a Ray job's driver leads another one under the
job supervisor. :class:`Owned` knows a started process, every descendant seen since, and the sessions
they lead, and stops exactly those: never ``ray stop`` (it would stop every Ray on the machine), never a
process by name. A process is looked up before its ``Popen`` returns by a marker in its argv, so an
interrupt in between leaks nothing either. :func:`deferred_signals` keeps a second Ctrl-C from cutting
the clean-up short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import psutil

STOP_GRACE_S = 15.0


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                p.send_signal(sig)


@dataclass
class Stopped:
    """What :meth:`Owned.stop` did: the pids it stopped, those that outlived SIGTERM's grace and were SIGKILLed,
    and those still running after SIGKILL."""

    root: int | None
    stopped: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)


@dataclass
class Owned:
    """One started process, its descendants and the sessions they lead.

    ``marker``: a word of the process's argv that nothing else on the machine has (a fresh temp dir,
    a port): it finds the process when an interrupt came before ``Popen`` returned.
    """

    marker: str
    pid: int | None = None
    process: subprocess.Popen | None = None
    seen: dict[int, psutil.Process] = field(default_factory=dict)
    sessions: dict[int, float] = field(default_factory=dict)  # session id -> its leader's start time

    def popen(self, cmd: list[str], **kwargs) -> subprocess.Popen:
        self.process = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        self.pid = self.process.pid
        self.remember()
        return self.process

    def _root(self) -> psutil.Process | None:
        pid = self.pid
        if pid is None:  # interrupted inside Popen: the child of this process whose argv has the marker
            with contextlib.suppress(psutil.Error):
                for child in psutil.Process().children():
                    with contextlib.suppress(psutil.Error):
                        if self.marker in child.cmdline():
                            pid = child.pid
                            break
        if pid is None:
            return None
        try:
            return self.seen.get(pid) or psutil.Process(pid)
        except psutil.NoSuchProcess:
            return None

    def remember(self) -> None:
        """Record the process tree now (Ray's workers come and go) and the sessions its members lead."""
        root = self._root()
        if root is None:
            return
        with contextlib.suppress(psutil.Error):
            for p in [root, *root.children(recursive=True)]:
                self.seen.setdefault(p.pid, p)
                with contextlib.suppress(psutil.Error, OSError):
                    if os.getsid(p.pid) == p.pid:
                        self.sessions.setdefault(p.pid, p.create_time())

    def members(self) -> list[psutil.Process]:
        """Live processes of this start: seen in its tree, in its tree now, or in a session it leads."""
        self.remember()
        found = {pid: p for pid, p in self.seen.items() if _alive(p)}
        if self.sessions:
            for p in psutil.process_iter():
                with contextlib.suppress(psutil.Error, OSError):
                    sid = os.getsid(p.pid)
                    if sid in self.sessions and p.pid not in found and self._our_session(sid) and _alive(p):
                        found[p.pid] = p
        return list(found.values())

    def _our_session(self, sid: int) -> bool:
        """The session is still the one recorded: its leader is the process seen then, or gone (a pid that
        is still some process's session id is never handed out again)."""
        try:
            return abs(psutil.Process(sid).create_time() - self.sessions[sid]) < 0.01
        except psutil.NoSuchProcess:
            return True

    def stop(self, grace_s: float = STOP_GRACE_S) -> Stopped:
        """SIGTERM the root first (``ray start --block`` stops its daemons itself), then every member left;
        SIGKILL what outlives ``grace_s``. Returns what was stopped and what, if anything, still runs."""
        root = self._root()
        targets = self.members()
        result = Stopped(root.pid if root else None, [p.pid for p in targets])
        if root is not None and _alive(root):
            _signal([root], signal.SIGTERM)
            psutil.wait_procs([root], timeout=grace_s)
        rest = [p for p in self.members() if _alive(p)]
        result.stopped += [p.pid for p in rest if p.pid not in result.stopped]
        _signal(rest, signal.SIGTERM)
        _, alive = psutil.wait_procs(rest, timeout=grace_s)
        result.killed = [p.pid for p in alive]
        _signal(alive, signal.SIGKILL)
        psutil.wait_procs(alive, timeout=grace_s)
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_s)  # reap it
        result.left = [p.pid for p in self.members() if _alive(p)]
        return result


@contextlib.contextmanager
def deferred_signals(note: Callable[[str], None]) -> Iterator[None]:
    """SIGINT/SIGTERM wait until the block ends (clean-up runs to the end); one arriving meanwhile is
    re-raised afterwards as KeyboardInterrupt unless an exception is already on its way."""
    got: list[int] = []

    def later(signum: int, frame: object) -> None:
        if not got:
            note("still stopping what this run started; one moment")
        got.append(signum)

    previous = {s: signal.signal(s, later) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = False
    try:
        yield
    except BaseException:
        failed = True
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if got and not failed:
            raise KeyboardInterrupt


@dataclass
class OwnsProcess:
    """A server this kit started: what it owns (the process, stopped by its id) and how it was stopped."""

    owned: Owned | None = field(default=None, kw_only=True)
    stopped: Stopped | None = field(default=None, kw_only=True)

    @property
    def process(self) -> subprocess.Popen | None:
        return self.owned.process if self.owned else None
