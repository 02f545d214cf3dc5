"""No pod can run (issue #19, failure 4): on the bare real API server — no kubelet, no scheduler, no
KubeRay operator and no stand-ins — `helm upgrade`, `helm rollback` and `helm uninstall` each end
within a bound, with Helm 4 and Helm 3, and leave exactly the revision's RayJob (after uninstall:
nothing of the release). A lifecycle step that needed a pod (a hook Job) would wait for it until
Helm's timeout and leave the release `pending-*`.

The bound is the subprocess timeout of each helm command (it is not a speed measurement: helm runs
no pod and waits on nothing here, so any hang is a design fault, not slowness).
"""

from __future__ import annotations

import subprocess

import pytest
from helm_render import CHART, CI_VALUES_DIR, helm_bin
from kube_api import ApiServer
from release_state import BASELINE, snapshot

RELEASE = "bare"
FULLNAME = f"{RELEASE}-gemma3-ray"
BOUND_S = 60


def helm_bounded(api: ApiServer, bin_: str, *args: str) -> str:
    try:
        proc = subprocess.run([bin_, *args], capture_output=True, text=True, env=api.env(), timeout=BOUND_S,
                              check=False)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"helm {' '.join(args[:2])} did not end within {BOUND_S} s with no pod able to run: "
                             f"{(exc.stderr or b'')[-500:]!r}") from None
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr[-2000:]}"
    return proc.stdout


def release_left(api: ApiServer, ns: str) -> set[tuple[str, str]]:
    return {(k, n) for k, n in snapshot(api, ns).all() - BASELINE}


@pytest.mark.parametrize("helm_var", ["HELM", "HELM3"])
def test_upgrade_rollback_uninstall_end_without_any_pod(apiserver: ApiServer, helm_var: str) -> None:
    apiserver.use_crds("v1.7.0")
    ns = apiserver.namespace(f"bare-{helm_var.lower()}")
    bin_ = helm_bin(helm_var)
    common = ["-n", ns]
    helm_bounded(apiserver, bin_, "install", RELEASE, str(CHART), *common, "-f", str(CI_VALUES_DIR / "default-values.yaml"))
    assert len(snapshot(apiserver, ns).names("RayJob")) == 1

    helm_bounded(apiserver, bin_, "upgrade", RELEASE, str(CHART), *common, "--reuse-values",
                 "--set", "training.learning_rate=0.0001")
    assert snapshot(apiserver, ns).names("RayJob") == {f"{FULLNAME}-r2"}, "Helm replaced revision 1's RayJob"

    helm_bounded(apiserver, bin_, "rollback", RELEASE, "1", *common)
    assert snapshot(apiserver, ns).names("RayJob") == {f"{FULLNAME}-r1"}, "the rollback re-applied revision 1's"

    out = helm_bounded(apiserver, bin_, "uninstall", RELEASE, *common)
    assert "uninstalled" in out
    assert release_left(apiserver, ns) == set(), "nothing of the release is left, its RayJobs included"

