"""GKE's two public driver maps (gke-to-cos.json and a COS image's gpu_driver_versions.textproto),
served by a real HTTP server on 127.0.0.1 so doctor's driver check runs its real fetch-and-parse path
offline. The versions are test data shaped like the real files, not a claim about any GKE release."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from gemma3_ray.gke import gpu_driver

NEW_GKE = "1.33.5-gke.1080000"  # its COS image labels an R580 driver LATEST, R570 DEFAULT
OLD_GKE = "1.31.6-gke.1020000"  # its COS image tops out at R570
MAPS = {
    NEW_GKE: ("cos-121-18867-199-28", {"DEFAULT": "570.172.08", "LATEST": "580.82.07"}),
    OLD_GKE: ("cos-117-18613-164-4", {"DEFAULT": "535.230.02", "LATEST": "570.133.20"}),
}
GPU_TYPES = ("NVIDIA_H100_80GB", "NVIDIA_L4", "NVIDIA_B200")


def _textproto(labels: dict[str, str]) -> str:
    blocks = []
    for gpu in GPU_TYPES:
        versions = "".join(f'  supported_driver_versions {{\n    version: "{v}"\n    label: "{k}"\n  }}\n'
                           for k, v in labels.items())
        blocks.append(f'gpu_driver_version_info {{\n  gpu_device {{\n    gpu_type: "{gpu}"\n  }}\n{versions}}}\n')
    return "# gpu_driver_versions.textproto (test data)\n" + "".join(blocks)


@pytest.fixture
def driver_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = tmp_path / "maps"
    entries = []
    for gke, (image, labels) in MAPS.items():
        build = ".".join(image.rsplit("-", 3)[-3:])
        (root / "cos-tools" / build / "lakitu").mkdir(parents=True)
        (root / "cos-tools" / build / "lakitu" / "gpu_driver_versions.textproto").write_text(_textproto(labels))
        entries.append({"gke_version": gke, "image": image})
    (root / "gke-to-cos.json").write_text(json.dumps({"entries": entries, "creation_time": "2026-11-30T00:00:00Z"}))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(gpu_driver, "GKE_TO_COS_URL", f"{url}/gke-to-cos.json")
    monkeypatch.setattr(gpu_driver, "COS_DRIVERS_URL", f"{url}/cos-tools/{{build}}/lakitu/gpu_driver_versions.textproto")
    yield url
    server.shutdown()
    server.server_close()
