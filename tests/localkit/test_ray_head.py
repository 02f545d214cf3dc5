"""The local Ray head is ready only when its job agent answers, and a head whose agent never does is started
again (CI once saw a head whose Jobs API answered "No available agent to submit job" for 120 s).

Real Ray; the fault is real too: the agent's HTTP port is held by another socket, so Ray's dashboard agent
fails to bind it (its log says "address already in use") and never answers, as when a free port picked
for it is taken before Ray binds it.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psutil
import pytest

from localkit import local_cluster
from localkit.errors import LocalKitError


@pytest.fixture
def held_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _alive(pids) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_head_whose_job_agent_never_answers_is_started_again(tmp_path: Path, held_port: int) -> None:
    notes: list[str] = []
    head = local_cluster.ray_head(2, tmp_path / "ray-head.log")
    head.agent_port = held_port
    head.agent_timeout_s = 8.0  # the held port never answers; the second start gets the normal wait

    def note(line: str) -> None:
        notes.append(line)
        first_pids.extend(head.seen)
        head.agent_timeout_s = local_cluster.AGENT_START_TIMEOUT_S

    first_pids: list[int] = []
    head.note = note
    try:
        head.start()
        assert head.agent_port != held_port
        assert head.attempts == ["its job agent did not answer within 8 s"]
        assert len(notes) == 1 and "starting it again on fresh ports" in notes[0], notes
        kept = tmp_path / "ray-head-logs" / "start-attempt-1"
        assert str(kept) in notes[0]
        assert "address already in use" in (kept / "dashboard_agent.log").read_text()
        assert (kept / "ray-start.log").is_file()
        # The first head is gone, the second one takes jobs.
        assert first_pids and not _alive(first_pids)
        from ray.job_submission import JobSubmissionClient

        assert JobSubmissionClient(head.dashboard_url, headers=head.headers).submit_job(entrypoint="true")
    finally:
        head.stop()
    assert not _alive(head.seen)
    assert not head.temp_dir.exists()


def test_a_head_that_never_gets_ready_is_one_sentence_naming_its_logs(tmp_path: Path, held_port: int,
                                                                       monkeypatch) -> None:
    monkeypatch.setattr(local_cluster, "HEAD_START_ATTEMPTS", 1)
    head = local_cluster.ray_head(2, tmp_path / "ray-head.log")
    head.agent_port = held_port
    head.agent_timeout_s = 5.0
    with pytest.raises(LocalKitError) as err:
        head.start()
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("the local Ray head did not start after 1 attempt (the last: its job agent did not answer")
    assert str(tmp_path / "ray-head-logs" / "start-attempt-1") in msg
    # Nothing of it runs and its temp dir is gone before the error reaches the caller.
    assert head.stopped is not None and not _alive(head.stopped.stopped)
    assert not head.temp_dir.exists()


def test_a_head_that_ran_a_job_stops_on_sigterm_without_a_kill(tmp_path: Path) -> None:
    """Ray 2.60's `ray start --block` drains its node on SIGTERM for up to RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S
    (30 s) before it stops anything, and a node that holds an actor (Ray Train's detached state actor after every
    job, here one of the job's own) never drains: the head outlived our grace, every process was SIGKILLed, and
    each demo run spent 31 s stopping (seen 2026-12-05). The local head has nothing to drain for."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    head = local_cluster.ray_head(2, tmp_path / "ray-head.log")
    try:
        head.start()
        client = JobSubmissionClient(head.dashboard_url, headers=head.headers)
        job = client.submit_job(entrypoint="python -c \"import ray; ray.init(); ray.remote(num_cpus=0)(type('Held', "
                                "(), {'ping': lambda self: 1})).options(name='held', lifetime='detached').remote(); "
                                "print('held')\"")
        status = None
        for _ in range(240):
            status = client.get_job_status(job)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                break
            time.sleep(0.5)
        assert status == JobStatus.SUCCEEDED, client.get_job_logs(job)
    finally:
        head.stop()
    stopped = head.stopped
    assert stopped is not None and stopped.killed == [], f"SIGKILLed after the grace: {stopped.killed}"
    assert not _alive(head.seen)
