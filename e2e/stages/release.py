"""The chart from a registry (`--only release`): pushed by `gemma3-ray release --apply`, installed by digest, SUCCEEDED.

The registry is distribution's (e2e/cluster/registry.sh, the `registry` part), started on this machine for the
stage and stopped on every exit of it: only helm here pulls the chart, the nodes never do, so the install needs
it and the run does not. The chart is signed by a throwaway GnuPG key made in the run's output folder when gpg
is installed: `helm pull --version … --verify` checks the pushed provenance and must print the digest installed
(Helm cannot --verify a digest reference itself: helm/helm#32546).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from e2e.support.errors import StageError
from e2e.support.harness import CHART, OUT, ROOT, Harness, run_script
from e2e.support.session import run_name
from e2e.support.signing_key import throwaway_key

NAMESPACE = run_name("g3r-e2e-oci")
RELEASE = "e2e-oci"
REGISTRY_SH = ROOT / "e2e" / "cluster" / "registry.sh"
DIGEST = re.compile(r"^Digest: (sha256:[0-9a-f]{64})$", re.MULTILINE)
INSTALL = re.compile(r"^  helm install gemma3-ray (oci://\S+@sha256:[0-9a-f]{64})", re.MULTILINE)


def _gemma3_ray_release(h: Harness, registry: str, signing: list[str], dest: str) -> str:
    """`gemma3-ray release --apply` as a user runs it (this checkout's plugin, the run's helm); its output."""
    argv = [sys.executable, "-m", "gemma3_ray", "release", "--registry", registry, "--plain-http", *signing,
            "--destination", dest, "--apply"]
    env = {"HELM_BIN": h.kube.helm, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "plugin"),
                                                                               os.environ.get("PYTHONPATH")]))}
    return run_script(argv, OUT / "release.log", 300, "gemma3-ray release --apply", env=env)


def _verified(h: Harness, chart: str, digest: str, pubring: Path, dest: Path) -> None:
    """`helm pull --verify` by version against the key's provenance; the digest it pulled must be ``digest``."""
    version = re.search(r"^version: (\S+)$", h.kube.h("show", "chart", str(CHART), timeout=60).stdout, re.MULTILINE)
    dest.mkdir(parents=True, exist_ok=True)
    proc = h.kube.h("pull", chart, "--version", version.group(1) if version else "", "--plain-http", "--verify",
                    "--keyring", str(pubring), "-d", str(dest), timeout=120, check=False)
    said = proc.stdout + proc.stderr
    if proc.returncode != 0 or f"Digest: {digest}" not in said:
        raise StageError(f"helm pull {chart} --verify: {said.strip()[-400:]!r} (wanted a verified chart of {digest})")


def installed_by_digest(h: Harness) -> str:
    folder = h.out_dir / "release"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    key = throwaway_key(folder, "gemma3-ray e2e") if shutil.which("gpg") else None
    signing = ["--key", key.name, "--keyring", str(key.secring)] if key else []
    started = run_script([str(REGISTRY_SH), "start", str(folder / "registry")], OUT / "registry.log", 120,
                         "registry start")
    host = started.strip().splitlines()[-1].removeprefix("E2E_REGISTRY=")
    try:
        out = _gemma3_ray_release(h, f"oci://{host}/{run_name('e2e')}", signing, str(folder / "dist"))
        digest, line = DIGEST.search(out), INSTALL.search(out)
        if not digest or not line or not line.group(1).endswith(digest.group(1)):
            raise StageError(f"gemma3-ray release --apply printed no digest and install line: {out[-600:]!r}")
        ref = line.group(1)
        if key:
            _verified(h, ref.split("@", 1)[0], digest.group(1), key.pubring, folder / "verified")
        h.namespace(NAMESPACE)
        run = h.helm_install(RELEASE, NAMESPACE, chart=ref, extra=["--plain-http"])
    finally:
        run_script([str(REGISTRY_SH), "stop", str(folder / "registry")], OUT / "registry.log", 60, "registry stop")
    meta = h.kube.h("show", "chart", str(CHART), timeout=60).stdout
    version = re.search(r"^version: (\S+)$", meta, re.MULTILINE)
    deployed = h.kube.h("list", "-n", NAMESPACE, "--filter", f"^{RELEASE}$", "-o", "json", timeout=60).stdout
    if not version or f'"chart":"gemma3-ray-{version.group(1)}"' not in deployed.replace(" ", ""):
        raise StageError(f"release {NAMESPACE}/{RELEASE} is not chart gemma3-ray {version and version.group(1)}: "
                         f"{deployed[-300:]!r}")
    h.runs["oci"] = run
    h.record.facts["release_oci"] = {"ref": ref, "verified": bool(key), "rayjob": run.rayjob}
    return f"{ref} ({'provenance verified' if key else 'unsigned: no gpg here'}): RayJob {run.rayjob}"


def succeeded(h: Harness) -> str:
    run = h.runs["oci"]
    h.wait_run(run)
    h.uninstall(RELEASE, NAMESPACE)  # frees the node for the stages after
    return f"RayJob {run.rayjob} SUCCEEDED; uninstalled"
