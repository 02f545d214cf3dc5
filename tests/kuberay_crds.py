"""Where the tests find each KubeRay version's official CRDs (ray.io_rayclusters.yaml, ray.io_rayjobs.yaml).

The versions the tests cover: 1.4.2 (the oldest the chart supports; what a managed add-on may still
serve), 1.5.0 (what `make e2e` runs by default) and 1.7.0 (the newest). 1.4.2 and 1.7.0 come from
../shared/kuberay-crds (the release tags' config/crd/bases, unchanged). 1.5.0 comes from the same
place the e2e part gets its CRDs: the ray-operator Go module at v1.5.0 (config/crd/bases), first from
`make e2e-parts`' cache (e2e/build/parts.sh copies them there), else from the Go module cache, which
`go mod download` fills from the machine's module proxy (GOPROXY), once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSIONS = ("v1.7.0", "v1.5.0", "v1.4.2")  # newest first
MODULE = "github.com/ray-project/kuberay/ray-operator"


def shared_dir() -> Path:
    """$KUBERAY_CRDS_DIR, else /work/shared/kuberay-crds, else shared/ beside the checkout (as in CI)."""
    env = os.environ.get("KUBERAY_CRDS_DIR")
    if env:
        return Path(env)
    for candidate in (Path("/work/shared/kuberay-crds"), ROOT.parent / "shared" / "kuberay-crds"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("KubeRay CRDs not found: set KUBERAY_CRDS_DIR to the folder holding v1.7.0/ and v1.4.2/")


def _from_parts(version: str) -> Path | None:
    cache_root = Path(os.environ.get("GEMMA3_RAY_CACHE", Path.home() / ".cache" / "gemma3-ray"))
    folder = cache_root / "parts" / f"kuberay-{version}" / "bin" / "crds"
    return folder if (folder / "ray.io_rayjobs.yaml").is_file() else None


def _from_go_module(version: str) -> Path | None:
    go = shutil.which("go")
    if not go:
        return None
    env = {**os.environ, "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local")}
    done = subprocess.run([go, "mod", "download", "-json", f"{MODULE}@{version}"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=ROOT, check=False)
    try:
        found = json.loads(done.stdout or "{}").get("Dir")
    except ValueError:
        return None
    folder = Path(found) / "config" / "crd" / "bases" if found else None
    return folder if folder and (folder / "ray.io_rayjobs.yaml").is_file() else None


@cache
def crd_folder(version: str) -> Path:
    """The folder holding `version`'s ray.io_rayclusters.yaml and ray.io_rayjobs.yaml."""
    shared = shared_dir() / version
    if (shared / "ray.io_rayjobs.yaml").is_file():
        return shared
    found = _from_parts(version) or _from_go_module(version)
    if found is None:
        raise FileNotFoundError(f"KubeRay {version}'s CRDs not found: put them in {shared} or run "
                                f"`go mod download {MODULE}@{version}` (or `make e2e-parts` with E2E_KUBERAY={version})")
    return found


def crd_files(version: str) -> list[Path]:
    """`version`'s RayCluster and RayJob CRD files (what the tests apply to the API server)."""
    folder = crd_folder(version)
    return [folder / "ray.io_rayclusters.yaml", folder / "ray.io_rayjobs.yaml"]
