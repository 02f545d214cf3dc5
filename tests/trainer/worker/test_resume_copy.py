"""trainer/worker/resume.py local_copy: every worker reads a remote checkpoint from a download of its own. Ray's
`Checkpoint.as_directory()` shares one download directory per checkpoint among a node's processes and downloads
again into it while another rank reads; a restart then found a good checkpoint "broken" (seen on the 2-worker
gs:// drill). Here two processes open one checkpoint (the same pickled object, as Ray Train hands it to every rank)
over and over at once, and verify every file against its manifest each time."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from tests.trainer.conftest import ROOT
from trainer.job import checkpoint_manifest
from trainer.job.runs import TRAINER_STATE_FILE
from trainer.worker.resume import local_copy

OPENS = 12
BIG_FILE_BYTES = 16 * 1024**2  # tokenizer.json is 33 MB: a copy takes long enough for the other rank to read

CHILD = """
import json, pickle, sys
from pathlib import Path
from trainer.job import checkpoint_manifest
from trainer.worker.resume import local_copy
checkpoint = pickle.loads(Path(sys.argv[1]).read_bytes())
problems, copies = [], set()
for _ in range(int(sys.argv[3])):
    with local_copy(checkpoint, Path(sys.argv[2])) as directory:
        problems.append(checkpoint_manifest.local_problem(directory))
        copies.add(str(directory))
print(json.dumps({"problems": [p for p in problems if p], "copies": sorted(copies)}))
"""


def remote_checkpoint(tmp_path: Path):
    """A checkpoint with its manifest, behind a filesystem Ray treats as remote (not pyarrow's LocalFileSystem)."""
    from ray.train import Checkpoint

    directory = tmp_path / "checkpoint-000002"
    directory.mkdir()
    (directory / "tokenizer.json").write_bytes(os.urandom(BIG_FILE_BYTES))
    (directory / TRAINER_STATE_FILE).write_text(json.dumps({"global_step": 2}))
    (directory / checkpoint_manifest.MANIFEST_FILE).write_bytes(
        checkpoint_manifest.manifest([checkpoint_manifest.entries(directory)], 2))
    assert checkpoint_manifest.local_problem(directory) is None
    return Checkpoint(path=str(directory), filesystem=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()))


@pytest.mark.slow
def test_two_ranks_opening_one_checkpoint_each_read_it_whole(tmp_path: Path) -> None:
    pickled = tmp_path / "checkpoint.pkl"
    pickled.write_bytes(pickle.dumps(remote_checkpoint(tmp_path)))
    ranks = [subprocess.Popen([sys.executable, "-c", CHILD, str(pickled), str(tmp_path / f"scratch-{rank}"),
                               str(OPENS)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    results = []
    for proc in ranks:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    assert [r["problems"] for r in results] == [[], []], [r["problems"][:2] for r in results]
    for rank, result in enumerate(results):
        assert all(c.startswith(str(tmp_path / f"scratch-{rank}")) for c in result["copies"]), result["copies"]
        assert not list((tmp_path / f"scratch-{rank}").iterdir())  # each copy removed on exit


def test_a_local_checkpoint_is_read_in_place(tmp_path: Path) -> None:
    from ray.train import Checkpoint

    with local_copy(Checkpoint.from_directory(str(tmp_path)), tmp_path / "scratch") as directory:
        assert directory == tmp_path
    assert not (tmp_path / "scratch").exists()
