"""The model's files on this node: a local directory as given, a gs:// copy, or a Hugging Face Hub download, each
made once per node (the node cache's lock). Runs on the workers (huggingface_hub is a worker package).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from trainer.job.flags import TrainArguments, UsageError
from trainer.job.node_cache import node_lock
from trainer.job.storage import cache_root, filesystem


def copy_from_gcs(uri: str, cache: Path, emulator_host: str | None) -> Path:
    """Copy a gs:// file or prefix into the node cache once; later calls reuse the copy."""
    import pyarrow.fs as pafs

    dest = cache / "gcs" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    with node_lock(cache, f"gcs:{uri}"):
        done = dest / ".complete"
        if not done.exists():
            fs, path = filesystem(uri, emulator_host)
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.NotFound:
                raise UsageError(f"{uri} does not exist")
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            if info.type == pafs.FileType.File:
                pafs.copy_files(path, str(dest / Path(path).name), source_filesystem=fs)
            else:
                pafs.copy_files(path, str(dest), source_filesystem=fs)
            done.touch()
    if (dest / Path(uri).name).is_file():
        return dest / Path(uri).name
    return dest


def fetch_model(args: TrainArguments, emulator_host: str | None = None) -> Path:
    """A local directory with the model and processor: as given, copied from gs://, or from the hub."""
    if Path(args.model_id).is_dir():
        return Path(args.model_id)
    cache = cache_root(args)
    if args.model_id.startswith("gs://"):
        return copy_from_gcs(args.model_id, cache, emulator_host)
    from huggingface_hub import snapshot_download

    with node_lock(cache, f"model:{args.model_id}"):
        return Path(
            snapshot_download(
                args.model_id,
                cache_dir=str(cache / "hub") if args.cache_dir else None,
                token=os.environ.get("HF_TOKEN"),
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.jinja", "*.txt"],
            )
        )
