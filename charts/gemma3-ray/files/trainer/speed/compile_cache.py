"""Triton's compile cache kept on the release's storage, so a restart or a later job skips the first step's compiles.

A fresh pod compiles every Triton kernel it runs (Liger's, the fused LoRA layers') during its first step:
outside the project, the same job twice on one GPU machine, the second with the first's cache (13 MB), took
105.6 s and 80.5 s from launch to the end of its first step. The training image cannot carry the cache
(building it needs the GPU), and the pod's disk goes with the pod, so the cache lives beside the runs:
`<storage root>/compile-cache/<triton, torch and GPU architecture>.tar`. Each worker unpacks it into its
node-local cache directory before the first compile and points Triton there (`TRITON_CACHE_DIR`); rank 0
stores it again after the first optimizer step when that step compiled something new. Kernels are files
named by their content's hash, so an older or a concurrent copy is never wrong, only less complete.
"""

from __future__ import annotations

import io
import os
import re
import tarfile
import time
from pathlib import Path
from typing import Any

CACHE_ENV = "TRITON_CACHE_DIR"
PREFIX = "compile-cache"


def cache_key() -> str:
    """The versions a compiled kernel depends on: Triton, torch and the GPU's architecture."""
    import torch
    import triton

    arch = "sm{}{}".format(*torch.cuda.get_device_capability()) if torch.cuda.is_available() else "cpu"
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"triton-{triton.__version__}-torch-{torch.__version__}-{arch}")


def _files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.is_dir() else 0


def restore(storage, local_root: Path, key: str) -> dict[str, Any]:
    """Unpack `<storage>/compile-cache/<key>.tar` into `local_root/<key>` and point Triton at it (unless the
    environment already names a cache directory). Returns what it did."""
    t0 = time.perf_counter()
    if os.environ.get(CACHE_ENV):
        return {"dir": os.environ[CACHE_ENV], "restored_files": 0, "note": f"{CACHE_ENV} set by the environment"}
    local = local_root / key
    local.mkdir(parents=True, exist_ok=True)
    data = storage.read_bytes(f"{PREFIX}/{key}.tar")
    if data:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar.getmembers():  # kernels only: plain files under the cache directory
                if member.isfile() and not member.name.startswith(("/", "..")) and ".." not in Path(member.name).parts:
                    target = local / member.name
                    if not target.exists():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        tmp = target.with_name(f".{target.name}.{os.getpid()}")
                        tmp.write_bytes(tar.extractfile(member).read())
                        os.replace(tmp, target)  # atomic: workers of one node may unpack at once
    os.environ[CACHE_ENV] = str(local)
    return {"dir": str(local), "restored_files": _files(local) if data else 0, "stored_bytes": len(data or b""),
            "s": round(time.perf_counter() - t0, 2)}


def save(storage, local: Path, key: str, known_files: int) -> dict[str, Any]:
    """Store `local` as `<storage>/compile-cache/<key>.tar` when it holds more files than it was restored with."""
    files = _files(local)
    if files <= known_files:
        return {"stored": False, "files": files}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path in sorted(p for p in local.rglob("*") if p.is_file() and not p.name.startswith(".")):
            tar.add(path, arcname=str(path.relative_to(local)))
    storage.write_bytes(f"{PREFIX}/{key}.tar", buf.getvalue())
    return {"stored": True, "files": files, "bytes": buf.tell()}


def keep_on_storage(args, trainer) -> dict[str, Any]:
    """restore() now; save() from rank 0 after the first optimizer step (a callback on `trainer`)."""
    from transformers import TrainerCallback

    from trainer.job.storage import cache_root, storage_for

    store, key = storage_for(args), cache_key()
    report = restore(store, cache_root(args) / PREFIX, key)
    if report.get("note") or trainer is None:
        return report
    local, known = Path(report["dir"]), report["restored_files"]

    class SaveAfterFirstStep(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            if state.global_step == 1 and targs.process_index == 0:
                try:
                    report["saved"] = save(store, local, key, known)
                except Exception as e:  # a cache that cannot be stored costs the next job its compiles, nothing more
                    report["saved"] = {"stored": False, "error": f"{type(e).__name__}: {str(e)[:200]}"}
                print(f"[trainer] compile cache after step 1: {report['saved']}", flush=True)

    trainer.add_callback(SaveAfterFirstStep())
    return report


def on(args) -> bool:
    """Before the first Triton compile: a GPU worker with Triton kernels (fused LoRA or Liger's)."""
    return bool(args.use_gpu and (args.fused_lora or args.use_liger_kernel))


def lever(run) -> dict[str, Any]:
    try:
        return keep_on_storage(run.args, run.trainer)
    except Exception as e:  # without the cache the first step compiles, as before
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}
