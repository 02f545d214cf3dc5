"""The shared real kube-apiserver (``../shared/kube-apiserver/apiserver.sh``: etcd + kube-apiserver on
127.0.0.1 with the KubeRay CRDs; no controllers, pods never run) for one test session."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

START_TIMEOUT_S = 180
HERE = Path(__file__).resolve()


def apiserver_script() -> Path | None:
    """$KUBE_APISERVER_DIR, else ../shared beside the checkout (as in CI), else /work/shared."""
    candidates = [Path(os.environ["KUBE_APISERVER_DIR"])] if os.environ.get("KUBE_APISERVER_DIR") else []
    candidates += [HERE.parents[3] / "shared" / "kube-apiserver", Path("/work/shared/kube-apiserver")]
    return next((c / "apiserver.sh" for c in candidates if (c / "apiserver.sh").is_file()), None)


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The admin kubeconfig of a fresh API server, stopped at the end of the session."""
    script = apiserver_script()
    if script is None or shutil.which("etcd") is None:
        pytest.fail("the real kube-apiserver (../shared/kube-apiserver) and etcd (make setup) are required")
    work = tmp_path_factory.mktemp("kube-apiserver")
    started = subprocess.run(["bash", str(script), "start", str(work)], capture_output=True, text=True,
                             timeout=START_TIMEOUT_S)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        yield work / "kubeconfig"
    finally:
        subprocess.run(["bash", str(script), "stop", str(work)], capture_output=True, timeout=60)


KUEUE_CRDS = ("kueue-crds", "v0.19.2")


@pytest.fixture(scope="session")
def kueue_crds(kube_apiserver: Path) -> Path:
    """The session's API server with Kueue v0.19.2's CRDs (../shared/kueue-crds) applied server-side,
    once: their schemas only, no Kueue controller or webhook. Returns the admin kubeconfig."""
    script = apiserver_script()
    assert script is not None
    folder = script.parents[1].joinpath(*KUEUE_CRDS)
    assert folder.is_dir(), f"no {folder}"
    kubectl(kube_apiserver, "apply", "--server-side", "-f", str(folder))
    wait_established(kube_apiserver, *(f"crd/{p.name.split('_', 1)[1].removesuffix('.yaml')}.kueue.x-k8s.io"
                                       for p in sorted(folder.glob("*.yaml"))))
    return kube_apiserver


def wait_established(kubeconfig: Path, *crds: str, timeout_s: float = 60) -> None:
    """`kubectl wait --for condition=established`, again while a CRD just applied has no conditions yet (kubectl
    then fails at once: `.status.conditions accessor error: <nil>`, seen on a loaded machine)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "wait", "--for", "condition=established",
                              f"--timeout={int(timeout_s)}s", *crds], capture_output=True, text=True, timeout=timeout_s + 30)
        if out.returncode == 0:
            return
        assert "accessor error" in out.stderr and time.monotonic() < deadline, out.stderr
        time.sleep(1)


def serve_kuberay(kubeconfig: Path, version: str) -> None:
    """Serve KubeRay `version`'s RayCluster and RayJob CRDs (v1.7.0, v1.5.0 or v1.4.2; tests/kuberay_crds.py)
    from now on, replacing the ones served before (server-side apply: the CRD's schema changes in place)."""
    from tests.kuberay_crds import crd_files

    files = [a for f in crd_files(version) for a in ("-f", str(f))]
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", *files)
    wait_established(kubeconfig, "crd/rayclusters.ray.io", "crd/rayjobs.ray.io")


def kubectl(kubeconfig: Path, *args: str, stdin: str | None = None) -> str:
    out = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], input=stdin, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def token_kubeconfig(admin: Path, token: str, path: Path, namespace: str) -> Path:
    """A kubeconfig for the same server that authenticates with a ServiceAccount token."""
    cfg = yaml.safe_load(admin.read_text())
    cfg["users"] = [{"name": "sa", "user": {"token": token}}]
    cfg["contexts"] = [{"name": "sa", "context": {"cluster": cfg["clusters"][0]["name"], "user": "sa",
                                                  "namespace": namespace}}]
    cfg["current-context"] = "sa"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path
