"""The GPU driver rule: the NVIDIA driver the pinned torch needs against the one a GKE node gets.

The GPU driver rule, in one place: the NVIDIA driver the pinned torch's CUDA build needs, and the
driver a GKE node gets for its ``gpuDriverVersion`` (DEFAULT / LATEST).

The rule: ``torch==X.Y.*`` from ``trainer/requirements.txt`` -> its CUDA build (PyPI's default Linux
wheel; torch 2.11 is built with CUDA 13.0) -> the minimum driver branch that CUDA release needs
(CUDA 13.0: R580). torch 2.11 (cu130) therefore needs an NVIDIA driver >= 580 on every GPU node.

GKE installs the driver itself and picks the version from the node's Container-Optimized OS image
and the GPU type: DEFAULT and LATEST are labels, per COS release and GPU, of versions that image
supports. As GKE documents ("map the GKE version to the COS image and the GPU driver version"), the
GKE version maps to a COS image through ``gke-to-cos.json``, and that image's
``gpu_driver_versions.textproto`` (in the public ``cos-tools`` bucket) lists each GPU type's
supported versions with their DEFAULT and LATEST labels. ``resolve()`` follows exactly that path;
offline, the version is unknown and doctor says what to check.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gemma3_ray.utils.paths import REPO_ROOT

# torch minor version -> CUDA build of its default Linux wheel on PyPI.
TORCH_CUDA: dict[str, str] = {"2.11": "13.0"}
# CUDA release -> minimum NVIDIA driver branch on Linux (CUDA Toolkit release notes, "CUDA Toolkit and
# Corresponding Driver Versions"; minor-version compatibility within a major release).
CUDA_MIN_DRIVER: dict[str, int] = {"13.0": 580, "12.8": 570, "12.6": 560, "12.4": 550}

GKE_TO_COS_URL = "https://www.gstatic.com/gke-image-maps/gke-to-cos.json"
COS_DRIVERS_URL = "https://storage.googleapis.com/cos-tools/{build}/lakitu/gpu_driver_versions.textproto"
FETCH_TIMEOUT_S = 5.0
# GKE accelerator names whose COS GPU type is not simply the upper-cased name.
COS_GPU_TYPE = {"nvidia-tesla-a100": "NVIDIA_A100_40GB", "nvidia-a100-80gb": "NVIDIA_A100_80GB"}
_REQUIREMENTS = ("trainer/requirements.txt", "charts/gemma3-ray/files/trainer/requirements.txt")
_TORCH_PIN = re.compile(r"^torch==(\d+)\.(\d+)(?:\.\S*)?\s*$", re.M)


@dataclass(frozen=True)
class Requirement:
    torch: str
    cuda: str
    min_driver: int

    def text(self) -> str:
        return f"torch {self.torch} (CUDA {self.cuda} build) needs NVIDIA driver >= {self.min_driver}"


def requirement(root: Path | None = None) -> Requirement | None:
    """The driver the pinned torch needs (None: no requirements file, or a torch this table lacks)."""
    base = root or REPO_ROOT
    for rel in _REQUIREMENTS:
        path = base / rel
        if path.is_file():
            m = _TORCH_PIN.search(path.read_text(encoding="utf-8"))
            if not m:
                return None
            minor = f"{m.group(1)}.{m.group(2)}"
            cuda = TORCH_CUDA.get(minor)
            return Requirement(minor, cuda, CUDA_MIN_DRIVER[cuda]) if cuda else None
    return None


def cos_gpu_type(accelerator: str) -> str:
    return COS_GPU_TYPE.get(accelerator, accelerator.upper().replace("-", "_"))


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 - fixed https URLs
        return resp.read().decode("utf-8")


def cos_build_for(gke_version: str, gke_to_cos: str) -> str | None:
    """``cos-121-18867-199-28`` -> ``18867.199.28`` for the GKE version (gke-to-cos.json)."""
    version = gke_version.removeprefix("v")
    for entry in json.loads(gke_to_cos).get("entries", []):
        if entry.get("gke_version") == version:
            return ".".join(str(entry.get("image", "")).rsplit("-", 3)[-3:])
    return None


def labelled_versions(textproto: str, gpu_type: str) -> dict[str, str]:
    """{label: version} of one GPU type in a COS ``gpu_driver_versions.textproto``."""
    out: dict[str, str] = {}
    for block in re.split(r"gpu_driver_version_info\s*:?\s*\{", textproto)[1:]:
        m = re.search(r'gpu_type\s*:\s*"([^"]+)"', block)
        if not m or m.group(1) != gpu_type:
            continue
        for sub in re.finditer(r"supported_driver_versions\s*:?\s*\{([^{}]*)\}", block):
            version = re.search(r'version\s*:\s*"([^"]+)"', sub.group(1))
            label = re.search(r'label\s*:\s*"([^"]+)"', sub.group(1))
            if version and label:
                out[label.group(1).upper()] = version.group(1)
    return out


@dataclass(frozen=True)
class Resolved:
    version: str | None  # e.g. "580.82.07"; None when it could not be found out
    how: str  # where it came from, or why it is unknown

    @property
    def major(self) -> int | None:
        return int(self.version.split(".")[0]) if self.version else None


def resolve(gke_version: str, accelerator: str, label: str, fetch: Callable[[str], str] | None = None) -> Resolved:
    """The driver GKE installs for ``label`` (DEFAULT/LATEST) on a node of ``gke_version`` with that GPU."""
    fetch = fetch or _fetch
    label = label.upper()
    try:
        build = cos_build_for(gke_version, fetch(GKE_TO_COS_URL))
        if build is None:
            return Resolved(None, f"GKE {gke_version} is not in gke-to-cos.json")
        versions = labelled_versions(fetch(COS_DRIVERS_URL.format(build=build)), cos_gpu_type(accelerator))
    except (OSError, ValueError) as exc:
        return Resolved(None, f"the GKE/COS driver maps could not be read ({type(exc).__name__})")
    if label not in versions:
        return Resolved(None, f"COS {build} lists no {label} driver for {cos_gpu_type(accelerator)}")
    return Resolved(versions[label], f"{label} on GKE {gke_version} (COS {build}, {cos_gpu_type(accelerator)})")
