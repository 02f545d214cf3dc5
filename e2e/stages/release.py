"""The chart from a registry (`--only release`): pushed by `gemma3-ray release --apply`, installed by digest, SUCCEEDED.

The registry is distribution's (e2e/cluster/registry.sh, the `registry` part), started on this machine for the
stage and stopped on every exit of it: only helm here pulls the chart, the nodes never do, so the install needs
it and the run does not. The chart is signed by a throwaway GnuPG key made in the run's output folder when gpg
is installed: `helm pull --version … --verify` checks the pushed provenance and must print the digest installed
(Helm cannot --verify a digest reference itself: helm/helm#32546).
"""

from __future__ import annotations

import json
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
UPGRADE_NS = run_name("g3r-e2e-upgrade")
UPGRADE_RELEASE = "e2e-up"
RELEASES = ROOT / "charts" / "releases"  # the released versions' artifacts (charts/gemma3-ray/CHANGELOG.md)
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


def _registry(h: Harness, name: str) -> tuple[Path, str]:
    """A fresh folder of the run's output and a registry started in it (registry.sh stop it on every exit)."""
    folder = h.out_dir / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    started = run_script([str(REGISTRY_SH), "start", str(folder / "registry")], OUT / "registry.log", 120,
                         "registry start")
    return folder, started.strip().splitlines()[-1].removeprefix("E2E_REGISTRY=")


def _stop(folder: Path) -> None:
    run_script([str(REGISTRY_SH), "stop", str(folder / "registry")], OUT / "registry.log", 60, "registry stop")


def installed_by_digest(h: Harness) -> str:
    folder, host = _registry(h, "release")
    try:
        key = throwaway_key(folder, "gemma3-ray e2e") if shutil.which("gpg") else None
        signing = ["--key", key.name, "--keyring", str(key.secring)] if key else []
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
        _stop(folder)
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


def _previous() -> Path:
    """The newest released artifact older than this chart's version (charts/releases/gemma3-ray-X.Y.Z.tgz)."""
    def key(p: Path) -> tuple[int, ...]:
        return tuple(int(x) for x in p.name.removeprefix("gemma3-ray-").removesuffix(".tgz").split("."))
    found = sorted(RELEASES.glob("gemma3-ray-*.tgz"), key=key)
    if not found:
        raise StageError(f"no released chart in {RELEASES}: nothing to upgrade from")
    return found[-1]


def _push(h: Harness, tgz: Path, repo: str) -> str:
    """`helm push` of a packaged chart; its oci://…@sha256 reference."""
    out = h.kube.h("push", str(tgz), repo, "--plain-http", timeout=120, what=f"helm push {tgz.name}")
    said = out.stdout + out.stderr
    digest = DIGEST.search(said)
    if not digest:
        raise StageError(f"helm push {tgz.name} printed no digest: {said[-300:]!r}")
    name = tgz.name.removesuffix(".tgz").rsplit("-", 1)[0]
    return f"{repo.removeprefix('oci://')}/{name}@{digest.group(1)}"


def upgrade_from_previous(h: Harness) -> str:
    """The previous released chart (its artifact, pushed to the registry) installed by digest and its job running;
    `gemma3-ray values --check` passes the e2e values written for it; then `helm upgrade` to this chart, pushed by
    `gemma3-ray release --apply`: as the chart README's rule says, a new RayJob and run SUCCEED, the previous
    version's RayJob and its cluster are gone, and the ServiceAccount is the same object."""
    from e2e.stages.day_two import _cluster_of, _pods
    from e2e.support.harness import VALUES

    previous = _previous()
    old_version = previous.name.removeprefix("gemma3-ray-").removesuffix(".tgz")
    check = h.kube.run(["gemma3-ray", "values", "--check", str(VALUES), "--for-chart-version", old_version],
                       what="gemma3-ray values --check", timeout=120)
    folder, host = _registry(h, "release-upgrade")
    try:
        repo = f"oci://{host}/{run_name('e2e-up')}"
        old_ref = "oci://" + _push(h, previous, repo)
        new = _gemma3_ray_release(h, repo, [], str(folder / "dist"))
        line = INSTALL.search(new)
        if not line:
            raise StageError(f"gemma3-ray release --apply printed no install line: {new[-400:]!r}")
        h.namespace(UPGRADE_NS)
        first = h.helm_install(UPGRADE_RELEASE, UPGRADE_NS, chart=old_ref, extra=["--plain-http"])
        h.kube.wait_for(f"{first.rayjob} RUNNING", lambda: ((h.kube.get("rayjob", first.rayjob, UPGRADE_NS) or {})
                                                            .get("status") or {}).get("jobStatus") == "RUNNING",
                        600, UPGRADE_NS)
        sa = h.kube.items("serviceaccounts", UPGRADE_NS, f"app.kubernetes.io/instance={UPGRADE_RELEASE}")
        old_cluster = _cluster_of(h.kube.get("rayjob", first.rayjob, UPGRADE_NS) or {})
        second = h.helm_install(UPGRADE_RELEASE, UPGRADE_NS, upgrade=True, chart=line.group(1), extra=["--plain-http"])
    finally:
        _stop(folder)
    if second.rayjob == first.rayjob or second.run_name == first.run_name:
        raise StageError(f"the upgrade kept RayJob {first.rayjob} / run {first.run_name}: the rule is a new run")
    h.wait_run(second)
    left = [f"rayjob/{first.rayjob}"] if h.kube.get("rayjob", first.rayjob, UPGRADE_NS) else []
    left += [f"pod/{p['metadata']['name']}" for p in _pods(h, UPGRADE_NS, old_cluster)] if old_cluster else []
    if left:
        raise StageError(f"after the upgrade from {old_version}, its objects remain: {left}")
    sa_now = h.kube.items("serviceaccounts", UPGRADE_NS, f"app.kubernetes.io/instance={UPGRADE_RELEASE}")
    if not sa or [a["metadata"]["uid"] for a in sa] != [a["metadata"]["uid"] for a in sa_now]:
        raise StageError("the release's ServiceAccount is not the same object after the upgrade")
    listed = json.loads(h.kube.h("list", "-n", UPGRADE_NS, "--filter", f"^{UPGRADE_RELEASE}$", "-o", "json",
                                 timeout=60).stdout or "[]")
    chart = listed[0].get("chart", "?") if listed else "?"
    h.uninstall(UPGRADE_RELEASE, UPGRADE_NS)
    said = check.stdout.strip().splitlines()[-1] if check.stdout.strip() else "ok"
    return (f"{previous.name} by digest: {first.rayjob} RUNNING; `values --check` of values/e2e.yaml for "
            f"{old_version}: {said}; upgraded to {chart} by digest: {second.rayjob} SUCCEEDED as run "
            f"{second.run_name}; {first.rayjob} and its cluster gone; ServiceAccount the same object")
