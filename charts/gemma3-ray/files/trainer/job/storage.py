"""Where files live: gs:// or local storage, and the node cache that fetches once per node.

One pyarrow filesystem for gs:// (real GCS or an emulator) and local paths; a file lock per node keeps
the model and data downloads to one per node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainer.job.flags import TrainArguments, UsageError

# The fake GCS server (tests, demo): `http://host:port`; pyarrow then talks plain HTTP, anonymously.
STORAGE_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def run_root(args: TrainArguments) -> str:
    """The run's root: storage_path, else gs://<gcs_bucket>/<output_dir>, else ./<output_dir>."""
    if args.storage_path:
        return args.storage_path.rstrip("/")
    if args.gcs_bucket:
        return f"gs://{args.gcs_bucket}/{args.output_dir.strip('/')}"
    return str(Path(args.output_dir).resolve())


def filesystem(uri: str, emulator_host: str | None = None):
    """(pyarrow filesystem, path without scheme) for a gs:// URI or a local path."""
    import pyarrow.fs as pafs

    if uri.startswith("gs://"):
        path = uri[len("gs://") :]
        if emulator_host:
            scheme, _, host = emulator_host.rpartition("://")
            return pafs.GcsFileSystem(anonymous=True, endpoint_override=host, scheme=scheme or "http"), path
        return pafs.GcsFileSystem(), path
    if "://" in uri:
        raise UsageError(f"unsupported storage scheme in {uri!r}: use gs://bucket/prefix or a local path")
    return pafs.LocalFileSystem(), str(Path(uri).resolve())


@dataclass
class Storage:
    """Where the run's files go. Picklable: it travels to the Ray workers in the train config."""

    root: str
    emulator_host: str | None = None

    def fs(self):
        return filesystem(self.root, self.emulator_host)

    def uri(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_bytes(self, rel: str, data: bytes) -> None:
        fs, base = self.fs()
        path = f"{base}/{rel}"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(data)

    def read_bytes(self, rel: str) -> bytes | None:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        if fs.get_file_info(f"{base}/{rel}").type != pafs.FileType.File:
            return None
        with fs.open_input_stream(f"{base}/{rel}") as src:
            return src.read()

    def child(self, rel: str) -> Storage:
        return Storage(root=self.uri(rel), emulator_host=self.emulator_host)

    def exists(self, rel: str) -> bool:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        return fs.get_file_info(f"{base}/{rel}").type != pafs.FileType.NotFound

    def list_dir(self, rel: str) -> list[str]:
        """Names directly under `rel` (empty when it does not exist)."""
        import pyarrow.fs as pafs

        fs, base = self.fs()
        infos = fs.get_file_info(pafs.FileSelector(f"{base}/{rel}", allow_not_found=True))
        return sorted(Path(i.path).name for i in infos)

    def append(self, rel: str, data: bytes, local_copy: Path) -> None:
        """Append `data` to `rel`. GCS objects cannot grow, so on gs:// the whole local copy (which
        already ends with `data`) is uploaded in one write; on a file system the bytes are appended."""
        if self.root.startswith("gs://"):
            self.write_bytes(rel, local_copy.read_bytes())
            return
        fs, base = self.fs()
        path = f"{base}/{rel}"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_append_stream(path) as out:
            out.write(data)

    def move_dir(self, rel: str, to: str) -> None:
        """Move the directory `rel` to `to` (file by file: GCS has no directories to rename)."""
        import pyarrow.fs as pafs

        fs, base = self.fs()
        src = f"{base}/{rel}"
        for info in fs.get_file_info(pafs.FileSelector(src, recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File:
                dest = f"{base}/{to}/{info.path[len(src) + 1:]}"
                fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
                fs.copy_file(info.path, dest)
        if fs.get_file_info(src).type != pafs.FileType.NotFound:
            fs.delete_dir(src)

    def upload_dir(self, local: Path, rel: str) -> None:
        import pyarrow.fs as pafs

        fs, base = self.fs()
        fs.create_dir(f"{base}/{rel}", recursive=True)
        pafs.copy_files(str(local), f"{base}/{rel}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def storage_for(args: TrainArguments) -> Storage:
    """The release's storage root (runs live under it)."""
    return storage_at(run_root(args))


def storage_at(uri: str) -> Storage:
    return Storage(root=uri.rstrip("/"), emulator_host=os.environ.get(STORAGE_EMULATOR_ENV) if uri.startswith("gs://")
                   else None)


def cache_root(args: TrainArguments) -> Path:
    if args.cache_dir:
        return Path(args.cache_dir)
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
