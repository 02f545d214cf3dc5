"""The demo's run folders: failed or interrupted tries never rotate away the newest successful run.

Real folders on disk, made by the demo's own ``_new_run_dir``; a run counts as successful when it holds
the demo's result file (written only after the job succeeded and its report was copied).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo import __main__ as demo_main
from demo import run_dirs

RESULT = run_dirs.RESULT_FILE


@pytest.fixture
def tries(monkeypatch: pytest.MonkeyPatch):
    """``_new_run_dir`` as successive demo processes call it: each try gets its own pid (run names end with
    the demo's pid, so tries started in the same second stay apart and in order)."""
    pids = iter(range(10_001, 10_100))
    monkeypatch.setattr(run_dirs.os, "getpid", lambda: next(pids))

    def one(out: Path, ok: bool) -> Path:
        run = demo_main._new_run_dir(out)
        run_dirs.release(run)  # this try's process has ended
        if ok:
            (run / RESULT).write_text("{}")
        return run

    return one


def _runs(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("run-*") if p.is_dir())


def test_failed_tries_do_not_rotate_away_the_good_run(tmp_path: Path, tries) -> None:
    good = tries(tmp_path, ok=True)
    failed = [tries(tmp_path, ok=False) for _ in range(6)]
    runs = _runs(tmp_path)
    assert len(runs) == run_dirs.KEEP_RUNS
    assert good in runs, "the only run with a report was removed by failed tries"
    # The failures rotate among themselves: the newest ones are kept.
    assert [r for r in runs if r != good] == failed[-(run_dirs.KEEP_RUNS - 1):]


def test_successful_runs_rotate_oldest_first_and_failures_go_before_them(tmp_path: Path, tries) -> None:
    goods = [tries(tmp_path, ok=True) for _ in range(2)]
    tries(tmp_path, ok=False)
    newest_good = tries(tmp_path, ok=True)  # 4 runs made; the failure is removed first
    assert _runs(tmp_path) == [*goods, newest_good]
    more = [tries(tmp_path, ok=True) for _ in range(2)]
    assert _runs(tmp_path) == [newest_good, *more]  # then successful runs, oldest first


def test_a_run_of_a_live_demo_is_not_removed(tmp_path: Path, tries) -> None:
    """Another `make demo` still running in the same output folder keeps its folder (it holds the folder's
    lock for its lifetime, as the demo's own process does)."""
    running = tries(tmp_path, ok=False)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); time.sleep(120)", str(running / run_dirs.RUN_LOCK)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for _ in range(4):
            tries(tmp_path, ok=False)
        assert running.is_dir()
        assert len(_runs(tmp_path)) == run_dirs.KEEP_RUNS + 1  # the live one is not counted against the rest
    finally:
        holder.kill()
        holder.wait()


def test_rotation_says_what_it_removed(tmp_path: Path, tries, capsys: pytest.CaptureFixture[str]) -> None:
    tries(tmp_path, ok=True)
    for _ in range(3):
        tries(tmp_path, ok=False)
    out = capsys.readouterr().out
    assert "removed an older failed or interrupted run" in out
    assert "removed an older successful run" not in out
    assert os.path.isdir(tmp_path / "latest")
