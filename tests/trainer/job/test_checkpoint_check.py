"""A checkpoint is intact only if its manifest verifies (#21, #19.8): the driver's resume line names the
newest intact checkpoint, passing over one with any file a resume reads missing, cut short or changed in
place (a same-size bit flip that torch.load still reads), and says why; when none is intact the job stops
before anything starts. The broken ones are moved out of Ray Train's registry and directory, so a retrained
step never writes into them and the registry lists only what exists. No Ray: the driver's plan."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trainer.job import checkpoint_manifest, runs
from trainer.job.arguments import parse_args
from trainer.job.flags import UsageError
from trainer.job.runs import checkpoint_problem, plan_run, quarantine, registered_checkpoints
from trainer.job.storage import Storage, storage_for
from trainer.worker.resume import load_problem

CPU = ["--use_gpu=false", "--quantization=none"]
STEPS = (2, 4)
# Every file a resume reads: adapter weights and config, optimizer, scheduler, trainer state, RNG states.
RESUME_FILES = ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt",
                runs.TRAINER_STATE_FILE, "rng_state_0.pth", "rng_state_1.pth")


def write_checkpoint(directory: Path, step: int) -> Path:
    """A checkpoint as two workers save it (rank 0: adapter, optimizer, scheduler, state; each rank its RNG
    state), with the manifest rank 0 writes last."""
    directory.mkdir(parents=True)
    (directory / runs.TRAINER_STATE_FILE).write_text(json.dumps({"global_step": step}))
    torch.save({"state": {0: {"exp_avg": torch.ones(256)}}}, directory / "optimizer.pt")
    torch.save({"base_lrs": [5e-3], "last_epoch": step}, directory / "scheduler.pt")
    save_file({"lora_A": torch.ones(16, 32)}, str(directory / "adapter_model.safetensors"))
    (directory / "adapter_config.json").write_text(json.dumps({"r": 16}))
    for rank in (0, 1):
        torch.save({"python": rank, "torch": torch.get_rng_state()}, directory / f"rng_state_{rank}.pth")
    (directory / checkpoint_manifest.MANIFEST_FILE).write_bytes(
        checkpoint_manifest.manifest([checkpoint_manifest.entries(directory)], step))
    return directory


def register(checkpoints: Path, names: list[str]) -> None:
    """Ray Train's snapshot of the checkpoints it registered, every field Ray 2.60 writes."""
    results = [{"version": 0, "checkpoint_dir_name": n, "metrics": {"step": i}} for i, n in enumerate(names)]
    (checkpoints / runs.RAY_CHECKPOINT_SNAPSHOT).write_text(json.dumps({
        "ray_version": "2.60.0", "checkpoint_results": results, "checkpoint_report_indices": list(range(len(names))),
        "latest_checkpoint_result": results[-1], "pending_training_results": [], "pending_validation_specs": [],
        "current_report_index": len(names), "validated_checkpoint_dir_names": [],
        "timed_out_validation_checkpoint_dir_names": [], "failed_validation_checkpoint_dir_names": []}))


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_bit(path: Path) -> None:
    """One bit in the middle of the largest tensor of a torch.save file (its zip member data/N, stored
    uncompressed): the same size, and torch.load still reads it."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        member = max((m for m in archive.infolist() if "/data/" in m.filename), key=lambda m: m.file_size)
    name_len, extra_len = struct.unpack("<HH", data[member.header_offset + 26: member.header_offset + 30])
    start = member.header_offset + 30 + name_len + extra_len
    data[start + member.file_size // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def run(tmp_path: Path) -> tuple[Path, dict[int, Path]]:
    """A run with two checkpoints Ray Train registered (its snapshot), both intact."""
    checkpoints = tmp_path / runs.RUNS_DIR / "r1" / runs.CHECKPOINTS_DIR
    dirs = {s: write_checkpoint(checkpoints / f"checkpoint-{s:06d}", s) for s in STEPS}
    register(checkpoints, [d.name for d in dirs.values()])
    return tmp_path, dirs


def plan(root: Path, *extra: str):
    args = parse_args([*CPU, f"--storage_path={root}", "--run_name=r1", *extra])
    return plan_run(args, storage_for(args))


def test_an_intact_newest_checkpoint_is_named(run) -> None:
    root, dirs = run
    assert checkpoint_problem(str(dirs[4]), None) is None and load_problem(dirs[4]) is None
    assert plan(root).log_line == f"resuming r1 from step 4 (restart of this run: its newest checkpoint {dirs[4]})"


@pytest.mark.parametrize("damage", ["missing", "cut short"])
@pytest.mark.parametrize("name", RESUME_FILES)
def test_a_newest_checkpoint_with_a_file_missing_or_cut_short_is_passed_over_and_said(run, name: str,
                                                                                       damage: str) -> None:
    """#19.8: with the adapter removed every retry failed in transformers until max_failures."""
    root, dirs = run
    if damage == "missing":
        (dirs[4] / name).unlink()
        problem = f"{name}: missing (its manifest lists it)"
    else:
        cut_short(dirs[4] / name)
        problem = f"{name}: {(dirs[4] / name).stat().st_size} bytes, its manifest says "
    assert (checkpoint_problem(str(dirs[4]), None) or "").startswith(problem)
    assert (load_problem(dirs[4]) or "").startswith(problem)  # the workers' check, on what they download
    line = plan(root).log_line
    assert line.startswith(f"resuming r1 from step 2 (restart of this run: its newest intact checkpoint {dirs[2]}; "
                           f"{dirs[4]} ({problem}"), line
    assert line.endswith(") does not load)")


def test_a_bit_flip_that_torch_still_loads_is_detected(run) -> None:
    """#21: a same-size bit flip in optimizer.pt passed torch.load (17 values changed) and was resumed."""
    root, dirs = run
    before = torch.load(dirs[4] / "optimizer.pt")["state"][0]["exp_avg"]
    flip_a_bit(dirs[4] / "optimizer.pt")
    after = torch.load(dirs[4] / "optimizer.pt")["state"][0]["exp_avg"]  # still loads ...
    assert not torch.equal(before, after)  # ... other values
    problem = "optimizer.pt: its sha256 differs from its manifest's (the file changed after it was saved)"
    assert checkpoint_problem(str(dirs[4]), None) == problem and load_problem(dirs[4]) == problem
    assert plan(root).resume_checkpoint is None and plan(root).log_line.startswith(
        f"resuming r1 from step 2 (restart of this run: its newest intact checkpoint {dirs[2]}; {dirs[4]} ({problem})")


def edit_manifest(directory: Path, change) -> None:
    """The checkpoint's manifest rewritten by `change(manifest)`: still JSON, its entries wrong."""
    path = directory / checkpoint_manifest.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def outside(manifest: dict, name: str, directory: Path) -> None:
    """An entry naming a file outside the checkpoint (a real file, with its true size and hashes)."""
    target = directory.parent / "outside.pt"
    target.write_bytes(b"not part of any checkpoint")
    manifest["files"][name.format(target=target)] = checkpoint_manifest.entries(directory.parent)["outside.pt"]


WRONG_ENTRIES = {
    "no size": (lambda m, d: m["files"]["optimizer.pt"].pop("size"), "files['optimizer.pt']: no 'size'"),
    "size as text": (lambda m, d: m["files"]["optimizer.pt"].update(size=str(m["files"]["optimizer.pt"]["size"])),
                     "files['optimizer.pt'].size: "),
    "negative size": (lambda m, d: m["files"]["optimizer.pt"].update(size=-1), "files['optimizer.pt'].size: -1 is "),
    "sha256 a number": (lambda m, d: m["files"]["scheduler.pt"].update(sha256=7), "files['scheduler.pt'].sha256: 7"),
    "sha256 cut": (lambda m, d: m["files"]["scheduler.pt"].update(sha256=m["files"]["scheduler.pt"]["sha256"][:9]),
                   "files['scheduler.pt'].sha256: "),
    "no md5": (lambda m, d: m["files"][runs.TRAINER_STATE_FILE].pop("md5"), "no 'md5'"),
    "entry a list": (lambda m, d: m["files"].update({"optimizer.pt": [1, 2]}), "files['optimizer.pt']: not a JSON"),
    "files a list": (lambda m, d: m.update(files=list(m["files"])), "files: not a JSON object"),
    "other format": (lambda m, d: m.update(format=99), "format: 99 is not"),
    "no trainer state": (lambda m, d: m["files"].pop(runs.TRAINER_STATE_FILE), runs.TRAINER_STATE_FILE),
    "parent path": (lambda m, d: outside(m, "../outside.pt", d), "files key: \"../outside.pt\" is not"),
    "absolute path": (lambda m, d: outside(m, "{target}", d), "files key: \"/"),
    "sub path": (lambda m, d: outside(m, "sub/../../outside.pt", d), "files key: \"sub/../../outside.pt\" is not"),
    "only other keys": (lambda m, d: (m.clear(), m.update(x=1)), "no 'format'"),
}


@pytest.mark.parametrize("case", WRONG_ENTRIES)
def test_a_manifest_whose_entries_are_wrong_marks_the_checkpoint_broken(run, case: str) -> None:
    """#27.10: a manifest that parses but lies (a key missing, a wrong type, a path outside the checkpoint)
    crashed the driver with a KeyError on every retry, or verified a file that is not the checkpoint's."""
    root, dirs = run
    change, problem = WRONG_ENTRIES[case]
    edit_manifest(dirs[4], lambda m: change(m, dirs[4]))
    found = checkpoint_problem(str(dirs[4]), None) or ""
    assert found.startswith("manifest.json: ") and problem in found, found
    assert load_problem(dirs[4]) == found  # the workers' check, on what they download
    line = plan(root).log_line
    assert line.startswith(f"resuming r1 from step 2 (restart of this run: its newest intact checkpoint {dirs[2]}; "
                           f"{dirs[4]} ({found}) does not load"), line


def test_a_checkpoint_without_its_manifest_is_not_intact(run) -> None:
    """An upload cut short before rank 0 wrote the manifest (or a checkpoint of before #21)."""
    root, dirs = run
    (dirs[4] / checkpoint_manifest.MANIFEST_FILE).unlink()
    assert checkpoint_problem(str(dirs[4]), None) == ("no manifest.json (a checkpoint is intact only when its "
                                                      "manifest verifies)")
    assert plan(root).log_line.startswith(f"resuming r1 from step 2 (restart of this run: its newest intact "
                                          f"checkpoint {dirs[2]}")


def test_no_intact_checkpoint_stops_before_anything_starts(run) -> None:
    root, dirs = run
    (dirs[4] / "adapter_model.safetensors").unlink()
    flip_a_bit(dirs[2] / "optimizer.pt")
    with pytest.raises(UsageError, match=rf"^no checkpoint of run r1 loads: {dirs[4]} \(adapter_model.safetensors: "
                                         rf"missing .*; {dirs[2]} \(optimizer.pt: its sha256 differs.*; continue from "
                                         r"a good one with --resume_from=<checkpoint path> in a new run$"):
        plan(root)


def test_resume_from_a_broken_checkpoint_path_is_refused(run) -> None:
    root, dirs = run
    cut_short(dirs[4] / "adapter_model.safetensors")
    with pytest.raises(UsageError, match=rf"resume_from: checkpoint {dirs[4]} does not load \(adapter_model"):
        plan(root, "--run_name=r2", f"--resume_from={dirs[4]}")
    assert plan(root, "--run_name=r2", f"--resume_from={dirs[2]}").resume_checkpoint == str(dirs[2])


def test_broken_checkpoints_leave_the_registry_and_a_retrained_step_gets_a_fresh_directory(run) -> None:
    """#21: the step retrained after a fallback was written into the broken checkpoint's directory, which
    Ray's retention later deleted while the snapshot still listed it (4, 6, 8 listed; 6, 8 existed)."""
    from trainer.worker.metrics import RunReporter

    root, dirs = run
    flip_a_bit(dirs[4] / "optimizer.pt")
    planned = plan(root)
    assert planned.broken == [{"checkpoint": str(dirs[4]), "problem": checkpoint_problem(str(dirs[4]), None)}]
    storage = planned.storage
    quarantine(storage, planned.broken)  # the driver, before Ray Train restores the run
    assert registered_checkpoints(storage) == [(2, str(dirs[2]))]
    snapshot = json.loads((dirs[2].parent / runs.RAY_CHECKPOINT_SNAPSHOT).read_text())
    assert snapshot["latest_checkpoint_result"]["checkpoint_dir_name"] == dirs[2].name
    assert snapshot["checkpoint_report_indices"] == [0]
    assert not dirs[4].exists() and (storage_path := Path(storage.root) / runs.BROKEN_DIR / dirs[4].name).is_dir()
    assert sorted(p.name for p in storage_path.iterdir()) == sorted([*RESUME_FILES, "manifest.json"])
    for _, uri in registered_checkpoints(storage):
        assert Path(uri).is_dir()  # the registry lists only what exists
    reporter = RunReporter(storage, 0, 8, root / "tb", root, 2)
    assert reporter._checkpoint_name(4) == "checkpoint-000004"  # free again
    (dirs[2].parent / "checkpoint-000004").mkdir()  # a broken one a worker passed over within a job
    assert reporter._checkpoint_name(4) == "checkpoint-000004-1"
    assert runs.CHECKPOINT_NAME_PATTERN.fullmatch("checkpoint-000004-1").group(1) == "000004"


def test_a_changed_gcs_object_is_detected_from_its_metadata(run, fake_gcs) -> None:
    """On gs:// the driver compares each object's md5 (its metadata) with the manifest: nothing downloaded."""
    from tests.trainer.conftest import GCS_BUCKET

    _, dirs = run
    bucket = Storage(f"gs://{GCS_BUCKET}/manifest-check", fake_gcs)
    bucket.upload_dir(dirs[4], "checkpoint-000004")
    uri = bucket.uri("checkpoint-000004")
    assert checkpoint_problem(uri, fake_gcs) is None
    flip_a_bit(dirs[4] / "optimizer.pt")
    bucket.write_bytes("checkpoint-000004/optimizer.pt", (dirs[4] / "optimizer.pt").read_bytes())
    assert checkpoint_problem(uri, fake_gcs) == ("optimizer.pt: its md5 differs from its manifest's (the object "
                                                 "changed after it was saved)")
